"""rigkit.rollout.stage: what each stage still has to do, which rigs halt the rollout and why, and the rollback
knob after a halt, as plain functions over the rigs' states (a failed run: real captured pyinfra output)."""

from __future__ import annotations

from test_rollout_run import NEW, OLD, ROLLED_BACK

from rigkit.fleet import outcome as fleet_outcome
from rigkit.rollout.plan import CANARY, Stage
from rigkit.rollout.proof import Proof
from rigkit.rollout.record import RolloutRecord
from rigkit.rollout.stage import StageWork, rollback_choice, rolled_back_words, stage_failures, stage_work
from rigkit.rollout.state import ReleaseState


def test_a_resumed_rollout_neither_redeploys_nor_reproves_a_canary_that_passed():
    wanted = {"rig4": "new4", "rig5": "new5", "rig6": "new6"}
    canary, batch = Stage(CANARY, ("rig4",)), Stage("batch 1", ("rig5", "rig6"))
    # killed after the canary's deploy, before its proof: proof only
    states = {"rig4": ReleaseState("new4"), "rig5": ReleaseState("new5"), "rig6": ReleaseState("old6")}
    assert stage_work(canary, states, wanted, proven=[]) == StageWork((), ("rig4",), ("rig4",))
    assert stage_work(canary, states, wanted, proven=["rig4"]) == StageWork((), (), ("rig4",))
    assert stage_work(canary, states, wanted, ["rig4"], recheck_canaries=True) == StageWork(("rig4",), ("rig4",), ())
    # a canary rolled back since it passed is deployed and proven again
    back = {**states, "rig4": ReleaseState("old4")}
    assert stage_work(canary, back, wanted, proven=["rig4"]) == StageWork(("rig4",), ("rig4",), ())
    assert stage_work(canary, back, wanted, [], cache_proof=False).prove == ()
    # a batch: only the rigs not on their wanted rendering
    assert stage_work(batch, states, wanted, proven=[]) == StageWork(("rig6",), (), ("rig5",))


def test_a_failed_rig_a_rig_off_its_release_and_a_failed_proof_each_halt():
    outcomes = fleet_outcome.summarize(ROLLED_BACK, ["rig4"])
    wanted = {"rig4": "new4", "rig5": "new5", "rig6": "new6"}
    states = {"rig4": ReleaseState("old4"), "rig5": ReleaseState("other"), "rig6": ReleaseState("new6")}
    work = StageWork(("rig4", "rig5"), ("rig6",), ())
    failures = stage_failures(
        work,
        {**outcomes, "rig5": fleet_outcome.RigOutcome("rig5")},
        states,
        wanted,
        {"rig6": Proof(False, "warm-connector expected, measured cold")},
    )
    assert [(f.rig, f.step) for f in failures] == [
        ("rig4", "serving | Smoke, ledger, prune"),
        ("rig5", "verify"),
        ("rig6", "cache proof"),
    ]
    assert "rolled back to" in failures[0].why and "does not run the wanted rendering" in failures[1].why
    assert (
        stage_failures(
            work,
            {"rig4": fleet_outcome.RigOutcome("rig4"), "rig5": fleet_outcome.RigOutcome("rig5")},
            {r: ReleaseState(h) for r, h in wanted.items()},
            wanted,
            {"rig6": Proof(True, "ok")},
        )
        == []
    )


def test_the_rollback_knob_acts_on_the_rigs_this_rollout_upgraded_only():
    wanted = {"rig4": "new4", "rig5": "new5", "rig6": "new6"}
    record = RolloutRecord(
        "t",
        "inv.py",
        before={
            "rig4": {"rendering": "old4", "image": OLD},
            "rig5": {"rendering": "", "image": ""},
            "rig6": {"rendering": "new6", "image": NEW},
        },
        upgraded=["rig4", "rig5"],
    )
    states = {rig: ReleaseState(hash_) for rig, hash_ in wanted.items()}
    assert rollback_choice("leave", record, states, wanted)[0] == []
    roll_back, left = rollback_choice("rollback", record, states, wanted)
    assert roll_back == ["rig4"] and [rig for rig, _ in left] == ["rig5", "rig6"]  # rig6 was on it before
    assert "record began" in dict(left)["rig6"]
    back, words = rolled_back_words("rig4", record, ReleaseState("old4"))
    assert back and "as before the rollout" in words
    back, words = rolled_back_words("rig4", record, ReleaseState("new4"))
    assert not back and f"rollback_to={OLD}" in words


def test_the_words_of_each_halt_and_each_rig_left_or_not_back():
    # the summary prints these words as they are: what the mutation check (bench/mutation.py) found unheld
    wanted = {"rig4": "new4", "rig5": "new5" * 4, "rig6": "new6"}
    states = {"rig4": ReleaseState(""), "rig5": ReleaseState("other" * 4), "rig6": ReleaseState("new6")}
    work = StageWork(("rig4", "rig5"), ("rig6",), ())
    failures = stage_failures(work, {}, states, wanted, {"rig6": Proof(False, "warm-gpu: not measured")})
    assert [f.why for f in failures] == [
        "its deploy reported success but the rig does not run the wanted rendering (verified none)",
        "its deploy reported success but the rig does not run the wanted rendering (verified otherotherot)",
        "cache proof failed: warm-gpu: not measured",
    ]
    record = RolloutRecord(
        "t",
        "inv.py",
        before={
            "rig4": {"rendering": "old4" * 16, "image": OLD},
            "rig5": {"rendering": "", "image": ""},
            "rig6": {"rendering": "new6", "image": NEW},
        },
        upgraded=["rig4", "rig5"],
    )
    on = {rig: ReleaseState(hash_) for rig, hash_ in wanted.items()}
    roll_back, left = rollback_choice("rollback", record, on, wanted)
    assert roll_back == ["rig4"] and left == [
        ("rig5", "left on the new release: it ran no verified release before this rollout"),
        (
            "rig6",
            "left on the new release: it ran it already when this rollout's record began (roll it back by hand "
            "if this rollout upgraded it)",
        ),
    ]
    for state, now in [
        (ReleaseState(unreadable="ssh: connection refused"), "ssh: connection refused"),
        (ReleaseState(""), "no verified rendering"),
    ]:
        back, words = rolled_back_words("rig4", record, state)
        assert not back and words == (
            f"rig4: NOT back on its release from before the rollout ({OLD}, rendering "
            f"old4old4old4): now {now}; roll it back by hand: pyinfra -y INVENTORY "
            f"rollback.py --limit rig4 --data rollback_to={OLD}"
        )


def test_a_rig_on_the_new_release_before_the_record_but_not_read_now_is_not_said_to_be_on_it():
    # rig7: in the record and the wanted renderings, but no state read for it in this run (its state unknown)
    wanted = {"rig4": "new4", "rig7": "new7"}
    record = RolloutRecord(
        "t",
        "inv.py",
        before={"rig4": {"rendering": "old4", "image": OLD}, "rig7": {"rendering": "new7", "image": NEW}},
        upgraded=["rig4"],
    )
    assert rollback_choice("rollback", record, {"rig4": ReleaseState("new4")}, wanted) == (["rig4"], [])
