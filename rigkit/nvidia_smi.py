"""Parse what nvidia-smi and the kernel module report: per-GPU memory and the driver version."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from typing import Optional

# The query the GPU preflight runs on a rig.
GPU_MEMORY_QUERY = "nvidia-smi --query-gpu=index,memory.free,memory.total --format=csv,noheader,nounits"
DRIVER_VERSION_QUERY = "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
# Plain `nvidia-smi`: its header names the driver and the newest CUDA version that driver supports.
SUMMARY_COMMAND = "nvidia-smi"

_VERSION = re.compile(r"\b(\d{3,}\.\d+(?:\.\d+)?)\b")
_CUDA_VERSION = re.compile(r"CUDA Version\s*:\s*(\d+\.\d+)")


@dataclass(frozen=True)
class GpuMemoryReading:
    """One GPU's memory as nvidia-smi reported it (MiB)."""

    index: int
    free_mib: int
    total_mib: int

    @property
    def free_fraction(self) -> float:
        return self.free_mib / self.total_mib if self.total_mib else 0.0


def parse_csv_table(text: str) -> list[dict[str, str]]:
    """Rows of a `--format=csv` answer (with header) keyed by column name, units kept in the values."""
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    if not rows:
        return []
    header = [name.strip() for name in rows[0]]
    return [dict(zip(header, (cell.strip() for cell in row))) for row in rows[1:] if row]


def _mib(cell: str) -> int:
    value = cell.strip()
    if value.endswith("MiB"):
        value = value[:-3].strip()
    return int(float(value))


def parse_gpu_memory(text: str) -> list[GpuMemoryReading]:
    """GPUs from GPU_MEMORY_QUERY output, or from a csv answer with a header that has those columns."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return []
    if lines[0].lstrip().startswith("index"):
        gpus = []
        for row in parse_csv_table(text):
            free = next(v for k, v in row.items() if k.startswith("memory.free"))
            total = next(v for k, v in row.items() if k.startswith("memory.total"))
            gpus.append(GpuMemoryReading(int(row["index"]), _mib(free), _mib(total)))
        return gpus
    gpus = []
    for line in lines:
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 3:
            raise ValueError(f"expected 'index, memory.free, memory.total', got {line!r}")
        gpus.append(GpuMemoryReading(int(cells[0]), _mib(cells[1]), _mib(cells[2])))
    return gpus


def parse_driver_version(text: str) -> Optional[str]:
    """The running driver's version from /proc/driver/nvidia/version or DRIVER_VERSION_QUERY output."""
    for line in text.splitlines():
        if line.startswith("GCC version"):
            continue
        match = _VERSION.search(line)
        if match:
            return match.group(1)
    return None


def driver_branch(version: str) -> str:
    """ "580.159.04" -> "580": the branch that driver packages are named after."""
    return version.split(".", 1)[0]


def parse_cuda_version(text: str) -> Optional[str]:
    """The CUDA version the driver supports, from `nvidia-smi`'s header or `nvidia-smi -q`, else None."""
    match = _CUDA_VERSION.search(text)
    return match.group(1) if match else None


# ---- GPU health: one `--query-gpu` CSV per rig (rigkit status), and the kernel module's Xid lines ----

# The clock event reasons by NVML's bit (nvmlClocksEventReasons, NVML API R550 and later; the same bits were
# nvmlClocksThrottleReasons before): nvidia-smi's `clocks_event_reasons.active` is their OR, as hex.
CLOCK_EVENT_REASON_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}
# Today's nvidia-smi names them clocks_event_reasons.*; drivers before R535 (NVML R525's documentation) only
# clocks_throttle_reasons.*, and nvidia-smi refuses a whole query with one field it does not know.
EVENT_REASONS_PREFIX, LEGACY_REASONS_PREFIX = "clocks_event_reasons.", "clocks_throttle_reasons."

# The per-GPU health query, --format=csv (header with units, as tests/fixtures/nvidia-smi/gpu-check-2026-12-03/
# nvidia-smi-query-gpu.csv was captured).
HEALTH_FIELDS = (
    "index",
    "pci.bus_id",
    "name",
    "persistence_mode",
    "temperature.gpu",
    "power.draw",
    "enforced.power.limit",
    "power.min_limit",
    "power.max_limit",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    EVENT_REASONS_PREFIX + "active",
    "ecc.mode.current",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.aggregate.total",
    "ecc.errors.uncorrected.aggregate.total",
)


