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
