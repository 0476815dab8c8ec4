"""Preflight: host facts + settings -> findings. nvidia-smi outputs are real (2x H200); RAM and disk
numbers are read from that host's /proc/meminfo and df in the fixtures, or set to the edge of a gate."""

from pathlib import Path

import pytest

from rigkit.errors import PreflightError
from rigkit.preflight import (
    ENGINE_SHM_MIN_MB,
    L2_FREE_WARN_GB,
    HostFacts,
    bare_host_preflight,
    engine_preflight,
    preflight,
    raise_if_refused,
    refusals,
)
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.sizing import GB, GIB

H200 = Path(__file__).parent / "fixtures" / "nvidia-smi" / "h200-x2-ubuntu2404"
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


def test_clean_h200_passes():
    findings = run({**LMCACHE, "l2_enabled": True})
    assert refusals(findings) == []
    raise_if_refused(findings)
    assert len([f for f in by_check(findings, "gpu") if f.level == "ok"]) == 2


def test_ram_gate_refuses_even_when_forced():
    for force in (False, True):
        findings = run({**LMCACHE, "force": force}, meminfo=meminfo_gib(87.9))  # < 60 + 28
        (ram,) = [f for f in refusals(findings) if f.check == "ram"]
        assert ram.field == "l1_size_gb" and "87.9 GiB" in ram.message and "88 GiB" in ram.message
        assert "at most 59" in ram.fix
        with pytest.raises(PreflightError) as caught:
            raise_if_refused(findings)
        assert caught.value.field == "l1_size_gb"
    assert not refusals(run(LMCACHE, meminfo=meminfo_gib(88.1)))


def test_ram_gate_counts_l1_in_gib_as_lmcache_allocates_it():
    # `lmcache server --l1-size-gb 60` allocates 60 * 2^30 bytes (lmcache v1/distributed/config.py): 88 * 10^9
    # bytes free is 81.96 GiB, 6 GiB short of L1 60 + reserve 28, though "88 GB" reads like enough
    (ram,) = by_check(refusals(run(LMCACHE, meminfo=meminfo_gb(88))), "ram")
    assert ram.field == "l1_size_gb" and "82 GiB < L1 60 + reserve 28 = 88 GiB" in ram.message
    assert "at most 53" in ram.fix


def test_ram_reserve_is_a_knob():
    assert not refusals(run({**LMCACHE, "ram_reserve_gb": 20}, meminfo=meminfo_gib(81)))


def test_busy_gpu_refused_and_force_downgrades_it():
    findings = run(LMCACHE, gpu_memory_csv=BUSY)
    (gpu,) = refusals(findings)
    assert gpu.check == "gpu" and "GPU 0" in gpu.message and "79.3%" in gpu.message
    forced = run({**LMCACHE, "force": True}, gpu_memory_csv=BUSY)
    assert refusals(forced) == [] and any(f.level == "warn" and "forced" in f.message for f in forced)
    assert refusals(run({**LMCACHE, "gpu_mask": "1"}, gpu_memory_csv=BUSY)) == []


def test_gpu_gate_threshold_is_a_knob():
    assert refusals(run({**LMCACHE, "gpu_free_fraction_min": 0.75}, gpu_memory_csv=BUSY)) == []


def test_gpu_profile_on_a_rig_without_gpus_refused_even_forced():
    for csv in (None, ""):
        findings = run({**LMCACHE, "force": True}, gpu_memory_csv=csv)
        (gpu,) = refusals(findings)
        assert gpu.field == "serving_profile" and "cpu-lab" in gpu.fix


def test_missing_gpu_index_refused():
    (gpu,) = refusals(run({**LMCACHE, "gpu_mask": "0,3"}))
    assert gpu.field == "gpu_mask" and "[3]" in gpu.message


def test_cpu_profile_skips_gpu_checks():
    findings = run(CPU_LAB, gpu_memory_csv=None, meminfo=meminfo_gb(20, 24), l2_free_bytes=int(0.9 * GB))
    assert refusals(findings) == []
    (gpu,) = by_check(findings, "gpu")
    assert gpu.level == "ok" and "skipped" in gpu.message


def test_l2_free_space_warns_then_refuses():
    data = {**LMCACHE, "l2_enabled": True, "l2_budget_gb": 40}
    (warn,) = by_check(run(data, l2_free_bytes=(L2_FREE_WARN_GB - 1) * GB), "l2")
    assert warn.level == "warn"
    (refuse,) = by_check(run(data, l2_free_bytes=39 * GB), "l2")
    assert refuse.level == "refuse" and refuse.field == "l2_budget_gb" and "at most 39" in refuse.fix
    (skipped,) = by_check(run(LMCACHE, l2_free_bytes=1 * GB), "l2")  # L2 off: not checked
    assert skipped.level == "ok"


