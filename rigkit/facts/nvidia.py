"""Facts about the NVIDIA driver and GPUs: the loaded module's version, nvidia-smi, PCI devices."""

from __future__ import annotations

from typing import Optional

from pyinfra.api import FactBase

from rigkit.facts import split_exit
from rigkit.nvidia_smi import (
    DRIVER_VERSION_FILE,
    GPU_MEMORY_QUERY,
    POWER_LIMIT_QUERY,
    parse_csv_table,
    parse_driver_version,
    parse_health_csv,
)


class NvidiaModuleVersion(FactBase):
    """Version of the loaded nvidia kernel module (e.g. "580.95.05"), None when not loaded."""

    def command(self) -> str:
        return f"cat {DRIVER_VERSION_FILE} 2>/dev/null || true"

    def process(self, output: list[str]) -> Optional[str]:
        return parse_driver_version("\n".join(output))


class NvidiaSmiGpus(FactBase):
    """GPUs as nvidia-smi reports them: {"gpus": [{"uuid", "driver_version"}], "error": str|None}.

    None when nvidia-smi is not installed. A driver/library mismatch (installed but not yet
    loaded) comes back as ``error`` with nvidia-smi's own message.
    """

    def requires_command(self, *args, **kwargs) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        return 'nvidia-smi --query-gpu=uuid,driver_version --format=csv 2>&1; echo "exit=$?"'

    def process(self, output: list[str]) -> dict:
        lines, status = split_exit(output)
        if status != 0:
            return {"gpus": [], "error": " ".join(line.strip() for line in lines) or f"exit {status}"}
        return {"gpus": parse_query_gpus(lines), "error": None}


def parse_query_gpus(lines: list[str]) -> list[dict]:
    """uuid and driver_version of each GPU in a ``nvidia-smi --query-gpu=... --format=csv`` answer."""
    return [
        {"uuid": row["uuid"], "driver_version": row["driver_version"]}
        for row in parse_csv_table("\n".join(lines))
        if "uuid" in row and "driver_version" in row
    ]


class NvidiaPowerLimits(FactBase):
    """Each GPU's enforced power limit, the range the card accepts and its default (watts; None where the card does
    not report it): {"gpus": [{"index", "enforced_w", "min_w", "max_w", "default_w"}], "error": str|None}. None when nvidia-smi is not
    installed; nvidia-smi failing (a driver/library mismatch) comes back as ``error``."""

    def requires_command(self, *args, **kwargs) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        return f'{POWER_LIMIT_QUERY} 2>&1; echo "exit=$?"'

    def process(self, output: list[str]) -> dict:
        lines, status = split_exit(output)
        if status != 0:
            return {"gpus": [], "error": " ".join(line.strip() for line in lines) or f"exit {status}"}
        gpus, _ = parse_health_csv("\n".join(lines))
        return {
            "gpus": [
                {
                    "index": g.index,
                    "enforced_w": g.power_limit_w,
                    "min_w": g.power_min_w,
                    "max_w": g.power_max_w,
                    "default_w": g.power_default_w,
                }
                for g in gpus
            ],
            "error": None,
        }


class NvidiaGpuMemory(FactBase):
    """nvidia-smi's per-GPU free/total memory, one CSV line per GPU (rigkit.nvidia_smi parses it)."""

    def requires_command(self, *args, **kwargs) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        return GPU_MEMORY_QUERY

    def process(self, output):
        return list(output)


NVIDIA_PCI_VENDOR = "0x10de"


PCI_DISPLAY_CLASS = "0x03"  # VGA and 3D controllers; NVIDIA's audio and USB functions are other classes


PCI_DEVICES_DIR = "/sys/bus/pci/devices"


def nvidia_pci_gpus_command(devices_dir: str = PCI_DEVICES_DIR) -> str:
    """Prints one line per NVIDIA GPU among the PCI devices in ``devices_dir`` (sysfs layout)."""
    return (
        f'for d in {devices_dir}/*; do [ "$(cat "$d/vendor" 2>/dev/null)" = {NVIDIA_PCI_VENDOR} ] '
        f'&& case "$(cat "$d/class")" in {PCI_DISPLAY_CLASS}*) echo "$d";; esac; done; true'
    )


class NvidiaPciGpus(FactBase):
    """How many NVIDIA GPUs the PCI bus shows (sysfs), driver installed or not."""

    @staticmethod
    def default() -> int:
        return 0

    def command(self) -> str:
        return nvidia_pci_gpus_command()

    def process(self, output: list[str]) -> int:
        return len([line for line in output if line.strip()])
