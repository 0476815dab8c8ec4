"""GPU health in `rigkit status`: what the status script asks nvidia-smi and the kernel log (two sections of the
one round trip), and each GPU judged ok / warn / fail against the thresholds of the rig's data (gpu_health,
nvidia_driver_power_limit_w, nvidia_driver_persistence_mode, gpus; rigkit.settings.defaults).

Judged per GPU: Xids logged since boot (journalctl -k -b where the rig's user may read it, else dmesg's ring
buffer; the source is named), ECC errors where the card counts them, clock event reasons, temperature, the
enforced power limit against the declared one and the card's range, the PCIe link against the most both ends
support and gpu_pcie_min_width, the VRAM held while no container of the stack runs (against the start
preflight's gpu_free_fraction_min), persistence mode; per rig: nvidia-smi answering and listing the GPUs the rig
declares. A rig without nvidia-smi and without declared GPUs (the lab's) has "no GPU tooling": not a problem.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional

from rigkit.facts import split_exit
from rigkit.nvidia_smi import (
    KERNEL_LOG_PATTERN,
    UNKNOWN_FIELD_TEXT,
    XID_FALLEN_OFF_THE_BUS,
    XID_NEEDS_RESET,
    GpuReading,
    XidEvent,
    health_query,
    parse_health_csv,
    parse_kernel_log,
    pci_key,
)
from rigkit.settings.defaults import GPU_HEALTH_VARIABLES, GPUS, NVIDIA_DRIVER_VARIABLES

OK, WARN, FAIL = "ok", "warn", "fail"
NO_TOOLING = "no GPU tooling"

# The kernel log's matching lines the probe sends back (the newest; Xids are rate-limited by the driver, but a
# GPU in trouble logs thousands): their count is sent whole.
KERNEL_LOG_LINES_KEPT = 500
JOURNAL, DMESG, UNREADABLE = "journal", "dmesg", "none"
KERNEL_LOG_SOURCES = {
    JOURNAL: "journalctl -k -b (the kernel log since boot)",
    DMESG: "dmesg (the kernel's ring buffer: on a long-running rig its oldest lines may be gone)",
    UNREADABLE: "neither journalctl -k nor dmesg answered for this user: Xids not checked",
}

# Clock event reasons by what they mean for serving (rigkit.nvidia_smi.CLOCK_EVENT_REASON_BITS): the hardware
# cutting the clocks by half or more fails; the driver's thermal slowdown, and reasons not named when this was
# written, warn; the rest (idle, a power cap, application clocks, sync boost, display) is the card as set.
CLOCK_REASONS_FAIL = frozenset({"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"})
CLOCK_REASONS_OK = frozenset(
    {"gpu_idle", "applications_clocks_setting", "sw_power_cap", "sync_boost", "display_clock_setting"}
)


def query_command() -> str:
    """The health query (rigkit.nvidia_smi.HEALTH_FIELDS), again with the legacy reason names when this driver
    refuses today's; its output and `exit=N`, or `none` without nvidia-smi."""
    today, legacy = health_query(), health_query(legacy=True)
    return (
        "if command -v nvidia-smi >/dev/null 2>&1; then "
        f"out=$({today} 2>&1); rc=$?; "
        f'if [ "$rc" -ne 0 ] && printf "%s" "$out" | grep -q {shlex.quote(UNKNOWN_FIELD_TEXT)}; then '
        f"out=$({legacy} 2>&1); rc=$?; fi; "
        'printf "%s\\n" "$out"; echo "exit=$rc"; '
        "else echo none; fi"
    )