def test_a_budget_declared_small_on_purpose_warns_only_below_twice_itself():
    """The lab's cpu-lab: l2_budget_gb 0.5 on a 2 GB loop disk (1.9 GB free) said "only 1.9 GB free (< 50 GB)" on
    every deploy; the budget is what bounds the tier, so the warning's floor is twice it when that is below 50 GB."""
    data = {**CPU_LAB, "l2_budget_gb": 0.5}
    (ok,) = by_check(run(data, l2_free_bytes=int(1.9 * GB)), "l2")
    assert ok.level == "ok", ok.message
    (warn,) = by_check(run(data, l2_free_bytes=int(0.9 * GB)), "l2")
    assert warn.level == "warn" and "(< 1 GB: 50 GB, or 2 x l2_budget_gb when that is less)" in warn.message


def test_the_rig_shm_below_l1_warns_the_container_has_no_shm_of_its_own():
    (shm,) = by_check(run(LMCACHE, host_shm_bytes=32 * 2**30), "host-shm")  # L1 60 GB, ipc: host
    assert shm.level == "warn" and shm.field == "/dev/shm" and "size >= 60G" in shm.fix
    assert not by_check(run(LMCACHE), "shm")  # no check of a container shm size: there is none


def test_engine_and_compose_required():
    (engine,) = refusals(run(LMCACHE, has_engine=False))
    assert engine.field == "docker"
    (compose,) = refusals(run({**LMCACHE, "force": True}, compose_command=None))
    assert compose.field == "compose"


def test_engine_left_for_later_keeps_every_other_gate_and_says_so():
    # a fresh rig: no engine yet, the docker role installs it in this run
    fresh = dict(has_engine=False, compose_command=None, registry_reachable=None)
    later = run(LMCACHE, engine_later=True, **fresh)
    assert refusals(later) == []
    (engine,) = by_check(later, "engine")
    assert engine.level == "ok" and "docker role" in engine.message
    assert by_check(later, "image") == []
    (ram,) = refusals(run(LMCACHE, engine_later=True, meminfo=meminfo_gb(87.9), **fresh))
    assert ram.check == "ram"


def test_engine_preflight_refuses_as_the_full_preflight_does():
    settings = settings_for_host(LMCACHE, variables=[])
    for changes in (dict(has_engine=False), dict(compose_command=None), dict(image_probe_error="manifest unknown")):
        expected = [f for f in refusals(run(LMCACHE, **changes)) if f.check in ("engine", "image")]
        assert expected and refusals(engine_preflight(settings, facts(**changes))) == expected
    assert refusals(engine_preflight(settings, facts(meminfo={}, image_present=True))) == []


def test_image_must_be_present_or_pullable():
    assert refusals(run(LMCACHE, image_present=True, registry_reachable=False)) == []
    (image,) = refusals(run(LMCACHE, image_present=False, registry_reachable=False))
    assert image.field == "serving_image"


def test_min_ram_of_the_profile():
    (ram,) = refusals(run(LMCACHE, meminfo=meminfo_gb(100, 48)))
    assert ram.field == "serving_profile" and "64" in ram.message


def test_rig_shm_too_small_for_the_engine_is_refused_with_the_remount_fix():
    # ipc: host gives the container the rig's /dev/shm: Docker's 64 MiB default killed vLLM in the lab
    (shm,) = by_check(run(CPU_LAB, meminfo=meminfo_gb(20, 24), host_shm_bytes=64 * 2**20), "host-shm")
    assert shm.level == "refuse" and shm.field == "/dev/shm" and "remount" in shm.fix
    (shm,) = by_check(run(CPU_LAB, meminfo=meminfo_gb(20, 24), host_shm_bytes=2 * 2**30), "host-shm")
    assert shm.level == "ok"


def test_rig_shm_below_l1_warns():
    (shm,) = by_check(run(LMCACHE, host_shm_bytes=32 * 2**30), "host-shm")
    assert shm.level == "warn" and "L1 60 GiB" in shm.message


# --- every gate at exact equality: the boundary value passes, the next step below does not ----------------
# (the rule each gate states is "at least": MemAvailable >= L1 + reserve, free fraction >= the minimum, ...;
# MemAvailable is compared in bytes against GiB, so "the next step below" is one byte less; the other GB
# figures are compared as the message prints them, to 0.1 GB, so "the next step below" is 0.1 GB less)


