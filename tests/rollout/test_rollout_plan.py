"""rigkit.rollout.plan: the settings (one for the fleet, a flag wins), the stages in inventory order, and plain
pyinfra refusing a rollout it would run all at once."""

from __future__ import annotations

import pytest

from rigkit.errors import ConfigError
from rigkit.rollout import plan as rollout_plan
from rigkit.rollout.plan import CANARY, RolloutSettings, plan_stages, refuse_unbatched, rollout_settings
from rigkit.settings.defaults import ROLLOUT_VARIABLES
from rigkit.settings.hostdata import rig_settings
from rigkit.settings.variables import resolve


def section(**data) -> dict:
    return resolve(ROLLOUT_VARIABLES, data)


def test_canaries_first_then_batches_in_inventory_order():
    stages = plan_stages(["a", "b", "c", "d", "e"], canary=1, batch=2)
    assert [(s.label, s.rigs) for s in stages] == [(CANARY, ("a",)), ("batch 1", ("b", "c")), ("batch 2", ("d", "e"))]
    assert [s.rigs for s in plan_stages(["a", "b", "c"], canary=2, batch=0)] == [("a", "b"), ("c",)]
    assert [s.rigs for s in plan_stages(["a", "b", "c"], canary=0, batch=2)] == [("a", "b"), ("c",)]
    assert [(s.label, s.rigs) for s in plan_stages(["a", "b"], canary=2, batch=0)] == [(CANARY, ("a", "b"))]


def test_more_canaries_than_targeted_rigs_is_refused_naming_the_count():
    # was ValueError: range() arg 3 must not be zero with batch 0, a silently smaller canary stage otherwise
    for batch in (0, 1):
        with pytest.raises(ConfigError) as refused:
            plan_stages(["a"], canary=3, batch=batch)
        assert refused.value.field == "rollout_canary" and "targets 1 rig(s) (a)" in refused.value.problem
        assert "at most 1" in refused.value.fix
    assert [(s.label, s.rigs) for s in plan_stages(["a", "b"], 0, 0)] == [(rollout_plan.ALL_AT_ONCE, ("a", "b"))]


@pytest.mark.parametrize(
    "rigs,canary,message",
    [
        (
            ["a", "b"],
            3,
            "rollout_canary=3: asks for 3 canaries but the run targets 2 rig(s) (a, b). "
            "Fix: set rollout_canary (or --canary) to at most 2, or widen --limit",
        ),
        (
            [],
            1,
            "rollout_canary=1: asks for 1 canaries but the run targets 0 rig(s) (none). "
            "Fix: set rollout_canary (or --canary) to at most 0, or widen --limit",
        ),
    ],
    ids=["two-rigs", "no-rig"],
)
def test_the_refusal_of_too_many_canaries_word_for_word(rigs, canary, message):
    with pytest.raises(ConfigError) as refused:
        plan_stages(rigs, canary=canary, batch=0)
    assert (refused.value.field, refused.value.value, str(refused.value)) == ("rollout_canary", canary, message)


def test_settings_agree_across_rigs_or_are_refused_and_a_flag_wins():
    same = {"rig4": section(rollout_canary=1, rollout_batch=2), "rig5": section(rollout_canary=1, rollout_batch=2)}
    assert rollout_settings(same, {}) == RolloutSettings(1, 2, "leave", True)
    differ = {**same, "rig6": section(rollout_canary=2)}
    with pytest.raises(ConfigError) as refused:
        rollout_settings(differ, {})
    assert refused.value.field == "rollout_canary" and "rig6" in str(refused.value)
    assert rollout_settings(differ, {"rollout_canary": 3, "rollout_batch": 1}).canary == 3
    with pytest.raises(ConfigError) as bad:
        rollout_settings(same, {"rollout_on_failure": "maybe"})
    assert bad.value.field == "rollout_on_failure"


@pytest.mark.parametrize(
    "name, value",
    [
        ("rollout_canary", -1),
        ("rollout_batch", 1.5),
        ("rollout_on_failure", "undo"),
        ("rollout_cache_proof", "perhaps"),
    ],
)
def test_bad_rollout_data_refused_naming_the_field(name, value):
    with pytest.raises(ConfigError) as refused:
        rig_settings({name: value}, needs_stack=False)
    assert refused.value.field == name


def test_plain_pyinfra_refuses_a_rollout_it_would_run_all_at_once():
    with pytest.raises(ConfigError) as refused:
        refuse_unbatched(section(rollout_canary=1), {})
    assert "rigkit deploy" in str(refused.value) and "rollout_canary=0" in str(refused.value)
    refuse_unbatched(section(rollout_canary=1), {rollout_plan.ROLLOUT_STEP_ENV: "canary"})  # driven by rigkit deploy
    refuse_unbatched(section(), {})  # no rollout set: deploy.py as always


def test_the_refusal_of_an_unbatched_rollout_names_the_field_the_value_and_the_fix():
    for data, field, value in [
        ({"rollout_canary": 2}, "rollout_canary", 2),
        ({"rollout_batch": 3}, "rollout_batch", 3),
        ({"rollout_canary": 1, "rollout_batch": 3}, "rollout_canary", 1),
    ]:
        with pytest.raises(ConfigError) as refused:
            refuse_unbatched(section(**data), {})
        assert (refused.value.field, refused.value.value) == (field, value)
        assert str(refused.value) == (
            f"{field}={value}: a rollout is set, and plain pyinfra deploys every rig at once (only rigkit deploy runs "
            "canaries and batches). Fix: run `rigkit deploy INVENTORY` instead, or pass --data rollout_canary=0 "
            "--data rollout_batch=0 to deploy every rig at once deliberately"
        )


def test_the_plan_in_words_and_a_fleet_value_that_differs_names_both_rigs():
    assert RolloutSettings(1, 0, "leave", True).describe() == "canary 1, the rest in one batch, on failure: leave"
    assert RolloutSettings(0, 2, "rollback", True).describe() == "canary 0, batches of 2, on failure: rollback"
    canary = next(v for v in ROLLOUT_VARIABLES if v.name == "rollout_canary")
    assert rollout_plan.fleet_value(canary, {}) == canary.default
    with pytest.raises(ConfigError) as refused:
        rollout_plan.fleet_value(canary, {"rig4": {"rollout_canary": 1}, "rig5": {"rollout_canary": 2}})
    assert (refused.value.field, refused.value.value) == ("rollout_canary", 2)
    assert refused.value.fix == "set rollout_canary once in group data, or pass it as a rigkit deploy flag"