def kernel_log_command() -> str:
    """The kernel log's Xid lines since boot: `source=journal|dmesg|none`, `matched=N`, the newest matching lines.
    journalctl -k -b first (complete since boot; readable by root and the adm/systemd-journal groups: a user
    outside them sees no kernel line, hence the one-line test), dmesg's ring buffer next (kernel.dmesg_restrict
    may refuse it). Only where nvidia-smi is: a rig without GPUs has no Xid to read."""
    keep = (
        f"grep -E {shlex.quote(KERNEL_LOG_PATTERN)} | awk -v max={KERNEL_LOG_LINES_KEPT} "
        '\'{ n++; kept[n % max] = $0 } END { print "matched=" n + 0; '
        "for (i = (n > max ? n - max + 1 : 1); i <= n; i++) print kept[i % max] }'"
    )
    return (
        "if command -v nvidia-smi >/dev/null 2>&1; then "
        "if command -v journalctl >/dev/null 2>&1 && "
        '[ -n "$(journalctl -k -b -n 1 -q --no-pager 2>/dev/null)" ]; then '
        f"echo source={JOURNAL}; journalctl -k -b -q --no-pager 2>/dev/null | {keep}; "
        f'elif [ -n "$(dmesg 2>/dev/null | head -n 1)" ]; then echo source={DMESG}; dmesg 2>/dev/null | {keep}; '
        f"else echo source={UNREADABLE}; fi; fi"
    )


def _default(variables, name: str) -> Any:
    return next(v.default for v in variables if v.name == name)


@dataclass(frozen=True)
class GpuLimits:
    """The rig's data status judges its GPUs by (defaults: rigkit.settings.defaults, where each is declared)."""

    temp_warn_c: int = _default(GPU_HEALTH_VARIABLES, "gpu_temp_warn_c")
    temp_fail_c: int = _default(GPU_HEALTH_VARIABLES, "gpu_temp_fail_c")
    pcie_min_width: int = _default(GPU_HEALTH_VARIABLES, "gpu_pcie_min_width")
    ecc_corrected_warn: int = _default(GPU_HEALTH_VARIABLES, "gpu_ecc_corrected_warn")
    power_limit_tolerance_w: float = _default(GPU_HEALTH_VARIABLES, "gpu_power_limit_tolerance_w")
    power_limit_w: Optional[float] = _default(NVIDIA_DRIVER_VARIABLES, "nvidia_driver_power_limit_w")
    persistence: bool = _default(NVIDIA_DRIVER_VARIABLES, "nvidia_driver_persistence_mode")
    declared_gpus: int = GPUS.default
    # while no container of the stack runs: the start preflight's floor (the knob gpu_free_fraction_min) and the
    # GPUs it checks (gpu_mask; empty = all); None when no stack is declared
    free_fraction_min: Optional[float] = None
    stack_gpus: tuple[int, ...] = ()

    @classmethod
    def defaults(cls, stack=None) -> "GpuLimits":
        """The declared defaults, with the stack's preflight floor and GPUs (Settings or None)."""
        return cls.from_sections(
            {
                "gpu_health": {v.name: v.default for v in GPU_HEALTH_VARIABLES},
                "nvidia_driver": {v.name: v.default for v in NVIDIA_DRIVER_VARIABLES},
                "host": {GPUS.name: GPUS.default},
            },
            stack,
        )

    @classmethod
    def from_sections(cls, sections: Mapping[str, Mapping[str, Any]], stack=None) -> "GpuLimits":
        """From a rig's validated settings (RigSettings.sections) and its declared stack (Settings or None)."""
        health, driver = sections["gpu_health"], sections["nvidia_driver"]
        return cls(
            temp_warn_c=health["gpu_temp_warn_c"],
            temp_fail_c=health["gpu_temp_fail_c"],
            pcie_min_width=health["gpu_pcie_min_width"],
            ecc_corrected_warn=health["gpu_ecc_corrected_warn"],
            power_limit_tolerance_w=health["gpu_power_limit_tolerance_w"],
            power_limit_w=driver["nvidia_driver_power_limit_w"],
            persistence=driver["nvidia_driver_persistence_mode"],
            declared_gpus=sections["host"]["gpus"],
            free_fraction_min=stack.knobs["gpu_free_fraction_min"] if stack is not None else None,
            stack_gpus=tuple(stack.gpu_ids) if stack is not None else (),
        )


@dataclass(frozen=True)
class Finding:
    """One thing wrong with a GPU (or the rig's GPUs): its level, the GPU ("GPU0", "GPUs"), a few words for the
    table and the whole reason with its figure for the details."""

    level: str
    gpu: str
    short: str
    text: str


