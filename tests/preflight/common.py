"""What the preflight gate tests share: the real H200 host (nvidia-smi, /proc/meminfo), the settings they deploy,
the facts at a gate's edge and the findings they expect."""

from dataclasses import replace
from pathlib import Path

import pytest

from rigkit.preflight import Finding, HostFacts, preflight
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.sizing import GB, GIB

H200 = Path(__file__).parent.parent / "fixtures" / "nvidia-smi" / "h200-x2-ubuntu2404"

IDLE = (H200 / "query-gpu-noheader.csv").read_text()

BUSY = (H200 / "query-gpu-busy-noheader.csv").read_text()

LMCACHE = {
    "serving_profile": "lmcache-mp",
    "allow_incubating": True,
    "model": "m",
    "l1_size_gb": 60,
    "serving_image": "lmcache/vllm-openai@sha256:" + "2" * 64,
}

CPU_LAB = {"serving_profile": "cpu-lab", "serving_image": "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64}


def h200_meminfo() -> dict:
    values = {}
    for line in (H200 / "host.txt").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key.startswith("Mem") and rest.strip().endswith("kB"):
            values[key] = int(rest.split()[0]) * 1024
    return values


def meminfo_gb(available: float, total: float = 256) -> dict:
    return {"MemAvailable": int(available * GB), "MemTotal": int(total * GB)}


def meminfo_gib(available: float, total: float = 256) -> dict:
    """MemAvailable in GiB (the unit of the memory knobs), MemTotal in GB (min_ram_gb's)."""
    return {"MemAvailable": int(available * GIB), "MemTotal": int(total * GB)}


def facts(**changes) -> HostFacts:
    base = dict(
        meminfo=h200_meminfo(),
        l2_free_bytes=900 * GB,
        gpu_memory_csv=IDLE,
        has_engine=True,
        compose_command="docker compose",
        image_present=False,
        registry_reachable=True,
        host_shm_bytes=128 * 2**30,
    )
    return HostFacts(**{**base, **changes})


def run(data, engine_later: bool = False, **fact_changes):
    return preflight(settings_for_host(data, variables=[]), facts(**fact_changes), engine_later=engine_later)


def by_check(findings, check):
    return [f for f in findings if f.check == check]


def gpu_csv(free_mib: int, total_mib: int = 100_000) -> str:
    """nvidia-smi's GPU_MEMORY_QUERY answer for two GPUs with the same memory."""
    return f"0, {free_mib}, {total_mib}\n1, {free_mib}, {total_mib}\n"


def cpu_lab_reserve_gb() -> float:
    return settings_for_host(CPU_LAB, variables=[]).knobs["ram_reserve_gb"]


MIB = 2**20

OOM_NOTE = "(an oversized cache once OOM'd the host; force does not override this)"

IMAGE = LMCACHE["serving_image"]

KV = "/var/lib/rigkit/kv"  # l2_path's default

L2_ON = {**LMCACHE, "l2_enabled": True}

SHM_FULL_FIX = "list it (ls -la /dev/shm on the rig) and remove what no running process uses"

IDLE_GPUS = [Finding("ok", "gpu", "gpu_mask", i, f"GPU {i} 99.6% free") for i in (0, 1)]

BUSY_FIX = "stop what holds GPU 0 (nvidia-smi shows it) or exclude it via gpu_mask"

BUSY_GPU1 = Finding("ok", "gpu", "gpu_mask", 1, "GPU 1 95.9% free")  # 137860 of 143771 MiB


def with_gpus(settings, gpus: int):
    """The same settings with a profile that needs ``gpus`` GPUs (every shipped GPU profile needs one)."""
    resources = settings.profile.resources.model_copy(update={"gpus": gpus})
    return replace(settings, profile=settings.profile.model_copy(update={"resources": resources}))


# A gate table's rows: (id, data, the facts at the edge, the facts just past it, the check, its level past the edge).
def edge_cases(gates: list[tuple]):
    """The parametrize of a test over a gate table (``passes_at_the_edge_not_past_it``'s arguments)."""
    return pytest.mark.parametrize(
        "data,at,below,check,level_below", [gate[1:] for gate in gates], ids=[gate[0] for gate in gates]
    )


def passes_at_the_edge_not_past_it(data, at: dict, below: dict, check: str, level_below: str) -> None:
    assert {f.level for f in by_check(run(data, **at), check)} == {"ok"}
    assert level_below in {f.level for f in by_check(run(data, **below), check)}
