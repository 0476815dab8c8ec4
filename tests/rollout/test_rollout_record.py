"""rigkit.rollout.record: the local record a re-run of the same rollout continues from."""

from __future__ import annotations

from test_rollout_run import OLD

from rigkit.rollout.record import RolloutRecord, resume_record
from rigkit.rollout.state import ReleaseState
from rigkit.serving.ledger import Release


def test_the_record_of_the_same_rollout_is_kept_another_starts_afresh():
    wanted = {"rig4": "new4", "rig5": "new5"}
    states = {"rig4": ReleaseState("old4", Release(OLD, "cpu-lab", "k")), "rig5": ReleaseState("")}
    record = resume_record(None, "inv.py", wanted, states)
    assert record.before == {"rig4": {"rendering": "old4", "image": OLD}, "rig5": {"rendering": "", "image": ""}}
    record.proven, record.upgraded = ["rig4"], ["rig4"]
    moved = {"rig4": ReleaseState("new4"), "rig5": ReleaseState("")}
    again = resume_record(RolloutRecord.from_json(record.to_json()), "inv.py", wanted, moved)
    assert again.proven == ["rig4"] and again.before["rig4"]["rendering"] == "old4"  # the state before the rollout
    other = resume_record(again, "inv.py", {**wanted, "rig5": "newer5"}, moved)
    assert other.proven == [] and other.before["rig4"]["rendering"] == "new4"
    assert RolloutRecord.from_json("{damaged") is None
