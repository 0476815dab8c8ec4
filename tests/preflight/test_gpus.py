"""The GPU gates (rigkit.preflight.gpus): GPU memory, gpu_mask, tensor parallelism."""

import pytest

from rigkit.preflight import Finding, bare_host_preflight, refusals
from rigkit.preflight.gpus import check_gpus
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.sizing import GB
from tests.preflight.common import (
    BUSY,
    BUSY_FIX,
    BUSY_GPU1,
    CPU_LAB,
    IDLE,
    IDLE_GPUS,
    LMCACHE,
    by_check,
    edge_cases,
    facts,
    gpu_csv,
    meminfo_gb,
    passes_at_the_edge_not_past_it,
    run,
    with_gpus,
)

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


# --- every gate at exact equality: the boundary value passes, the next step below does not ----------------
# (the rule each gate states is "at least": MemAvailable >= L1 + reserve, free fraction >= the minimum, ...;
# MemAvailable is compared in bytes against GiB, so "the next step below" is one byte less; the other GB
# figures are compared as the message prints them, to 0.1 GB, so "the next step below" is 0.1 GB less)

GATES = [
    # id, data, facts exactly at the boundary, facts one step below it, check, level below
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
]


@edge_cases(GATES)
def test_a_gate_passes_at_exact_equality_and_not_below(data, at, below, check, level_below):
    passes_at_the_edge_not_past_it(data, at, below, check, level_below)


# --- every finding word for word: level, field, value, the message with its numbers, the fix, forceable --------
# (an operator reads these before anything changed on the rig: a wrong number, field or fix is a wrong answer)


WORD_FOR_WORD = [
    # id, gate, data, the gate's arguments after the settings, its findings
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