def health_query(legacy: bool = False) -> str:
    fields = ",".join(HEALTH_FIELDS)
    if legacy:
        fields = fields.replace(EVENT_REASONS_PREFIX, LEGACY_REASONS_PREFIX)
    return f"nvidia-smi --query-gpu={fields} --format=csv"


# The power limit the NVIDIA role applies: the enforced limit and the card's range, one GPU a row (--format=csv,
# read by parse_health_csv), and the command that sets every GPU's limit (nvidia-smi -pl, without -i: all GPUs).
POWER_LIMIT_FIELDS = ("index", "enforced.power.limit", "power.min_limit", "power.max_limit", "power.default_limit")
POWER_LIMIT_QUERY = f"nvidia-smi --query-gpu={','.join(POWER_LIMIT_FIELDS)} --format=csv"
# Where the driver packages put nvidia-smi (Ubuntu's nvidia-utils-*, the CUDA repository's nvidia-driver-cuda); a
# unit's ExecStart= needs the absolute path.
NVIDIA_SMI_PATH = "/usr/bin/nvidia-smi"


def power_limit_argv(limit_w: float, gpu: Optional[int] = None) -> list[str]:
    """Set every GPU's power limit (or GPU ``gpu``'s) to ``limit_w``: lost at reboot, the NVIDIA role's unit runs
    it at boot."""
    return [NVIDIA_SMI_PATH, *(["-i", str(gpu)] if gpu is not None else []), "-pl", f"{limit_w:g}"]


def enforced_power_limits(text: str) -> list[Optional[float]]:
    """Each GPU's enforced power limit (watts, by index; None where the card does not report it) from a
    POWER_LIMIT_QUERY answer (or any health query answer that has the column)."""
    gpus, _ = parse_health_csv(text)
    return [gpu.power_limit_w for gpu in sorted(gpus, key=lambda gpu: gpu.index)]


# What nvidia-smi prints for a field this driver does not know (then it prints nothing else).
UNKNOWN_FIELD_TEXT = "is not a valid field"
# Cells nvidia-smi prints for a value the card does not report ("[N/A]", "[Not Supported]", "N/A") or cannot
# read now ("[Unknown Error]", "[GPU requires reset]", "[Insufficient Permissions]").
_NOT_A_VALUE = re.compile(r"^\[.*\]$|^N/A$")


@dataclass(frozen=True)
class GpuReading:
    """One GPU as the health query reported it; None where the card does not report a value ("[N/A]")."""

    index: int
    bus_id: Optional[str]
    name: Optional[str]
    persistence: Optional[bool]
    temperature_c: Optional[float]
    power_draw_w: Optional[float]
    power_limit_w: Optional[float]  # the enforced limit
    power_min_w: Optional[float]
    power_max_w: Optional[float]
    memory_used_mib: Optional[float]
    memory_total_mib: Optional[float]
    utilization_pct: Optional[float]
    pcie_gen: Optional[int]
    pcie_gen_max: Optional[int]
    pcie_width: Optional[int]
    pcie_width_max: Optional[int]
    clock_reasons: Optional[tuple[str, ...]]  # active reasons by name; None: not reported
    ecc_enabled: Optional[bool]
    ecc_corrected_volatile: Optional[int]
    ecc_uncorrected_volatile: Optional[int]
    ecc_corrected_aggregate: Optional[int]
    ecc_uncorrected_aggregate: Optional[int]
    power_default_w: Optional[float] = None  # the card's own limit (POWER_LIMIT_FIELDS; not in the status query)
    unreadable: tuple[str, ...] = ()  # fields whose cell is an error ("[Unknown Error]", "[GPU requires reset]")


def _cell_value(cell: Optional[str]) -> Optional[str]:
    """A cell without its unit ("78.77 W" -> "78.77"); None for a value not reported."""
    if cell is None:
        return None
    cell = cell.strip()
    if not cell or _NOT_A_VALUE.match(cell):
        return None
    number, _, unit = cell.partition(" ")
    return number if unit and unit in ("W", "MiB", "%", "C") else cell


