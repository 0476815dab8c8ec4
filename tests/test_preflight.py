"""Preflight: host facts + settings -> findings. nvidia-smi outputs are real (2x H200); RAM and disk
numbers are read from that host's /proc/meminfo and df in the fixtures, or set to the edge of a gate."""

from dataclasses import fields as dataclass_fields
from dataclasses import replace
from pathlib import Path

import pytest

from rigkit.errors import PreflightError
from rigkit.preflight import (
    ENGINE_SHM_MIN_MB,
    L2_FREE_WARN_GB,
    Finding,
    HostFacts,
    bare_host_preflight,
    check_gpus,
    check_host_shm,
    check_l2,
    check_l2_if_mounted,
    check_port,
    check_ram,
    engine_checks,
    engine_preflight,
    preflight,
    raise_if_refused,
    refusals,
)
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.sizing import GB, GIB
from rigkit.survey import RigState

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


# vLLM would start on BUSY's GPU 0 (79.3% free) with 0.7 of it: only rigkit's gpu_free_fraction_min refuses
BELOW_THE_GATE = {**LMCACHE, "gpu_memory_utilization": 0.7}


def test_busy_gpu_refused_and_force_downgrades_it():
    findings = run(BELOW_THE_GATE, gpu_memory_csv=BUSY)
    (gpu,) = refusals(findings)
    assert gpu.check == "gpu" and "GPU 0" in gpu.message and "79.3%" in gpu.message
    forced = run({**BELOW_THE_GATE, "force": True}, gpu_memory_csv=BUSY)
    assert refusals(forced) == [] and any(f.level == "warn" and "forced" in f.message for f in forced)
    assert refusals(run({**BELOW_THE_GATE, "gpu_mask": "1"}, gpu_memory_csv=BUSY)) == []


def test_gpu_gate_threshold_is_a_knob():
    assert refusals(run({**BELOW_THE_GATE, "gpu_free_fraction_min": 0.75}, gpu_memory_csv=BUSY)) == []