def gpu_csv(free_mib: int, total_mib: int = 100_000) -> str:
    """nvidia-smi's GPU_MEMORY_QUERY answer for two GPUs with the same memory."""
    return f"0, {free_mib}, {total_mib}\n1, {free_mib}, {total_mib}\n"


def cpu_lab_reserve_gb() -> float:
    return settings_for_host(CPU_LAB, variables=[]).knobs["ram_reserve_gb"]


MIB = 2**20
GATES = [
    # id, data, facts exactly at the boundary, facts one step below it, check, level below
    (
        "ram: MemAvailable == L1 + reserve",
        LMCACHE,
        dict(meminfo=meminfo_gib(60 + 28)),
        dict(meminfo={**meminfo_gib(60 + 28), "MemAvailable": (60 + 28) * GIB - 1}),
        "ram",
        "refuse",
    ),
    (
        "ram: MemAvailable == reserve, no L1",
        CPU_LAB,
        dict(meminfo=meminfo_gib(cpu_lab_reserve_gb(), 24), gpu_memory_csv=None),
        dict(meminfo={**meminfo_gib(0, 24), "MemAvailable": int(cpu_lab_reserve_gb() * GIB) - 1}, gpu_memory_csv=None),
        "ram",
        "refuse",
    ),
    (
        "ram: MemTotal == the profile's min_ram_gb",
        LMCACHE,
        dict(meminfo=meminfo_gib(100, 64)),
        dict(meminfo=meminfo_gib(100, 63.9)),
        "ram",
        "refuse",
    ),
    (
        "gpu: free fraction == gpu_free_fraction_min",
        {**LMCACHE, "gpu_free_fraction_min": 0.8},
        dict(gpu_memory_csv=gpu_csv(80_000)),
        dict(gpu_memory_csv=gpu_csv(79_999)),
        "gpu",
        "refuse",
    ),
    (
        "gpu: free fraction == the real H200's",
        {**LMCACHE, "gpu_free_fraction_min": 143156 / 143771},
        dict(gpu_memory_csv=IDLE),
        dict(gpu_memory_csv=gpu_csv(143155, 143771)),
        "gpu",
        "refuse",
    ),
    (
        "host-shm: /dev/shm == the engine's minimum",
        CPU_LAB,
        dict(meminfo=meminfo_gb(20, 24), gpu_memory_csv=None, host_shm_bytes=ENGINE_SHM_MIN_MB * MIB),
        dict(meminfo=meminfo_gb(20, 24), gpu_memory_csv=None, host_shm_bytes=(ENGINE_SHM_MIN_MB - 1) * MIB),
        "host-shm",
        "refuse",
    ),
    (
        "host-shm: /dev/shm == L1",
        LMCACHE,
        dict(host_shm_bytes=60 * 1024 * MIB),
        dict(host_shm_bytes=(60 * 1024 - 1) * MIB),
        "host-shm",
        "warn",
    ),
    (
        "l2: free == l2_budget_gb",
        {**LMCACHE, "l2_enabled": True, "l2_budget_gb": 60},
        dict(l2_free_bytes=60 * GB),
        dict(l2_free_bytes=int(59.9 * GB)),
        "l2",
        "refuse",
    ),
    (
        "l2: free == the warning floor",
        {**LMCACHE, "l2_enabled": True, "l2_budget_gb": 40},
        dict(l2_free_bytes=L2_FREE_WARN_GB * GB),
        dict(l2_free_bytes=int((L2_FREE_WARN_GB - 0.1) * GB)),
        "l2",
        "warn",
    ),
]


@pytest.mark.parametrize(
    "data,at,below,check,level_below", [gate[1:] for gate in GATES], ids=[gate[0] for gate in GATES]
)
def test_a_gate_passes_at_exact_equality_and_not_below(data, at, below, check, level_below):
    assert {f.level for f in by_check(run(data, **at), check)} == {"ok"}
    assert level_below in {f.level for f in by_check(run(data, **below), check)}


@pytest.mark.parametrize(
    "pci,declared,passes",
    [(1, 1, True), (0, 1, False), (1, 0, False)],
    ids=["pci == needed, gpus == needed", "pci below", "gpus below"],
)
def test_bare_host_gpu_count_gates_at_exact_equality(pci, declared, passes):
    # lmcache-mp needs 1 GPU; before the driver, the PCI bus and the declared gpus must each show that many
    bare = facts(gpu_memory_csv=None)
    findings = bare_host_preflight(settings_for_host(LMCACHE, variables=[]), bare, pci, declared)
    assert (by_check(findings, "gpu")[0].level == "ok") is passes