def _number(cell: Optional[str]) -> Optional[float]:
    value = _cell_value(cell)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _integer(cell: Optional[str]) -> Optional[int]:
    number = _number(cell)
    return int(number) if number is not None else None


def _enabled(cell: Optional[str]) -> Optional[bool]:
    value = _cell_value(cell)
    return {"Enabled": True, "Disabled": False}.get(value) if value else None


def decode_clock_reasons(mask: str) -> tuple[str, ...]:
    """The active reasons of a `clocks_event_reasons.active` mask ("0x0000000000000001" -> ("gpu_idle",)); a bit
    NVML did not name when this was written reads as "bit 0x800"."""
    value = int(mask, 16)
    names = [name for bit, name in CLOCK_EVENT_REASON_BITS.items() if value & bit]
    known = sum(CLOCK_EVENT_REASON_BITS)
    names += [f"bit {1 << shift:#x}" for shift in range(64) if value & ~known & (1 << shift)]
    return tuple(names)


def _column_name(header: str) -> str:
    """ "power.draw [W]" -> "power.draw"; the legacy reasons' prefix read as today's."""
    name = header.split(" [", 1)[0].strip()
    return EVENT_REASONS_PREFIX + name[len(LEGACY_REASONS_PREFIX) :] if name.startswith(LEGACY_REASONS_PREFIX) else name


def _clock_reasons(row: dict[str, str]) -> Optional[tuple[str, ...]]:
    mask = _cell_value(row.get(EVENT_REASONS_PREFIX + "active"))
    if mask is not None:
        try:
            return decode_clock_reasons(mask)
        except ValueError:
            return None
    # a query of the reasons one column each (the captured CSV has both)
    named = {name: _cell_value(row.get(EVENT_REASONS_PREFIX + name)) for name in CLOCK_EVENT_REASON_BITS.values()}
    if all(value is None for value in named.values()):
        return None
    return tuple(name for name, value in named.items() if value == "Active")


# Each health and power-limit field (but index and the clock reasons) -> the GpuReading attribute it fills and how its cell is read.
HEALTH_FIELD_READS = {
    "pci.bus_id": ("bus_id", _cell_value),
    "name": ("name", _cell_value),
    "persistence_mode": ("persistence", _enabled),
    "temperature.gpu": ("temperature_c", _number),
    "power.draw": ("power_draw_w", _number),
    "enforced.power.limit": ("power_limit_w", _number),
    "power.min_limit": ("power_min_w", _number),
    "power.max_limit": ("power_max_w", _number),
    "power.default_limit": ("power_default_w", _number),
    "memory.used": ("memory_used_mib", _number),
    "memory.total": ("memory_total_mib", _number),
    "utilization.gpu": ("utilization_pct", _number),
    "pcie.link.gen.current": ("pcie_gen", _integer),
    "pcie.link.gen.max": ("pcie_gen_max", _integer),
    "pcie.link.width.current": ("pcie_width", _integer),
    "pcie.link.width.max": ("pcie_width_max", _integer),
    EVENT_REASONS_PREFIX + "active": ("clock_reasons", None),  # with the one-column-per-reason form: _clock_reasons
    "ecc.mode.current": ("ecc_enabled", _enabled),
    "ecc.errors.corrected.volatile.total": ("ecc_corrected_volatile", _integer),
    "ecc.errors.uncorrected.volatile.total": ("ecc_uncorrected_volatile", _integer),
    "ecc.errors.corrected.aggregate.total": ("ecc_corrected_aggregate", _integer),
    "ecc.errors.uncorrected.aggregate.total": ("ecc_uncorrected_aggregate", _integer),
}


