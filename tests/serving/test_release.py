"""rigkit.serving.release: what follows a release, decided from plain values (ledger, outcome, smoke report, stored
texts), on real renderings of the cpu-lab profile. The same decisions carried out on a fake rig are in
tests/serving/test_ledger_after_release.py; on real rigs in tests/lab (test_fleet_lab, test_rollback_rendering_lab).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest

from rigkit.serving.commands import rendering_for
from rigkit.serving.ledger import SMOKE_FAIL, SMOKE_PASS, Ledger, Release
from rigkit.serving.release import (
    FIX_NOT_RE_RENDERED,
    FIX_NOT_ROLLED_BACK,
    FIX_ROLLBACK_FAILED,
    FIX_ROLLED_BACK,
    NOTE_TAIL_CHARS,
    ROLLBACK_FAILED_NOTE_CHARS,
    Outcome,
    Prune,
    RecordHash,
    Refuse,
    Restore,
    RollBack,
    StoreRendering,
    WriteLedger,
    entry_of,
    judge_release,
    judge_rollback,
    never_ready,
    restore,
    roll_back_or_refuse,
    rollback_target,
)
from rigkit.serving.smoke import SmokeCheck, SmokeReport
from rigkit.settings.hostdata import settings_for_host

IMAGE_1 = "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64
IMAGE_2 = "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "2" * 64
DATA = {"serving_profile": "cpu-lab", "serving_image": IMAGE_1, "gpus": 0}
PASSED = Outcome(ready=True, smoke=SmokeReport([SmokeCheck("fake", True)]))
SMOKE_FAILED = Outcome(ready=True, smoke=SmokeReport([SmokeCheck("models", False, "tiny not listed")]))


def rendering(image: str, served_name: str):
    return rendering_for(settings_for_host({**DATA, "serving_image": image, "served_model_name": served_name}))


GOOD, BROKEN = rendering(IMAGE_1, "tiny-a"), rendering(IMAGE_2, "tiny-b")


def verified(*renderings) -> Ledger:
    ledger = Ledger()
    for r in renderings:
        ledger.record(Release(image=r.image, profile=r.profile, knobs_hash=r.knobs_hash, rendering=r.hash))
        ledger.record_smoke(SMOKE_PASS)
    return ledger


def kinds(steps) -> list[str]:
    return [type(step).__name__ for step in steps]


def test_a_release_that_never_becomes_ready_is_failed_and_rolled_back_to_the_stored_rendering():
    wait_output = [f"waiting {i}" for i in range(20)] + ["rigkit-serving exited: config.json not found"]
    plan = judge_release(verified(GOOD), BROKEN, "deploy", "", never_ready(wait_output), keep_images=2)
    # recorded as failed, nothing stored or marked as verified
    assert plan.steps == [WriteLedger(plan.ledger.to_json())]
    failed = plan.failed
    assert (failed.image, failed.kind, failed.smoke, failed.rendering) == (IMAGE_2, "deploy", SMOKE_FAIL, BROKEN.hash)
    assert failed.note.startswith("release never became ready: ") and "config.json not found" in failed.note
    # the rollback goes to the verified release, exactly as stored
    target = rollback_target(plan, auto_rollback=True)
    assert target.rendering == GOOD.hash
    restored = restore(target, (GOOD.compose, GOOD.env), todays=None)
    decision = roll_back_or_refuse(failed, "deploy", True, target, restored)
    assert decision == RollBack(
        target, GOOD, f"automatic: deploy of {IMAGE_2} failed; restored the verified rendering {GOOD.hash[:12]}"
    )
    after = judge_rollback(plan.ledger, failed, "deploy", decision, PASSED)
    assert kinds(after.steps) == ["StoreRendering", "WriteLedger", "RecordHash", "Refuse"]
    assert after.steps[0] == StoreRendering(GOOD) and after.steps[2] == RecordHash(GOOD.hash)
    assert after.steps[1] == WriteLedger(after.ledger.to_json())
    entries = [(r.image, r.kind, r.smoke) for r in after.ledger.releases]
    assert entries == [
        (IMAGE_1, "deploy", SMOKE_PASS),
        (IMAGE_2, "deploy", SMOKE_FAIL),
        (IMAGE_1, "rollback", SMOKE_PASS),
    ]
    refusal = after.steps[-1]
    assert refusal.image == IMAGE_2 and f"rolled back to {IMAGE_1} (serving again)" in refusal.problem
    assert failed.note in refusal.problem


def test_never_ready_keeps_the_last_lines_of_the_wait_within_the_note_limit():
    assert never_ready(["a", "b"]).why_not_ready == "a\nb"
    assert never_ready([str(i) for i in range(20)]).why_not_ready == "\n".join(str(i) for i in range(8, 20))
    long = never_ready(["x" * 1000, "last words"]).why_not_ready
    assert len(long) == NOTE_TAIL_CHARS and long.endswith("\nlast words")
    assert never_ready(["x"]).verdict == SMOKE_FAIL


def test_a_verified_release_is_stored_before_the_ledger_names_it_and_its_hash_is_written_last():
    ledger = verified(GOOD)
    plan = judge_release(ledger, BROKEN, "deploy", "", PASSED, keep_images=1)
    assert plan.failed is None
    assert kinds(plan.steps) == ["StoreRendering", "WriteLedger", "RecordHash", "Prune"]
    assert plan.steps[0] == StoreRendering(BROKEN) and plan.steps[2] == RecordHash(BROKEN.hash)
    assert plan.ledger.current.smoke == SMOKE_PASS and plan.ledger.current.note == "smoke pass (1 checks)"
    assert plan.steps[3] == Prune(tuple(plan.ledger.images_to_prune(1)), tuple(plan.ledger.renderings_to_prune(1)))


def test_the_input_ledger_is_left_as_it_was():
    ledger = verified(GOOD)
    before = copy.deepcopy(ledger)
    judge_release(ledger, BROKEN, "deploy", "", SMOKE_FAILED, keep_images=1)
    assert ledger == before


def test_without_smoke_a_release_that_became_ready_is_recorded_unverified_and_kept():
    plan = judge_release(Ledger(), GOOD, "deploy", "a note", Outcome(ready=True), keep_images=1)
    assert kinds(plan.steps) == ["StoreRendering", "WriteLedger", "RecordHash", "Prune"]
    assert (plan.ledger.current.smoke, plan.ledger.current.note) == (None, "a note")


def test_a_failed_smoke_is_failed_with_its_summary_after_the_note():
    plan = judge_release(verified(GOOD), BROKEN, "rollback", "restored the verified rendering x", SMOKE_FAILED, 1)
    assert kinds(plan.steps) == ["WriteLedger"]
    assert (plan.failed.kind, plan.failed.smoke) == ("rollback", SMOKE_FAIL)
    assert plan.failed.note == "restored the verified rendering x; smoke FAIL: models: tiny not listed"


@pytest.mark.parametrize(
    "auto_rollback,ledger,restored,why",
    [
        (False, verified(GOOD), None, "serving_auto_rollback is off"),
        (True, Ledger(), None, "no known-good release other than this one in the ledger"),
        (True, verified(GOOD), "unrenderable", f"{IMAGE_1} has no stored rendering and cannot be rendered"),
    ],
    ids=["auto-rollback-off", "no-known-good", "nothing-to-restore"],
)
def test_a_failed_release_that_cannot_be_rolled_back_is_refused_saying_why(auto_rollback, ledger, restored, why):
    plan = judge_release(ledger, BROKEN, "deploy", "", SMOKE_FAILED, keep_images=1)
    target = rollback_target(plan, auto_rollback)
    if restored == "unrenderable":
        restored = restore(target, None, todays=None)
    decision = roll_back_or_refuse(plan.failed, "deploy", auto_rollback, target, restored)
    assert isinstance(decision, Refuse) and decision.image == IMAGE_2
    assert decision.problem.startswith(f"deploy failed, not rolled back ({why}")
    assert decision.problem.endswith(plan.failed.note) and "rollback.py --data rollback_to=" in decision.fix


def test_restore_prefers_the_stored_rendering_and_says_why_when_it_cannot():
    target = Release(image=IMAGE_1, profile="cpu-lab", knobs_hash=GOOD.knobs_hash, rendering=GOOD.hash)
    todays = rendering(IMAGE_1, "tiny-today")
    assert restore(target, (GOOD.compose, GOOD.env), todays) == Restore(
        GOOD, "restored the verified rendering " + GOOD.hash[:12]
    )
    cases = [  # the ledger's rendering hash, the stored texts, why they are not restored
        (GOOD.hash, None, "stored rendering missing"),
        (GOOD.hash, (GOOD.compose, GOOD.env + "# edited\n"), "stored rendering damaged (its files hash to "),
        (BROKEN.hash, (BROKEN.compose, BROKEN.env), f"the stored rendering {BROKEN.hash[:12]} is of {IMAGE_2}"),
    ]
    for rendering_hash, texts, why in cases:
        restored = restore(dataclasses.replace(target, rendering=rendering_hash), texts, todays)
        assert restored.rendering == todays
        assert restored.note.startswith(f"re-rendered with today's data: {why}")
        assert why in restored.warning and "may differ from what was verified" in restored.warning
    no_hash = Release(image=IMAGE_1, profile="cpu-lab", knobs_hash="", rendering=None)
    assert (
        restore(no_hash, (GOOD.compose, GOOD.env), todays).note == "re-rendered with today's data: "
        "stored rendering missing"
    )


def test_a_rollback_that_fails_too_is_recorded_and_refused_without_a_hash():
    plan = judge_release(verified(GOOD), BROKEN, "deploy", "", SMOKE_FAILED, keep_images=1)
    decision = RollBack(plan.ledger.releases[0], GOOD, "automatic: deploy failed")
    error = "`compose up -d` failed: " + "e" * 3000
    after = judge_rollback(plan.ledger, plan.failed, "deploy", decision, Outcome(ready=False, why_not_ready=error))
    assert kinds(after.steps) == ["WriteLedger", "Refuse"]
    rolled_back = after.ledger.current
    assert (rolled_back.kind, rolled_back.smoke, rolled_back.rendering) == ("rollback", SMOKE_FAIL, GOOD.hash)
    assert rolled_back.note.startswith("automatic: deploy failed; the rollback failed too: `compose up -d` failed")
    assert len(rolled_back.note) == ROLLBACK_FAILED_NOTE_CHARS
    assert f"the rollback to {IMAGE_1} failed too" in after.steps[-1].problem
    assert "docker logs rigkit-serving" in after.steps[-1].fix


def test_a_rollback_whose_smoke_fails_is_recorded_and_serving_but_not_stored_as_verified():
    plan = judge_release(verified(GOOD), BROKEN, "deploy", "", SMOKE_FAILED, keep_images=1)
    decision = RollBack(plan.ledger.releases[0], GOOD, "automatic: deploy failed")
    after = judge_rollback(plan.ledger, plan.failed, "deploy", decision, SMOKE_FAILED)
    assert kinds(after.steps) == ["WriteLedger", "RecordHash", "Refuse"]
    assert after.ledger.current.smoke == SMOKE_FAIL
    assert after.ledger.current.note == "automatic: deploy failed; smoke FAIL: models: tiny not listed"


# A release that changes only settings on the same image: the rollback goes to the previous rendering of that
# image, chosen by release (rendering), never by image (issue 29: no other test of a failed release keeps the image).
SETTINGS_ONLY = {
    "max-model-len": {"max_model_len": 4096},
    "extra-engine-args": {"extra_engine_args": ["--enable-chunked-prefill"]},
}


@pytest.mark.parametrize("earlier", [(), (IMAGE_2,)], ids=["only-this-image", "an-older-image-before-it"])
@pytest.mark.parametrize("settings", SETTINGS_ONLY.values(), ids=SETTINGS_ONLY.keys())
def test_a_settings_only_release_that_fails_is_rolled_back_to_the_previous_rendering_of_its_image(settings, earlier):
    previous = rendering(IMAGE_1, "tiny")
    changed = rendering_for(settings_for_host({**DATA, "served_model_name": "tiny", **settings}))
    assert changed.image == previous.image == IMAGE_1 and changed.hash != previous.hash
    plan = judge_release(
        verified(*[rendering(image, "tiny-old") for image in earlier], previous),
        changed,
        "deploy",
        "",
        SMOKE_FAILED,
        keep_images=1,
    )
    target = rollback_target(plan, auto_rollback=True)
    # by image, this is None (refused: "no known-good release other than this one") or the older image
    assert target is not None and (target.image, target.rendering) == (IMAGE_1, previous.hash)
    restored = restore(target, (previous.compose, previous.env), todays=changed)
    decision = roll_back_or_refuse(plan.failed, "deploy", True, target, restored)
    assert decision == RollBack(
        target, previous, f"automatic: deploy of {IMAGE_1} failed; restored the verified rendering {previous.hash[:12]}"
    )
    after = judge_rollback(plan.ledger, plan.failed, "deploy", decision, PASSED)
    assert [(r.image, r.rendering, r.smoke) for r in after.ledger.releases[-3:]] == [
        (IMAGE_1, previous.hash, SMOKE_PASS),
        (IMAGE_1, changed.hash, SMOKE_FAIL),
        (IMAGE_1, previous.hash, SMOKE_PASS),
    ]
    assert after.steps[-2] == RecordHash(previous.hash)


@pytest.mark.parametrize("settings", SETTINGS_ONLY.values(), ids=SETTINGS_ONLY.keys())
def test_a_settings_only_release_that_fails_without_its_predecessors_stored_files_is_refused_not_rolled_to_itself(
    settings,
):
    # today's data is the failed release's own: re-rendering the known-good image from it gives the failed rendering
    previous = rendering(IMAGE_1, "tiny")
    changed = rendering_for(settings_for_host({**DATA, "served_model_name": "tiny", **settings}))
    plan = judge_release(verified(previous), changed, "deploy", "", SMOKE_FAILED, keep_images=1)
    target = rollback_target(plan, auto_rollback=True)
    restored = restore(target, None, todays=changed, undone=plan.failed)
    assert restored.rendering is None and restored.warning == ""
    assert restored.refused == (
        f"the stored rendering {previous.hash[:12]} of {IMAGE_1} cannot be used (stored rendering missing) "
        "and today's data renders the release being undone itself"
    )
    decision = roll_back_or_refuse(plan.failed, "deploy", True, target, restored)
    assert decision == Refuse(
        IMAGE_1, f"deploy failed, not rolled back ({restored.refused}): {plan.failed.note}", FIX_NOT_RE_RENDERED
    )
    # a damaged stored rendering is refused the same way; today's data that renders something else still re-renders
    damaged = restore(target, (previous.compose, previous.env + "#"), todays=changed, undone=plan.failed)
    assert damaged.rendering is None and "stored rendering damaged" in damaged.refused
    assert restore(target, None, todays=previous, undone=plan.failed).rendering == previous
    # without a target the usual refusal and fix stand
    assert roll_back_or_refuse(plan.failed, "deploy", True, None, None).fix == FIX_NOT_ROLLED_BACK


# --- what the mutation check (bench/mutation.py) found no test holding ---------------------------------------


def test_without_auto_rollback_a_failed_release_has_no_rollback_target():
    plan = judge_release(verified(GOOD), BROKEN, "deploy", "", SMOKE_FAILED, keep_images=1)
    assert rollback_target(plan, auto_rollback=False) is None and rollback_target(plan, True).rendering == GOOD.hash
    assert rollback_target(judge_release(verified(GOOD), BROKEN, "deploy", "", PASSED, 1), True) is None


def test_a_rendering_that_passed_before_and_fails_now_is_no_rollback_target_of_itself():
    plan = judge_release(verified(BROKEN), BROKEN, "deploy", "", SMOKE_FAILED, keep_images=1)
    assert rollback_target(plan, auto_rollback=True) is None


def test_a_release_entry_names_its_rendering_profile_and_knobs_and_a_never_ready_note_keeps_the_callers():
    plan = judge_release(Ledger(), GOOD, "rollback", "restored x", never_ready(["died"]), keep_images=1)
    entry = plan.ledger.current
    assert (entry.image, entry.profile, entry.knobs_hash, entry.rendering, entry.kind) == (
        IMAGE_1,
        "cpu-lab",
        GOOD.knobs_hash,
        GOOD.hash,
        "rollback",
    )
    assert entry.note == "restored x; release never became ready: died"
    assert never_ready(["died"]).ready is False


def test_a_refusal_without_a_target_is_a_refusal_whatever_was_restored():
    plan = judge_release(Ledger(), BROKEN, "deploy", "", SMOKE_FAILED, keep_images=1)
    decision = roll_back_or_refuse(plan.failed, "deploy", True, None, Restore(GOOD, "restored"))
    assert isinstance(decision, Refuse) and "no known-good release other than this one" in decision.problem


def test_restore_warns_in_full_when_it_re_renders():
    target = Release(image=IMAGE_1, profile="cpu-lab", knobs_hash=GOOD.knobs_hash, rendering=GOOD.hash)
    assert restore(target, None, GOOD).warning == (
        f"rollback to {IMAGE_1}: stored rendering missing; re-rendering "
        "it with today's data, which may differ from what was verified"
    )


def test_an_automatic_rollback_leaves_the_input_ledger_and_says_what_it_refuses_with():
    plan = judge_release(verified(GOOD), BROKEN, "deploy", "", SMOKE_FAILED, keep_images=1)
    before = copy.deepcopy(plan.ledger)
    decision = RollBack(plan.ledger.releases[0], GOOD, "automatic: deploy failed")
    unsmoked = judge_rollback(plan.ledger, plan.failed, "deploy", decision, Outcome(ready=True))
    assert plan.ledger == before
    assert (unsmoked.ledger.current.note, unsmoked.ledger.current.smoke) == ("automatic: deploy failed", None)
    refusal = unsmoked.steps[-1]
    assert (refusal.image, refusal.fix) == (IMAGE_2, FIX_ROLLED_BACK)
    failed_too = judge_rollback(plan.ledger, plan.failed, "deploy", decision, Outcome(ready=False, why_not_ready="x"))
    assert failed_too.steps[0] == WriteLedger(failed_too.ledger.to_json())
    assert (failed_too.steps[-1].image, failed_too.steps[-1].fix) == (IMAGE_2, FIX_ROLLBACK_FAILED)


def test_a_release_entry_names_the_staged_model_its_rendering_mounts():
    # the ledger's model decides which staged revisions a prune keeps (Ledger.models_needed)
    source = "Qwen/Qwen3-8B@" + "c" * 40
    mounting = rendering_for(settings_for_host({**DATA, "model_source": source}))
    plan = judge_release(Ledger(), mounting, "deploy", "", PASSED, keep_images=1)
    assert plan.ledger.current.model == source and plan.ledger.models_needed(1) == [source]
    assert entry_of(mounting, "rollback", "restored").model == source and entry_of(GOOD, "deploy", "").model is None


def test_a_rollback_to_an_entry_from_before_stored_renderings_that_only_renders_the_undone_release_is_refused():
    # rollback.py --data rollback_to=IMAGE_1 on a ledger whose verified IMAGE_1 entry predates rendering hashes,
    # after a deploy of the same image from today's data failed: re-rendering would bring that failure back
    old = Release(image=IMAGE_1, profile="cpu-lab", knobs_hash=GOOD.knobs_hash, smoke=SMOKE_PASS)
    failed = entry_of(GOOD, "deploy", "smoke FAIL: models: tiny not listed")
    assert restore(old, None, todays=GOOD, undone=failed) == Restore(
        None,
        refused=f"{IMAGE_1} has no stored rendering (its ledger entry predates them) and today's data renders the "
        "release being undone itself",
    )