def test_unset_gpu_memory_utilization_is_held_to_vllms_default_which_force_cannot_lower():
    # vLLM 0.26 starts only where 92% of each GPU is free when gpu_memory_utilization is unset: rigkit's own
    # 80% gate would let a GPU 85% free through to an engine that refuses to start
    for data in (LMCACHE, {**LMCACHE, "force": True}, {**LMCACHE, "gpu_free_fraction_min": 0.5}):
        gpus = refusals(run(data, gpu_memory_csv=gpu_csv(91_999)))
        assert [(gpu.field, gpu.value, gpu.forceable) for gpu in gpus] == [("gpu_memory_utilization", 0.92, False)] * 2
    assert refusals(run(LMCACHE, gpu_memory_csv=gpu_csv(92_000))) == []


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
        {**LMCACHE, "gpu_free_fraction_min": 0.8, "gpu_memory_utilization": 0.7},
        dict(gpu_memory_csv=gpu_csv(80_000)),
        dict(gpu_memory_csv=gpu_csv(79_999)),
        "gpu",
        "refuse",
    ),
    (
        "gpu: free fraction == vLLM's default gpu_memory_utilization, unset",
        LMCACHE,
        dict(gpu_memory_csv=gpu_csv(92_000)),
        dict(gpu_memory_csv=gpu_csv(91_999)),
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


# --- every finding word for word: level, field, value, the message with its numbers, the fix, forceable --------
# (an operator reads these before anything changed on the rig: a wrong number, field or fix is a wrong answer)

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


WORD_FOR_WORD = [
    # id, gate, data, the gate's arguments after the settings, its findings
    (
        "ram: MemAvailable below L1 + reserve",
        check_ram,
        LMCACHE,
        (meminfo_gib(87.9),),
        [
            Finding(
                "refuse",
                "ram",
                "l1_size_gb",
                60,
                f"MemAvailable 87.9 GiB < L1 60 + reserve 28 = 88 GiB {OOM_NOTE}",
                "set l1_size_gb to at most 59 (GiB) or free memory",
            )
        ],
    ),
    (
        "ram: MemAvailable leaves exactly 1 GiB for L1",
        check_ram,
        LMCACHE,
        (meminfo_gib(29.5),),
        [
            Finding(
                "refuse",
                "ram",
                "l1_size_gb",
                60,
                f"MemAvailable 29.5 GiB < L1 60 + reserve 28 = 88 GiB {OOM_NOTE}",
                "set l1_size_gb to at most 1 (GiB) or free memory",
            )
        ],
    ),
    (
        "ram: MemAvailable leaves no GiB for L1 beside the reserve",
        check_ram,
        LMCACHE,
        (meminfo_gib(28.9),),
        [
            Finding(
                "refuse",
                "ram",
                "l1_size_gb",
                60,
                f"MemAvailable 28.9 GiB < L1 60 + reserve 28 = 88 GiB {OOM_NOTE}",
                "free memory on the rig or lower ram_reserve_gb: 28 GiB leaves no GiB for L1 beside it",
            )
        ],
    ),
    (
        "ram: no L1, MemAvailable below the reserve",
        check_ram,
        CPU_LAB,
        ({"MemAvailable": 3 * GIB, "MemTotal": 16 * GB},),
        [
            Finding(
                "refuse",
                "ram",
                "ram_reserve_gb",
                4,
                f"MemAvailable 3 GiB < L1 0 + reserve 4 = 4 GiB {OOM_NOTE}",
                "free memory on the rig or set ram_reserve_gb to at most 3 (GiB)",
            )
        ],
    ),
    (
        "ram: enough",
        check_ram,
        LMCACHE,
        (meminfo_gib(100),),
        [Finding("ok", "ram", "l1_size_gb", 60, "MemAvailable 100 GiB >= L1 + reserve 88 GiB")],
    ),
    (
        "ram: MemTotal below the profile's min_ram_gb (forceable)",
        check_ram,
        LMCACHE,
        (meminfo_gib(100, 48),),
        [
            Finding("ok", "ram", "l1_size_gb", 60, "MemAvailable 100 GiB >= L1 + reserve 88 GiB"),
            Finding(
                "refuse",
                "ram",
                "serving_profile",
                "lmcache-mp",
                "MemTotal 48 GB < 64 GB that profile lmcache-mp needs",
                "pick a smaller profile or a bigger rig",
                forceable=True,
            ),
        ],
    ),
    (
        "ram: a /proc/meminfo without MemAvailable or MemTotal counts them 0",
        check_ram,
        CPU_LAB,
        ({},),
        [
            Finding(
                "refuse",
                "ram",
                "ram_reserve_gb",
                4,
                f"MemAvailable 0 GiB < L1 0 + reserve 4 = 4 GiB {OOM_NOTE}",
                "free memory on the rig or set ram_reserve_gb to at most 0 (GiB)",
            ),
            Finding(
                "refuse",
                "ram",
                "serving_profile",
                "cpu-lab",
                "MemTotal 0 GB < 8 GB that profile cpu-lab needs",
                "pick a smaller profile or a bigger rig",
                forceable=True,
            ),
        ],
    ),
    (
        "host-shm: size unknown",
        check_host_shm,
        LMCACHE,
        (None,),
        [
            Finding(
                "warn",
                "host-shm",
                "/dev/shm",
                None,
                "size of the rig's /dev/shm unknown",
                "check `df -h /dev/shm` on the rig",
            )
        ],
    ),
    (
        "host-shm: below the engine's minimum, no L1",
        check_host_shm,
        CPU_LAB,
        (64 * MIB,),
        [
            Finding(
                "refuse",
                "host-shm",
                "/dev/shm",
                "64 MiB",
                "the rig's /dev/shm is 64 MiB < 256 MiB the engine needs (ipc: host shares it with the container)",
                "remount /dev/shm larger on the rig (mount -o remount,size=1G /dev/shm)",
            )
        ],
    ),
    (
        "host-shm: below the engine's minimum, L1 60",
        check_host_shm,
        LMCACHE,
        (128 * MIB,),
        [
            Finding(
                "refuse",
                "host-shm",
                "/dev/shm",
                "128 MiB",
                "the rig's /dev/shm is 128 MiB < 256 MiB the engine needs (ipc: host shares it with the container)",
                "remount /dev/shm larger on the rig (mount -o remount,size=60G /dev/shm)",
            )
        ],
    ),
    (
        "host-shm: below a CPU tier kept in /dev/shm",
        check_host_shm,
        TIERED,
        (8 * GIB,),
        [
            Finding(
                "refuse",
                "host-shm",
                "/dev/shm",
                "8192 MiB",
                "the rig's /dev/shm is 8192 MiB < L1 64 GiB + 256 MiB for the engine: profile native-tiered keeps "
                "its CPU tier in /dev/shm and fills it at start (ipc: host shares it with the container)",
                "remount /dev/shm with size >= 65G on the rig (mount -o remount,size=65G /dev/shm) or lower l1_size_gb",
            )
        ],
    ),
    (
        # 300 GiB + 256 MiB is 300.25 GiB: 301G (a rounding by 1025 MiB would say 300G, too small)
        "host-shm: below a 300 GiB CPU tier kept in /dev/shm",
        check_host_shm,
        {**TIERED, "l1_size_gb": 300},
        (300 * GIB,),
        [
            Finding(
                "refuse",
                "host-shm",
                "/dev/shm",
                "307200 MiB",
                "the rig's /dev/shm is 307200 MiB < L1 300 GiB + 256 MiB for the engine: profile native-tiered keeps "
                "its CPU tier in /dev/shm and fills it at start (ipc: host shares it with the container)",
                "remount /dev/shm with size >= 301G on the rig (mount -o remount,size=301G /dev/shm) "
                "or lower l1_size_gb",
            )
        ],
    ),
    (
        "host-shm: filled by something else, CPU tier in /dev/shm",
        check_host_shm,
        TIERED,
        (128 * GIB, {"free_bytes": 10 * GIB, "offload_bytes": 2 * GIB}),
        [
            Finding(
                "refuse",
                "host-shm",
                "/dev/shm",
                "10240 MiB free",
                "the rig's /dev/shm has 10240 MiB free (+2048 MiB of vLLM CPU-tier segments the restart frees) "
                "< L1 64 GiB + 256 MiB for the engine: something else fills it",
                SHM_FULL_FIX + ", or lower l1_size_gb",
            )
        ],
    ),
    (
        # no CPU tier in /dev/shm: a smaller L1 frees nothing there, so the fix does not offer it
        "host-shm: filled by something else, only the engine's queue in /dev/shm",
        check_host_shm,
        NATIVE,
        (128 * GIB, {"free_bytes": 100 * MIB, "offload_bytes": 50 * MIB}),
        [
            Finding(
                "refuse",
                "host-shm",
                "/dev/shm",
                "100 MiB free",
                "the rig's /dev/shm has 100 MiB free (+50 MiB of vLLM CPU-tier segments the restart frees) "
                "< 256 MiB the engine needs: something else fills it",
                SHM_FULL_FIX,
            )
        ],
    ),
    (
        "host-shm: free + CPU-tier segments == the engine's minimum",
        check_host_shm,
        NATIVE,
        (128 * GIB, {"free_bytes": 200 * MIB, "offload_bytes": 56 * MIB}),
        [Finding("ok", "host-shm", "/dev/shm", "131072 MiB", "rig /dev/shm large enough, 200 MiB free")],
    ),
    (
        "host-shm: below L1 (warns)",
        check_host_shm,
        LMCACHE,
        (32 * GIB,),
        [
            Finding(
                "warn",
                "host-shm",
                "/dev/shm",
                "32768 MiB",
                "the rig's /dev/shm 32768 MiB < L1 60 GiB (ipc: host shares it with the container)",
                "remount /dev/shm with size >= 60G",
            )
        ],
    ),
    (
        "host-shm: large enough, free space not read",
        check_host_shm,
        LMCACHE,
        (64 * GIB,),
        [Finding("ok", "host-shm", "/dev/shm", "65536 MiB", "rig /dev/shm large enough")],
    ),
    (
        "l2: off",
        check_l2,
        LMCACHE,
        (1 * GB,),
        [Finding("ok", "l2", "l2_enabled", False, "no L2 disk tier: skipped")],
    ),
    (
        "l2: free space unknown",
        check_l2,
        L2_ON,
        (None,),
        [
            Finding(
                "warn",
                "l2",
                "l2_path",
                KV,
                f"free space under {KV} unknown",
                "check that the L2 disk is mounted (the L2 disk role)",
            )
        ],
    ),
    (
        "l2: below the budget (forceable)",
        check_l2,
        {**L2_ON, "l2_budget_gb": 40},
        (int(39.94 * GB),),
        [
            Finding(
                "refuse",
                "l2",
                "l2_budget_gb",
                40.0,
                f"{KV} has 39.9 GB free < L2 budget 40 GB",
                f"free space on {KV} or set l2_budget_gb to at most 39.9",
                forceable=True,
            )
        ],
    ),
    (
        # compared as printed, to 0.1 GB: 39.96 GB is "40 GB", the budget
        "l2: 39.96 GB free reads as the 40 GB budget",
        check_l2,
        {**L2_ON, "l2_budget_gb": 40},
        (int(39.96 * GB),),
        [
            Finding(
                "warn",
                "l2",
                "l2_path",
                KV,
                f"{KV} has only 40 GB free (< 50 GB: 50 GB, or 2 x l2_budget_gb when that is less)",
                "use a larger disk for the L2 tier",
            )
        ],
    ),
    (
        "l2: enough",
        check_l2,
        L2_ON,
        (900 * GB,),
        [Finding("ok", "l2", "l2_path", KV, f"{KV} has 900 GB free >= budget 100 GB")],
    ),
    (
        "l2 before the l2_disk role: not mounted yet",
        check_l2_if_mounted,
        L2_ON,
        (None,),
        [
            Finding(
                "ok",
                "l2",
                "l2_path",
                KV,
                "L2 disk not mounted yet: its free space is checked once the l2_disk role mounted it",
            )
        ],
    ),
    (
        "l2 before the l2_disk role: off",
        check_l2_if_mounted,
        LMCACHE,
        (None,),
        [Finding("ok", "l2", "l2_enabled", False, "no L2 disk tier: skipped")],
    ),
    (
        "gpu: a CPU profile",
        check_gpus,
        CPU_LAB,
        (None,),
        [Finding("ok", "gpu", "serving_profile", "cpu-lab", "profile needs no GPUs: skipped")],
    ),
    (
        "gpu: none reported",
        check_gpus,
        LMCACHE,
        ("",),
        [
            Finding(
                "refuse",
                "gpu",
                "serving_profile",
                "lmcache-mp",
                "profile lmcache-mp needs 1 GPU(s) but the rig reports none",
                "install the NVIDIA driver (the driver role) or pick a CPU profile such as cpu-lab",
            )
        ],
    ),
    (
        "gpu: gpu_mask selects a GPU the rig lacks",
        check_gpus,
        {**LMCACHE, "gpu_mask": "0,3"},
        (IDLE,),
        [
            Finding(
                "refuse",
                "gpu",
                "gpu_mask",
                "0,3",
                "GPU(s) [3] not on this rig (it has [0, 1])",
                "fix gpu_mask for this host",
            )
        ],
    ),
    (
        "gpu: tensor parallelism wider than the rig",
        check_gpus,
        {**LMCACHE, "tensor_parallel_size": 4},
        (IDLE,),
        [
            Finding(
                "refuse",
                "gpu",
                "tensor_parallel_size",
                4,
                "needs 4 GPUs, one per rank, but the rig has 2",
                "set tensor_parallel_size to at most 2, or give the stack more GPUs",
            )
        ],
    ),
    (
        "gpu: below gpu_free_fraction_min (forceable)",
        check_gpus,
        BELOW_THE_GATE,
        (BUSY,),
        [
            Finding(
                "refuse",
                "gpu",
                "gpu_free_fraction_min",
                0.8,
                "GPU 0 has 79.3% free (114018 of 143771 MiB) < 80%",
                BUSY_FIX,
                forceable=True,
            ),
            BUSY_GPU1,
        ],
    ),
    (
        # 79.3% free: vLLM starts with a utilization of 0.79, not 0.80
        "gpu: below gpu_memory_utilization (vLLM would not start)",
        check_gpus,
        {**LMCACHE, "gpu_memory_utilization": 0.9},
        (BUSY,),
        [
            Finding(
                "refuse",
                "gpu",
                "gpu_memory_utilization",
                0.9,
                "GPU 0 has 79.3% free (114018 of 143771 MiB) < 90% (vLLM would not start)",
                BUSY_FIX + ", or lower gpu_memory_utilization to at most 0.79",
            ),
            BUSY_GPU1,
        ],
    ),
    (
        "gpu: below vLLM's default gpu_memory_utilization, unset (vLLM would not start)",
        check_gpus,
        LMCACHE,
        (BUSY,),
        [
            Finding(
                "refuse",
                "gpu",
                "gpu_memory_utilization",
                0.92,
                "GPU 0 has 79.3% free (114018 of 143771 MiB) < 92% (vLLM would not start) "
                "(gpu_memory_utilization unset: vLLM's default 0.92)",
                BUSY_FIX + ", or set gpu_memory_utilization to at most 0.79",
            ),
            BUSY_GPU1,
        ],
    ),
    (
        # equal bars: below them vLLM would not start, so force must not lower this one
        "gpu: gpu_memory_utilization == gpu_free_fraction_min is vLLM's bar",
        check_gpus,
        {**LMCACHE, "gpu_memory_utilization": 0.8},
        (BUSY,),
        [
            Finding(
                "refuse",
                "gpu",
                "gpu_memory_utilization",
                0.8,
                "GPU 0 has 79.3% free (114018 of 143771 MiB) < 80% (vLLM would not start)",
                BUSY_FIX + ", or lower gpu_memory_utilization to at most 0.79",
            ),
            BUSY_GPU1,
        ],
    ),
    (
        "gpu: every GPU free enough",
        check_gpus,
        LMCACHE,
        (IDLE,),
        IDLE_GPUS,
    ),
    (
        "engine: none",
        engine_checks,
        LMCACHE,
        (facts(has_engine=False, compose_command=None),),
        [
            Finding(
                "refuse", "engine", "docker", None, "no Docker engine answers on the rig", "run the docker role first"
            ),
            Finding("ok", "image", "serving_image", IMAGE, "image will be pulled by digest"),
        ],
    ),
    (
        "engine: no compose; image on the rig",
        engine_checks,
        LMCACHE,
        (facts(compose_command=None, image_present=True, registry_reachable=False),),
        [
            Finding(
                "refuse",
                "engine",
                "compose",
                None,
                "neither `docker compose` nor `docker-compose`",
                "install the compose plugin (the docker role does)",
            ),
            Finding("ok", "image", "serving_image", IMAGE, "image already on the rig"),
        ],
    ),
    (
        "image: the registry does not serve the digest",
        engine_checks,
        LMCACHE,
        (facts(compose_command="docker-compose", image_probe_error="manifest unknown"),),
        [
            Finding("ok", "engine", "compose", "docker-compose", "docker and docker-compose present"),
            Finding(
                "refuse",
                "image",
                "serving_image",
                IMAGE,
                "registry docker.io answered that it does not serve this digest; the image is not on the rig "
                "(docker: manifest unknown)",
                "check the digest (`rigkit resolve lmcache/vllm-openai:TAG` prints the current one) and that the "
                "image was pushed to docker.io; a private repository answers the same to a rig without credentials "
                "(docker login on the rig)",
            ),
        ],
    ),
    (
        "image: not on the rig, registry unreachable",
        engine_checks,
        LMCACHE,
        (facts(registry_reachable=False),),
        [
            Finding("ok", "engine", "compose", "docker compose", "docker and docker compose present"),
            Finding(
                "refuse",
                "image",
                "serving_image",
                IMAGE,
                "image not on the rig and its registry is unreachable",
                "bring the registry back or deploy a digest the rig keeps (rollback)",
            ),
        ],
    ),
    (
        "port: every port free",
        check_port,
        LMCACHE,
        (facts(port_listeners=[], stack_port_listeners={"lmcache_port": [], "lmcache_http_port": []}),),
        [
            Finding("ok", "port", "serving_port", 8000, "port 8000 free or held by rigkit's stack"),
            Finding("ok", "port", "lmcache_port", 5555, "port 5555 free or held by rigkit's stack"),
            Finding("ok", "port", "lmcache_http_port", 8080, "port 8080 free or held by rigkit's stack"),
        ],
    ),
    (
        "port: two foreign listeners, one outside the rig's view",
        check_port,
        CPU_LAB,
        (
            facts(
                port_listeners=[
                    {"pid": 4242, "containers": [], "command": "nginx"},
                    {"pid": None, "containers": [], "command": None},
                ]
            ),
        ),
        [
            Finding(
                "refuse",
                "port",
                "serving_port",
                8000,
                "TCP port 8000 on the rig is already in use by pid 4242 (nginx), a process outside the rig's view",
                "stop what listens there (`ss -ltnp 'sport = :8000'` on the rig) or set serving_port to a free port",
            )
        ],
    ),
]


@pytest.mark.parametrize(
    "gate,data,args,expected", [case[1:] for case in WORD_FOR_WORD], ids=[case[0] for case in WORD_FOR_WORD]
)
def test_each_finding_word_for_word(gate, data, args, expected):
    assert gate(settings_for_host(data, variables=[]), *args) == expected


def test_a_gpu_profile_needing_more_gpus_than_the_rig_has():
    settings = with_gpus(settings_for_host(LMCACHE, variables=[]), 3)
    assert check_gpus(settings, IDLE) == [
        Finding(
            "refuse",
            "gpu",
            "serving_profile",
            "lmcache-mp",
            "2 GPU(s) selected, profile needs 3",
            "select more GPUs or pick another profile",
        )
    ]
    assert check_gpus(with_gpus(settings, 2), IDLE) == IDLE_GPUS  # exactly as many: passes


@pytest.mark.parametrize(
    "finding,text",
    [
        (Finding("refuse", "ram", "f", 1, "too little", "free memory"), "[refuse] ram: too little. Fix: free memory"),
        (Finding("warn", "l2", "f", 1, "little", "a larger disk"), "[warn] l2: little. Fix: a larger disk"),
        (Finding("refuse", "engine", "f", 1, "no engine"), "[refuse] engine: no engine."),  # no fix: none printed
        (Finding("ok", "ram", "f", 1, "enough", "never shown"), "[ok] ram: enough."),  # a pass needs no fix
    ],
    ids=["refusal", "warning", "refusal without a fix", "pass"],
)
def test_a_finding_reads_as_one_line(finding, text):
    assert str(finding) == text


@pytest.mark.parametrize(
    "refused,message",
    [
        (1, "ram: first"),
        (2, "ram: first (+1 more refusal(s))"),
        (3, "ram: first (+2 more refusal(s))"),
    ],
)
def test_raise_if_refused_names_the_first_refusal_and_counts_the_others(refused, message):
    first = Finding("refuse", "ram", "l1_size_gb", 60, "first", "set l1_size_gb lower")
    others = [Finding("refuse", "gpu", "gpu_mask", "0", f"other {n}", "other fix") for n in range(refused - 1)]
    passes = [Finding("ok", "l2", "l2_path", "/x", "fine"), Finding("warn", "l2", "l2_path", "/x", "low")]
    with pytest.raises(PreflightError) as caught:
        raise_if_refused([passes[0], first, passes[1], *others])
    error = caught.value
    assert (error.field, error.value, error.problem, error.fix) == ("l1_size_gb", 60, message, "set l1_size_gb lower")
    raise_if_refused(passes)  # warnings and passes alone raise nothing


def test_facts_from_the_rig_survey():
    """HostFacts.from_state: each gate's fact from the survey field that holds it (roles/preflight.py and
    roles/serving.py build the gates' facts this way)."""
    listeners = [{"pid": 7, "containers": [], "command": "nginx"}]
    stack_listeners = {"lmcache_port": [], "lmcache_http_port": listeners}
    state = RigState(
        **{
            **{field.name: None for field in dataclass_fields(RigState)},
            "meminfo": {"MemAvailable": 5, "MemTotal": 6},
            "shm_bytes": 64 * MIB,
            "shm_free": {"free_bytes": 1, "offload_bytes": 2},
            "l2_free_bytes": 123,
            "nvidia_smi_cli": "/usr/bin/nvidia-smi",
            "gpu_memory": ["0, 1, 2", "1, 3, 4"],
            "docker_cli": "/usr/bin/docker",
            "compose_command": "docker compose",
            "image_present": True,
            "port_listeners": listeners,
            "stack_port_listeners": stack_listeners,
            "stack_containers": [{"id": "aa", "running": True}, {"id": "bb", "running": False}],
        }
    )
    assert HostFacts.from_state(state) == HostFacts(
        meminfo={"MemAvailable": 5, "MemTotal": 6},
        l2_free_bytes=123,
        gpu_memory_csv="0, 1, 2\n1, 3, 4",
        has_engine=True,
        compose_command="docker compose",
        image_present=True,
        registry_reachable=None,
        host_shm_bytes=64 * MIB,
        host_shm_free={"free_bytes": 1, "offload_bytes": 2},
        image_probe_error=None,
        port_listeners=listeners,
        stack_port_listeners=stack_listeners,
        stack_container_ids=("aa",),
    )
    # no nvidia-smi: no GPU table (a stale one is not read); no docker CLI: no engine
    bare = replace(state, nvidia_smi_cli=None, docker_cli=None, image_present=False)
    facts_of_bare = HostFacts.from_state(bare)
    assert (facts_of_bare.gpu_memory_csv, facts_of_bare.has_engine, facts_of_bare.image_present) == (None, False, False)
    # a gate that reads a fact differently overrides it, the others stay the survey's
    overridden = HostFacts.from_state(state, gpu_memory_csv=None, l2_free_bytes=None, image_probe_error="denied")
    assert overridden == replace(
        HostFacts.from_state(state), gpu_memory_csv=None, l2_free_bytes=None, image_probe_error="denied"
    )
