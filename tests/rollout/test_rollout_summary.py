"""rigkit.rollout.summary: the words printed after a rollout, fitted to the terminal."""

from __future__ import annotations

import pytest
from test_rollout_run import OLD, ROLLED_BACK

from rigkit.fleet import outcome as fleet_outcome
from rigkit.rollout.plan import RolloutSettings, plan_stages
from rigkit.rollout.proof import Proof
from rigkit.rollout.stage import StageResult, StageWork, stage_failures
from rigkit.rollout.state import ReleaseState
from rigkit.rollout.summary import format_summary, summary_width
from rigkit.serving.ledger import Release


@pytest.mark.parametrize("width", [80, 120])
def test_the_summary_names_batch_rig_step_and_why_and_fits_the_terminal(width):
    outcomes = fleet_outcome.summarize(ROLLED_BACK, ["rig4"])
    stages = plan_stages(["rig5", "rig4", "rig6"], canary=1, batch=1)
    failure = stage_failures(StageWork(("rig4",), (), ()), outcomes, {"rig4": ReleaseState("old")}, {"rig4": "new"}, {})
    results = [
        StageResult(stages[0], StageWork(("rig5",), ("rig5",), ()), {"rig5": Proof(True, "cache proof passed")}),
        StageResult(stages[1], StageWork(("rig4",), (), ()), failures=failure),
    ]
    states = {rig: ReleaseState("h", Release(OLD, "cpu-lab", "k", smoke="pass")) for rig in ["rig4", "rig5", "rig6"]}
    text = format_summary(
        RolloutSettings(1, 1, "leave", True),
        stages,
        results,
        states,
        left=[("rig5", "left on the new release (rollout_on_failure=leave)")],
        width=width,
    )
    assert max(len(line) for line in text.splitlines()) <= width, text
    flat = " ".join(text.split())
    assert "HALTED in batch 1 (2 of 3)" in flat
    assert 'rig4 failed at step "serving | Smoke, ledger, prune": ' in flat and "never became ready" in flat
    assert "batch 2 (3/3): rig6: not reached, untouched" in flat
    assert "rig5: left on the new release" in flat and "run the same command again" in flat
    assert summary_width(300) == 120 and summary_width(40) == 80