@dataclass
class GpuReport:
    """The rig's GPUs as status shows them (RigStatus.gpu; --json)."""

    tooling: bool
    state: str = OK
    query_error: Optional[str] = None
    gpus: list[dict[str, Any]] = field(default_factory=list)  # each GpuReading's fields, its state and Xid counts
    kernel_log: Optional[dict[str, Any]] = None  # source, what it is, lines matched
    xids: list[dict[str, Any]] = field(default_factory=list)  # per GPU and code: count, the newest line's text
    findings: list[Finding] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _label(gpu: GpuReading) -> str:
    return f"GPU{gpu.index}"


def _judge_temperature(gpu: GpuReading, limits: GpuLimits) -> list[Finding]:
    temp = gpu.temperature_c
    if temp is None:
        return []
    for level, threshold, name in (
        (FAIL, limits.temp_fail_c, "gpu_temp_fail_c"),
        (WARN, limits.temp_warn_c, "gpu_temp_warn_c"),
    ):
        if temp >= threshold:
            return [
                Finding(
                    level, _label(gpu), f"{temp:.0f}°C", f"{_label(gpu)} at {temp:.0f} °C (>= {name} {threshold} °C)"
                )
            ]
    return []


def _judge_clock_reasons(gpu: GpuReading) -> list[Finding]:
    found = []
    for reason in gpu.clock_reasons or ():
        if reason in CLOCK_REASONS_OK:
            continue
        level = FAIL if reason in CLOCK_REASONS_FAIL else WARN
        why = "the hardware cut its clocks by half or more" if level == FAIL else "its clocks are held down"
        found.append(
            Finding(
                level,
                _label(gpu),
                reason,
                f"{_label(gpu)} clock event reason {reason} active: {why} "
                f"(temperature {_figure(gpu.temperature_c, '°C')}, power {_figure(gpu.power_draw_w, 'W')})",
            )
        )
    return found


def _figure(value: Optional[float], unit: str) -> str:
    return "not reported" if value is None else f"{value:.0f} {unit}"


def _judge_power(gpu: GpuReading, limits: GpuLimits) -> list[Finding]:
    declared, enforced = limits.power_limit_w, gpu.power_limit_w
    if declared is None or enforced is None:
        return []
    label = _label(gpu)
    low, high = gpu.power_min_w, gpu.power_max_w
    if low is not None and high is not None and not low <= declared <= high:
        return [
            Finding(
                WARN,
                label,
                f"cap {declared:.0f}W outside card",
                f"{label}: nvidia_driver_power_limit_w {declared:.0f} W lies outside this card's {low:.0f}-{high:.0f} W",
            )
        ]
    if abs(enforced - declared) > limits.power_limit_tolerance_w:
        return [
            Finding(
                WARN,
                label,
                f"power limit {enforced:.0f}W",
                f"{label} enforces a {enforced:.0f} W power limit, nvidia_driver_power_limit_w declares {declared:.0f} W "
                f"(a limit set by hand is lost at reboot): run deploy.py (the nvidia_driver role sets it and keeps it "
                f"across reboots), or nvidia-smi -i {gpu.index} -pl {declared:g} until the next reboot",
            )
        ]
    return []


def _judge_pcie(gpu: GpuReading, limits: GpuLimits) -> list[Finding]:
    label, found = _label(gpu), []
    # pcie.link.*.max is what both ends support (NVML: "a device with a 16x PCIe bus width attached to a 8x PCIe
    # system bus ... will report a max link width of 8"): the story's x16 cards in x8 slots read x8 of x8
    width, width_max = gpu.pcie_width, gpu.pcie_width_max
    if width is not None and width_max is not None and width < width_max:
        found.append(
            Finding(
                WARN,
                label,
                f"PCIe x{width}",
                f"{label} PCIe link trained at x{width} where both ends support "
                f"x{width_max}: a riser, a cable or the slot's contacts",
            )
        )
    elif width is not None and width < limits.pcie_min_width:
        found.append(
            Finding(
                WARN,
                label,
                f"PCIe x{width}",
                f"{label} PCIe link x{width} is narrower than gpu_pcie_min_width "
                f"x{limits.pcie_min_width} (a x4 riser or slot): KV moves to host memory at x{width}",
            )
        )
    gen, gen_max = gpu.pcie_gen, gpu.pcie_gen_max
    # an idle GPU lowers its link generation to save power: judged only while it works
    busy = gpu.clock_reasons is not None and "gpu_idle" not in gpu.clock_reasons
    if gen is not None and gen_max is not None and gen < gen_max and busy:
        found.append(
            Finding(
                WARN,
                label,
                f"PCIe Gen{gen}",
                f"{label} PCIe link at Gen{gen} while busy, Gen{gen_max} "
                "possible: a riser or cable that does not hold the higher rate, or a BIOS setting",
            )
        )
    return found


