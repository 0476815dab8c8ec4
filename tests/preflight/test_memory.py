"""The memory gates (rigkit.preflight.memory): RAM and the rig's /dev/shm."""

import pytest

from rigkit.errors import PreflightError
from rigkit.preflight import Finding, raise_if_refused, refusals
from rigkit.preflight.memory import ENGINE_SHM_MIN_MB, check_host_shm, check_ram
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.sizing import GB, GIB
from tests.preflight.common import (
    CPU_LAB,
    LMCACHE,
    MIB,
    OOM_NOTE,
    SHM_FULL_FIX,
    by_check,
    cpu_lab_reserve_gb,
    edge_cases,
    meminfo_gb,
    meminfo_gib,
    passes_at_the_edge_not_past_it,
    run,
)


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


def test_min_ram_of_the_profile():
    (ram,) = refusals(run(LMCACHE, meminfo=meminfo_gb(100, 48)))
    assert ram.field == "serving_profile" and "64" in ram.message


def test_the_rig_shm_below_l1_warns_the_container_has_no_shm_of_its_own():
    (shm,) = by_check(run(LMCACHE, host_shm_bytes=32 * 2**30), "host-shm")  # L1 60 GB, ipc: host
    assert shm.level == "warn" and shm.field == "/dev/shm" and "size >= 60G" in shm.fix
    assert not by_check(run(LMCACHE), "shm")  # no check of a container shm size: there is none


def test_rig_shm_too_small_for_the_engine_is_refused_with_the_remount_fix():
    # ipc: host gives the container the rig's /dev/shm: Docker's 64 MiB default killed vLLM in the lab
    (shm,) = by_check(run(CPU_LAB, meminfo=meminfo_gb(20, 24), host_shm_bytes=64 * 2**20), "host-shm")
    assert shm.level == "refuse" and shm.field == "/dev/shm" and "remount" in shm.fix
    (shm,) = by_check(run(CPU_LAB, meminfo=meminfo_gb(20, 24), host_shm_bytes=2 * 2**30), "host-shm")
    assert shm.level == "ok"


def test_rig_shm_below_l1_warns():
    (shm,) = by_check(run(LMCACHE, host_shm_bytes=32 * 2**30), "host-shm")
    assert shm.level == "warn" and "L1 60 GiB" in shm.message


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


# --- every gate at exact equality: the boundary value passes, the next step below does not ----------------
# (the rule each gate states is "at least": MemAvailable >= L1 + reserve, free fraction >= the minimum, ...;
# MemAvailable is compared in bytes against GiB, so "the next step below" is one byte less; the other GB
# figures are compared as the message prints them, to 0.1 GB, so "the next step below" is 0.1 GB less)

GATES = [
    # id, data, facts exactly at the boundary, facts one step below it, check, level below
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
]


@edge_cases(GATES)
def test_a_gate_passes_at_exact_equality_and_not_below(data, at, below, check, level_below):
    passes_at_the_edge_not_past_it(data, at, below, check, level_below)


# --- every finding word for word: level, field, value, the message with its numbers, the fix, forceable --------
# (an operator reads these before anything changed on the rig: a wrong number, field or fix is a wrong answer)


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
]


@pytest.mark.parametrize(
    "gate,data,args,expected", [case[1:] for case in WORD_FOR_WORD], ids=[case[0] for case in WORD_FOR_WORD]
)
def test_each_finding_word_for_word(gate, data, args, expected):
    assert gate(settings_for_host(data, variables=[]), *args) == expected
