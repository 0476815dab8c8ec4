"""The L2 gates (rigkit.preflight.l2): free space where the L2 disk tier lives."""

import pytest

from rigkit.preflight import Finding
from rigkit.preflight.l2 import L2_FREE_WARN_GB, check_l2, check_l2_if_mounted
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.sizing import GB
from tests.preflight.common import (
    CPU_LAB,
    KV,
    L2_ON,
    LMCACHE,
    by_check,
    edge_cases,
    passes_at_the_edge_not_past_it,
    run,
)


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


# --- every gate at exact equality: the boundary value passes, the next step below does not ----------------
# (the rule each gate states is "at least": MemAvailable >= L1 + reserve, free fraction >= the minimum, ...;
# MemAvailable is compared in bytes against GiB, so "the next step below" is one byte less; the other GB
# figures are compared as the message prints them, to 0.1 GB, so "the next step below" is 0.1 GB less)

GATES = [
    # id, data, facts exactly at the boundary, facts one step below it, check, level below
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


@edge_cases(GATES)
def test_a_gate_passes_at_exact_equality_and_not_below(data, at, below, check, level_below):
    passes_at_the_edge_not_past_it(data, at, below, check, level_below)


# --- every finding word for word: level, field, value, the message with its numbers, the fix, forceable --------
# (an operator reads these before anything changed on the rig: a wrong number, field or fix is a wrong answer)


WORD_FOR_WORD = [
    # id, gate, data, the gate's arguments after the settings, its findings
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
]


@pytest.mark.parametrize(
    "gate,data,args,expected", [case[1:] for case in WORD_FOR_WORD], ids=[case[0] for case in WORD_FOR_WORD]
)
def test_each_finding_word_for_word(gate, data, args, expected):
    assert gate(settings_for_host(data, variables=[]), *args) == expected