def _judge_ecc(gpu: GpuReading, limits: GpuLimits) -> list[Finding]:
    label, found = _label(gpu), []
    if gpu.ecc_uncorrected_volatile:
        found.append(
            Finding(
                FAIL,
                label,
                "ECC uncorrected",
                f"{label} {gpu.ecc_uncorrected_volatile} uncorrected ECC "
                "errors since the driver loaded: reset the GPU (nvidia-smi -r) or reboot",
            )
        )
    elif gpu.ecc_uncorrected_aggregate:
        found.append(
            Finding(
                WARN,
                label,
                "ECC uncorrected (lifetime)",
                f"{label} {gpu.ecc_uncorrected_aggregate} "
                "uncorrected ECC errors over its lifetime (none since the driver loaded)",
            )
        )
    if gpu.ecc_corrected_volatile is not None and gpu.ecc_corrected_volatile >= limits.ecc_corrected_warn:
        found.append(
            Finding(
                WARN,
                label,
                "ECC corrected",
                f"{label} {gpu.ecc_corrected_volatile} corrected ECC errors "
                f"since the driver loaded (>= gpu_ecc_corrected_warn {limits.ecc_corrected_warn})",
            )
        )
    return found


def _judge_memory(gpu: GpuReading, limits: GpuLimits, stack_running: bool) -> list[Finding]:
    if stack_running or limits.free_fraction_min is None:
        return []
    if limits.stack_gpus and gpu.index not in limits.stack_gpus:
        return []
    used, total = gpu.memory_used_mib, gpu.memory_total_mib
    if used is None or not total:
        return []
    free = 1 - used / total
    if free >= limits.free_fraction_min:
        return []
    return [
        Finding(
            WARN,
            _label(gpu),
            f"VRAM {used / 1024:.0f} GiB held",
            f"{_label(gpu)} holds {used:.0f} of "
            f"{total:.0f} MiB ({free:.1%} free) while no container of the stack runs: another process has it "
            f"(nvidia-smi --query-compute-apps=pid,used_memory --format=csv); the next start's preflight "
            f"refuses below gpu_free_fraction_min {limits.free_fraction_min:.0%}",
        )
    ]


def _judge_persistence(gpu: GpuReading, limits: GpuLimits) -> list[Finding]:
    if gpu.persistence is None or gpu.persistence == limits.persistence:
        return []
    mode = "on" if gpu.persistence else "off"
    return [
        Finding(
            WARN,
            _label(gpu),
            f"persistence {mode}",
            f"{_label(gpu)} persistence mode is {mode}, "
            f"nvidia_driver_persistence_mode declares {'on' if limits.persistence else 'off'}: deploy puts it back",
        )
    ]


def _xid_findings(events: list[XidEvent], gpus: list[GpuReading]) -> tuple[list[dict[str, Any]], list[Finding]]:
    """Xids counted per GPU and code (the GPU found by its PCI address), each judged."""
    by_address = {pci_key(gpu.bus_id): _label(gpu) for gpu in gpus if gpu.bus_id}
    counted: dict[tuple[str, int], dict[str, Any]] = {}
    for event in events:
        label = by_address.get(pci_key(event.address)) or f"GPU at {event.address}"
        entry = counted.setdefault((label, event.code), {"gpu": label, "code": event.code, "count": 0})
        entry["count"] += 1
        entry["last"] = event.text
    findings = []
    for entry in counted.values():
        reset = entry["code"] in XID_NEEDS_RESET
        action = (
            "the rig needs a reboot; if it recurs, reseat the card and check its riser and power cables"
            if entry["code"] == XID_FALLEN_OFF_THE_BUS
            else "the GPU needs a reset (nvidia-smi -r) or the rig a reboot"
            if reset
            else "usually the application's: restart it"
        )
        findings.append(
            Finding(
                FAIL if reset else WARN,
                entry["gpu"],
                f"Xid {entry['code']}",
                f"{entry['gpu']} Xid {entry['code']} x{entry['count']} since boot ({action}): {entry['last'][:120]}",
            )
        )
    return list(counted.values()), findings