def test_tensor_parallel_wider_than_the_rig_is_refused_even_forced():
    for force in (False, True):  # the H200 fixture has two GPUs
        (gpu,) = refusals(run({**LMCACHE, "tensor_parallel_size": 4, "force": force}))
        assert gpu.field == "tensor_parallel_size" and "the rig has 2" in gpu.message and "at most 2" in gpu.fix
    assert not refusals(run({**LMCACHE, "tensor_parallel_size": 2}))


def test_lmcache_ports_are_preflighted_like_serving_port():
    nginx = [{"pid": 4242, "containers": [], "command": "nginx"}]
    (port,) = refusals(
        run(LMCACHE, port_listeners=[], stack_port_listeners={"lmcache_port": [], "lmcache_http_port": nginx})
    )
    assert (port.check, port.field, port.value) == ("port", "lmcache_http_port", 8080)
    assert "pid 4242 (nginx)" in port.message and "set lmcache_http_port to a free port" in port.fix
    # held by rigkit's own stack (the release replaces it): fine
    ours = [{"pid": 1, "containers": ["ab" * 32], "command": "python3"}]
    assert not refusals(
        run(
            LMCACHE,
            port_listeners=[],
            stack_container_ids=("abab",),
            stack_port_listeners={"lmcache_port": ours, "lmcache_http_port": ours},
        )
    )


NATIVE = {
    "serving_profile": "native-offload",
    "model": "m",
    "l1_size_gb": 64,
    "serving_image": "vllm/vllm-openai@sha256:" + "9" * 64,
}
TIERED = {**NATIVE, "serving_profile": "native-tiered", "allow_incubating": True}


def test_native_tiered_refuses_a_rig_shm_below_its_cpu_tier():
    # vLLM 0.26's TieringOffloadingSpec maps its CPU tier as /dev/shm/vllm_offload_<id>.mmap and pre-faults it
    # (MAP_POPULATE): the 8 GiB /dev/shm of the H200 rig cannot hold a 64 GiB tier, so the engine would not start
    for force in (False, True):
        (shm,) = by_check(run({**TIERED, "force": force}, host_shm_bytes=8 * GIB), "host-shm")
        assert shm.level == "refuse" and "8192 MiB < L1 64 GiB + 256 MiB" in shm.message
        assert "size >= 65G" in shm.fix
    assert {f.level for f in by_check(run(TIERED, host_shm_bytes=64 * GIB + ENGINE_SHM_MIN_MB * MIB), "host-shm")} == {
        "ok"
    }
    assert (
        by_check(run(TIERED, host_shm_bytes=64 * GIB + ENGINE_SHM_MIN_MB * MIB - MIB), "host-shm")[0].level == "refuse"
    )
    # native-offload's CPU tier is pinned memory on 0.26, no /dev/shm file (H200): a small /dev/shm only warns
    assert by_check(run(NATIVE, host_shm_bytes=8 * GIB), "host-shm")[0].level == "warn"
    assert by_check(run(LMCACHE, host_shm_bytes=8 * GIB), "host-shm")[0].level == "warn"


def test_a_shm_filled_by_stale_segments_is_judged_by_what_is_free_not_its_size():
    """The H200 leak: each stop of native-tiered left its CPU tier in /dev/shm, the size stayed the same. Free space
    gates; the CPU-tier segments there count as free (the restart frees the running one and removes stale ones)."""
    size = 128 * GIB
    full = {"free_bytes": 10 * GIB, "offload_bytes": 0}
    (shm,) = by_check(run(TIERED, host_shm_bytes=size, host_shm_free=full), "host-shm")
    assert shm.level == "refuse" and shm.value == "10240 MiB free" and "ls -la /dev/shm" in shm.fix
    ours = {"free_bytes": 10 * GIB, "offload_bytes": 64 * GIB}  # the running stack's own tier: freed by the restart
    assert by_check(run(TIERED, host_shm_bytes=size, host_shm_free=ours), "host-shm")[0].level == "ok"
    # a profile without a /dev/shm tier needs only the engine's queue free
    assert by_check(run(NATIVE, host_shm_bytes=size, host_shm_free=full), "host-shm")[0].level == "ok"
    nothing = {"free_bytes": 100 * MIB, "offload_bytes": 0}
    assert by_check(run(NATIVE, host_shm_bytes=size, host_shm_free=nothing), "host-shm")[0].level == "refuse"
    assert (
        "rig /dev/shm large enough, 131072 MiB free"
        in by_check(
            run(TIERED, host_shm_bytes=size, host_shm_free={"free_bytes": size, "offload_bytes": 0}), "host-shm"
        )[0].message
    )
