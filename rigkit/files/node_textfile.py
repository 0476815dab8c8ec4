#!/usr/bin/env python3
"""Runs ON the rig, from a systemd timer: the rig's metrics the node exporter cannot read itself, written in
Prometheus text format into the node exporter's textfile directory (renamed into place: never half a file).

- GPUs, from ``nvidia-smi --query-gpu`` (memory, utilisation, temperature, power against the enforced limit, the
  clock-event reasons that mean throttling); no nvidia-smi (a CPU rig): rigkit_gpu_query_ok 0 and no GPU series.
- Xid errors: NVRM Xid lines in the kernel log since boot (journalctl -k -b, else dmesg).
- /dev/shm and the L2 store: the node exporter's filesystem collector skips /dev and /mnt (Debian's default
  mount-points-exclude), and the L2 store's bytes and budget are the janitor's (its status file), not a
  filesystem's.

Usage: node_textfile.py OUTPUT_FILE JANITOR_STATUS_FILE (rigkit/files/l2_janitor.py STATUS_FILE). Every metric
name is declared here, once; rigkit's dashboards and alert rules (rigkit.monitoring) import them. Standard library only: the rig has no rigkit.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time

GPU_QUERY_OK = "rigkit_gpu_query_ok"
GPU_INFO = "rigkit_gpu_info"
GPU_MEMORY_USED = "rigkit_gpu_memory_used_bytes"
GPU_MEMORY_TOTAL = "rigkit_gpu_memory_total_bytes"
GPU_UTILIZATION = "rigkit_gpu_utilization_ratio"
GPU_TEMPERATURE = "rigkit_gpu_temperature_celsius"
GPU_POWER_DRAW = "rigkit_gpu_power_draw_watts"
GPU_POWER_LIMIT = "rigkit_gpu_power_limit_watts"
GPU_THROTTLE = "rigkit_gpu_throttle"
GPU_XID_ERRORS = "rigkit_gpu_xid_errors"
SHM_SIZE = "rigkit_shm_size_bytes"
SHM_FREE = "rigkit_shm_free_bytes"
L2_STORE = "rigkit_l2_store_bytes"
L2_BUDGET = "rigkit_l2_budget_bytes"
UPDATED = "rigkit_textfile_updated_seconds"

SHM_PATH = "/dev/shm"
MIB = 1024 * 1024

# nvidia-smi's clocks_event_reasons (driver 535 on; the H200 capture ran 580) -> the reason label. sw_power_cap is
# the power limit at work (expected on a capped rig under load); the others slow the GPU below what its cap allows.
THROTTLE_REASONS = {
    "clocks_event_reasons.sw_power_cap": "sw_power_cap",
    "clocks_event_reasons.hw_slowdown": "hw_slowdown",
    "clocks_event_reasons.hw_thermal_slowdown": "hw_thermal",
    "clocks_event_reasons.hw_power_brake_slowdown": "hw_power_brake",
    "clocks_event_reasons.sw_thermal_slowdown": "sw_thermal",
}
GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "temperature.gpu",
    "power.draw",
    "enforced.power.limit",
    *THROTTLE_REASONS,
)
NVIDIA_SMI = ["nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv"]
XID_MARK = "NVRM: Xid"


def number(text: str):
    """nvidia-smi's value without its unit ("78.77 W", "143771 MiB", "36"); None for [N/A] and the like."""
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def field_name(header: str) -> str:
    """A CSV header without its unit: "power.draw [W]" -> "power.draw"."""
    return header.split(" [", 1)[0].strip()


def gpu_rows(text: str) -> list:
    """``nvidia-smi --query-gpu=... --format=csv`` (header and units) as one dict per GPU, keyed by field."""
    rows = list(csv.reader(io.StringIO(text), skipinitialspace=True))
    if not rows:
        return []
    names = [field_name(header) for header in rows[0]]
    return [dict(zip(names, (cell.strip() for cell in row))) for row in rows[1:] if len(row) == len(names)]


def sample_value(value: float) -> str:
    """A value as Prometheus reads it back exactly (bytes of a 141 GiB card need all their digits)."""
    return str(int(value)) if value.is_integer() else repr(value)


def label_text(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def gpu_lines(rows: list) -> list:
    """Prometheus lines for the GPUs of ``gpu_rows``."""
    lines = []
    scaled = (
        (GPU_MEMORY_USED, "memory.used", MIB),
        (GPU_MEMORY_TOTAL, "memory.total", MIB),
        (GPU_UTILIZATION, "utilization.gpu", 0.01),
        (GPU_TEMPERATURE, "temperature.gpu", 1),
        (GPU_POWER_DRAW, "power.draw", 1),
        (GPU_POWER_LIMIT, "enforced.power.limit", 1),
    )
    for row in rows:
        gpu = label_text(row.get("index", ""))
        info = ",".join(f'{key}="{label_text(row[key])}"' for key in ("uuid", "name") if key in row)
        lines.append(f'{GPU_INFO}{{gpu="{gpu}"{"," + info if info else ""}}} 1')
        for metric, field, factor in scaled:
            value = number(row.get(field, ""))
            if value is not None:
                lines.append(f'{metric}{{gpu="{gpu}"}} {sample_value(value * factor)}')
        for field, reason in THROTTLE_REASONS.items():
            if field in row:
                active = 1 if row[field] == "Active" else 0
                lines.append(f'{GPU_THROTTLE}{{gpu="{gpu}",reason="{reason}"}} {active}')
    return lines


def xid_count(kernel_log: str) -> int:
    return sum(1 for line in kernel_log.splitlines() if XID_MARK in line)


def kernel_log() -> "str | None":
    for argv in (["journalctl", "-k", "-b", "-o", "cat", "--no-pager"], ["dmesg"]):
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            continue
    return None


def shm_lines(path: str = SHM_PATH) -> list:
    try:
        stat = os.statvfs(path)
    except OSError:
        return []
    return [f"{SHM_SIZE} {stat.f_blocks * stat.f_frsize}", f"{SHM_FREE} {stat.f_bavail * stat.f_frsize}"]


def l2_lines(status_file: str) -> list:
    """The L2 store's bytes and budget from the janitor's status file (none: the rig has no L2 janitor)."""
    try:
        with open(status_file) as source:
            status = json.load(source)
        return [f"{L2_STORE} {int(status['store_bytes'])}", f"{L2_BUDGET} {int(status['budget_bytes'])}"]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def render(gpu_csv: "str | None", kernel: "str | None", shm: list, l2: list, now: float) -> str:
    lines = [f"{GPU_QUERY_OK} {0 if gpu_csv is None else 1}"]
    if gpu_csv is not None:
        lines += gpu_lines(gpu_rows(gpu_csv))
        if kernel is not None:
            lines.append(f"{GPU_XID_ERRORS} {xid_count(kernel)}")
    return "\n".join([*lines, *shm, *l2, f"{UPDATED} {now:.3f}"]) + "\n"


def query_gpus() -> "str | None":
    try:
        return subprocess.run(NVIDIA_SMI, capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def write_atomically(path: str, text: str) -> None:
    temporary = f"{path}.{os.getpid()}.tmp"  # the exporter reads *.prom only
    with open(temporary, "w") as out:
        out.write(text)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def main(output: str, status_file: str) -> int:
    gpus = query_gpus()
    text = render(gpus, kernel_log() if gpus is not None else None, shm_lines(), l2_lines(status_file), time.time())
    write_atomically(output, text)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: node_textfile.py OUTPUT_FILE JANITOR_STATUS_FILE", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