def _state(findings: list[Finding]) -> str:
    levels = {finding.level for finding in findings}
    return FAIL if FAIL in levels else WARN if WARN in levels else OK


def judge_gpus(
    query_section: Optional[str], log_section: Optional[str], limits: GpuLimits, stack_running: bool
) -> GpuReport:
    """The rig's GPUs judged from the status script's `gpu` and `kernel-log` sections."""
    text = (query_section or "").strip()
    if text == "none" or not text:
        report = GpuReport(tooling=False)
        if limits.declared_gpus:
            report.findings.append(
                Finding(
                    FAIL,
                    "GPUs",
                    "no nvidia-smi",
                    f"the rig declares gpus: {limits.declared_gpus} but "
                    "nvidia-smi is not on it: the nvidia_driver role installs it",
                )
            )
        report.state = _state(report.findings)
        return report
    report = GpuReport(tooling=True)
    lines, status = split_exit(text.split("\n"))
    readings, other = parse_health_csv("\n".join(lines))
    if status != 0 or not readings:
        report.query_error = " ".join(" ".join(other).split())[-200:] or f"exit {status}"
    findings: list[Finding] = []
    if report.query_error:
        level = FAIL if limits.declared_gpus else WARN
        findings.append(Finding(level, "GPUs", "nvidia-smi failed", f"nvidia-smi failed: {report.query_error}"))
    if limits.declared_gpus and len(readings) < limits.declared_gpus and readings:
        findings.append(
            Finding(
                FAIL,
                "GPUs",
                f"{len(readings)} of {limits.declared_gpus} GPUs",
                f"nvidia-smi lists "
                f"{len(readings)} GPUs, the rig declares gpus: {limits.declared_gpus} (a GPU lost from the bus "
                "is not listed)",
            )
        )
    per_gpu: dict[int, list[Finding]] = {}
    for gpu in readings:
        mine = (
            _judge_temperature(gpu, limits)
            + _judge_clock_reasons(gpu)
            + _judge_power(gpu, limits)
            + _judge_pcie(gpu, limits)
            + _judge_ecc(gpu, limits)
            + _judge_memory(gpu, limits, stack_running)
            + _judge_persistence(gpu, limits)
        )
        if gpu.unreadable:
            mine.append(
                Finding(
                    WARN,
                    _label(gpu),
                    "unreadable",
                    f"{_label(gpu)} nvidia-smi could not read {', '.join(gpu.unreadable)}",
                )
            )
        per_gpu[gpu.index] = mine
        findings += mine
    report.kernel_log, events = _kernel_log(log_section)
    report.xids, xid_findings = _xid_findings(events, readings)
    findings += xid_findings
    if report.kernel_log["source"] == UNREADABLE:
        findings.append(Finding(WARN, "GPUs", "Xid unread", f"kernel log: {KERNEL_LOG_SOURCES[UNREADABLE]}"))
    for gpu in readings:
        xids = [x for x in report.xids if x["gpu"] == _label(gpu)]
        gpu_findings = per_gpu[gpu.index] + [f for f in xid_findings if f.gpu == _label(gpu)]
        fields = {name: list(value) if isinstance(value, tuple) else value for name, value in asdict(gpu).items()}
        report.gpus.append({**fields, "state": _state(gpu_findings), "xids": xids})
    report.findings = findings
    report.state = _state(findings)
    return report


def _kernel_log(section: Optional[str]) -> tuple[dict[str, Any], list[XidEvent]]:
    lines = (section or "").split("\n")
    values = {}
    for line in lines[:2]:
        key, _, value = line.partition("=")
        if key in ("source", "matched"):
            values[key] = value.strip()
    source = values.get("source", UNREADABLE)
    matched = int(values["matched"]) if values.get("matched", "").isdigit() else 0
    kept = [line for line in lines if not line.startswith(("source=", "matched="))]
    log = {"source": source, "what": KERNEL_LOG_SOURCES.get(source, source), "lines_matched": matched}
    return log, parse_kernel_log(kept)