def parse_health_csv(text: str) -> tuple[list[GpuReading], list[str]]:
    """GPUs from a health query answer (HEALTH_FIELDS or any subset of them, with today's or the legacy reason
    names, with or without units), and the lines that are not a GPU's row (nvidia-smi's own complaints, e.g.
    "Unable to determine the device handle for GPU0000:01:00.0: Unknown Error" for a GPU lost from the bus)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    header_at = next((i for i, line in enumerate(lines) if line.lstrip().startswith("index")), None)
    if header_at is None:
        return [], lines
    rows = list(csv.reader(io.StringIO("\n".join(lines[header_at:])), skipinitialspace=True))
    header = [_column_name(cell) for cell in rows[0]]
    gpus, other = [], lines[:header_at]
    for line, cells in zip(lines[header_at + 1 :], rows[1:]):
        if len(cells) != len(header) or not cells[0].strip().isdigit():
            other.append(line)
            continue
        row = dict(zip(header, (cell.strip() for cell in cells)))
        unreadable = tuple(name for name, cell in row.items() if cell.startswith("[") and cell not in _NOT_REPORTED)
        values = {attr: read(row.get(name)) for name, (attr, read) in HEALTH_FIELD_READS.items() if read is not None}
        gpus.append(
            GpuReading(index=int(row["index"]), clock_reasons=_clock_reasons(row), unreadable=unreadable, **values)
        )
    return gpus, other


# The cells that say "the card does not have this", as opposed to "could not read it now".
_NOT_REPORTED = ("[N/A]", "[Not Supported]")


def pci_key(address: str) -> Optional[tuple[int, int, int]]:
    """(domain, bus, device) of a PCI address as nvidia-smi ("00000000:9B:00.0") or an Xid line ("0000:9b:00",
    "PCI:0000:9b:00") writes it: the two spell the same GPU differently."""
    parts = address.strip().removeprefix("PCI:").split(".")[0].split(":")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None


# "NVRM: Xid (PCI:0000:9b:00): 119, pid=..., <text>" (drivers before ~R450 wrote "(0000:03:00)"): NVIDIA's Xid
# catalog, docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html.
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+)(?:, (.*))?")
# A GPU lost from the bus is also told without an Xid, over lines: "NVRM: The NVIDIA GPU 0000:b3:00.0" ...
# "NVRM: fallen off the bus and is not responding to commands."
_GPU_NAMED = re.compile(r"NVRM: The NVIDIA GPU ([0-9a-fA-F:.]+)")
FALLEN_OFF_THE_BUS = "fallen off the bus"
XID_FALLEN_OFF_THE_BUS = 79
# The kernel log's lines the status probe keeps (grep -E): the parser reads nothing else.
KERNEL_LOG_PATTERN = "NVRM: Xid|NVRM: The NVIDIA GPU|fallen off the bus"

# Xids after which the GPU needs a reset or the host a reboot: a double-bit ECC error (48), the PMU halted (61,
# 62), row remapping / page retirement events and failures (63, 64), an NVLink error (74), the GPU lost from the
# bus (79), uncontained ECC errors (95, 140), the GSP not answering or in error (119, 120). The others rigkit
# users meet (13 graphics exception, 31 MMU fault, 43 GPU stopped processing, 45 preemptive cleanup, 94
# contained ECC) are usually an application's and need it restarted: status warns on them.
XID_NEEDS_RESET = frozenset({48, 61, 62, 63, 64, 74, 79, 95, 119, 120, 140})


@dataclass(frozen=True)
class XidEvent:
    """One Xid the kernel module logged: the GPU's PCI address as the line gave it, the code, the rest of the line."""

    address: str
    code: int
    text: str


def parse_kernel_log(lines: list[str]) -> list[XidEvent]:
    """The Xids of kernel log lines (KERNEL_LOG_PATTERN's), in order; a "fallen off the bus" told without an Xid
    counts as Xid 79 of the GPU named on a line before it (the driver's line right after an Xid 79 is that one)."""
    events, named, after_xid_79 = [], "unknown", False
    for line in lines:
        match = _XID.search(line)
        if match:
            events.append(XidEvent(match.group(1), int(match.group(2)), (match.group(3) or "").strip()))
            after_xid_79 = events[-1].code == XID_FALLEN_OFF_THE_BUS
            continue
        gpu = _GPU_NAMED.search(line)
        if gpu:
            named = gpu.group(1)
        elif FALLEN_OFF_THE_BUS in line and not after_xid_79:
            events.append(XidEvent(named, XID_FALLEN_OFF_THE_BUS, "GPU has fallen off the bus (logged without an Xid)"))
        after_xid_79 = False
    return events
