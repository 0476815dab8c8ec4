import json

import pytest
import yaml

from rigkit.serving.ledger import SMOKE_FAIL, SMOKE_PASS, Ledger, Release, Rendering, now_iso, rendering_dir
from rigkit.serving.render import SERVICE_NAME

A = "127.0.0.1:5000/x@sha256:" + "a" * 64
B = "127.0.0.1:5000/x@sha256:" + "b" * 64
C = "127.0.0.1:5000/x@sha256:" + "c" * 64


def ledger_of(*entries):
    ledger = Ledger()
    for image, verdict in entries:
        ledger.record(Release(image=image, profile="cpu-lab", knobs_hash="h"))
        if verdict:
            ledger.record_smoke(verdict)
    return ledger


def test_round_trip_keeps_every_field():
    ledger = ledger_of((A, SMOKE_PASS), (B, SMOKE_FAIL))
    again = Ledger.from_json(ledger.to_json())
    assert again == ledger
    assert json.loads(ledger.to_json())["schema"] == 1


def test_empty_file_is_an_empty_ledger():
    assert Ledger.from_json("").releases == []
    assert Ledger.from_json(None).current is None


def test_unknown_schema_is_refused():
    with pytest.raises(ValueError, match="schema"):
        Ledger.from_json('{"schema": 99, "releases": []}')


def test_last_known_good_skips_failed_and_unchecked_releases():
    ledger = ledger_of((A, SMOKE_PASS), (B, SMOKE_FAIL), (C, None))
    assert ledger.last_known_good().image == A


def test_last_known_good_can_exclude_the_current_image():
    ledger = ledger_of((A, SMOKE_PASS), (B, SMOKE_PASS))
    assert ledger.last_known_good(exclude_image=B).image == A


def test_prune_keeps_newest_and_last_known_good():
    ledger = ledger_of((A, SMOKE_PASS), (B, SMOKE_FAIL), (C, SMOKE_FAIL))
    assert ledger.images_to_keep(2) == [C, B, A]
    assert ledger.images_to_prune(2) == []
    ledger = ledger_of((A, SMOKE_PASS), (B, SMOKE_PASS), (C, SMOKE_PASS))
    assert ledger.images_to_prune(2) == [A]


def test_smoke_without_release_is_an_error():
    with pytest.raises(ValueError):
        Ledger().record_smoke(SMOKE_PASS)


R1, R2, R3 = ("1" * 64, "2" * 64, "3" * 64)


def entry(image, rendering, verdict, kind="deploy", model=None):
    release = Release(image=image, profile="cpu-lab", knobs_hash="h", kind=kind, rendering=rendering, model=model)
    release.smoke = verdict
    return release


def test_old_ledger_without_renderings_still_reads_and_round_trips():
    old = (
        '{"schema": 1, "releases": [{"image": "%s", "profile": "cpu-lab", "knobs_hash": "h", '
        '"deployed_at": "2026-01-01T00:00:00+00:00", "smoke": "pass", "kind": "deploy", "note": ""}]}' % A
    )
    ledger = Ledger.from_json(old)
    assert ledger.current.rendering is None
    assert Ledger.from_json(ledger.to_json()) == ledger
    ledger.record(entry(B, R2, SMOKE_PASS))
    assert json.loads(ledger.to_json())["releases"][-1]["rendering"] == R2


def test_rollback_target_is_the_verified_release_before_the_latest_deploy():
    ledger = Ledger([entry(A, R1, SMOKE_PASS), entry(B, R2, SMOKE_PASS)])
    assert ledger.rollback_target().rendering == R1


def test_rollback_target_does_not_move_after_the_rollback():
    # a second rollback.py run must find the rig already there (No Change), not roll "back" to B
    ledger = Ledger([entry(A, R1, SMOKE_PASS), entry(B, R2, SMOKE_PASS), entry(A, R1, SMOKE_PASS, kind="rollback")])
    assert ledger.rollback_target().rendering == R1


def test_rollback_target_undoes_a_knob_only_deploy_of_the_same_image():
    ledger = Ledger([entry(A, R1, SMOKE_PASS), entry(A, R2, SMOKE_PASS)])
    assert ledger.rollback_target().rendering == R1
    assert ledger.last_known_good(other_than=ledger.current).rendering == R1


def test_rollback_target_by_image_when_renderings_are_unknown():
    # an entry from an old ledger: same image means same release (its rendering cannot be told apart)
    ledger = Ledger([entry(A, None, SMOKE_PASS), entry(A, R2, SMOKE_PASS)])
    assert ledger.rollback_target() is None
    ledger = Ledger([entry(A, None, SMOKE_PASS), entry(B, R2, SMOKE_PASS)])
    assert ledger.rollback_target().image == A
    assert Ledger([entry(A, R1, SMOKE_PASS)]).rollback_target() is None
    assert Ledger().rollback_target() is None


def test_newest_of_image_prefers_a_verified_entry():
    ledger = Ledger([entry(A, R1, SMOKE_PASS), entry(B, R2, SMOKE_PASS), entry(A, R3, SMOKE_FAIL)])
    assert ledger.newest_of_image(A).rendering == R1
    assert Ledger([entry(A, R3, SMOKE_FAIL)]).newest_of_image(A).rendering == R3
    assert ledger.newest_of_image(C) is None


def test_prune_renderings_keeps_newest_current_and_last_known_good():
    ledger = Ledger([entry(A, R1, SMOKE_PASS), entry(B, R2, SMOKE_FAIL), entry(C, R3, SMOKE_FAIL)])
    assert ledger.renderings_to_keep(1) == [R3, R1]  # newest (current) + last known-good
    assert ledger.renderings_to_prune(1) == [R2]
    ledger = Ledger([entry(A, R1, SMOKE_PASS), entry(B, R2, SMOKE_PASS), entry(C, R3, SMOKE_PASS)])
    assert ledger.renderings_to_prune(2) == [R1]
    assert ledger.images_to_prune(2) == [A]


def test_prune_never_drops_the_rollback_target():
    # keep 1: the current release and the one rollback.py would restore both stay, image and rendering
    ledger = Ledger([entry(A, R1, SMOKE_PASS), entry(B, R2, SMOKE_PASS)])
    assert ledger.renderings_to_prune(1) == [] and ledger.images_to_prune(1) == []
    ledger.record(entry(C, R3, SMOKE_PASS))
    assert ledger.renderings_to_prune(1) == [R1] and ledger.images_to_prune(1) == [A]


def test_prune_ignores_entries_without_a_rendering():
    ledger = Ledger([entry(A, None, SMOKE_PASS), entry(B, R2, SMOKE_PASS), entry(C, R3, SMOKE_PASS)])
    assert ledger.renderings_to_prune(1) == []


# --- what the mutation check (bench/mutation.py) found no test holding ---------------------------------------

R4 = "4" * 64


def test_prune_keeps_the_newest_renderings_beyond_the_always_kept_ones():
    ledger = Ledger(
        [entry(A, R1, SMOKE_PASS), entry(A, R2, SMOKE_PASS), entry(A, R3, SMOKE_PASS), entry(A, R4, SMOKE_PASS)]
    )
    # current and last known-good R4, rollback target R3; keep 3 keeps R2 too
    assert ledger.renderings_to_keep(3) == [R4, R3, R2] and ledger.renderings_to_prune(3) == [R1]


def test_the_ledger_file_is_sorted_two_space_json_ending_in_a_newline_and_reads_without_releases():
    text = Ledger([entry(A, R1, SMOKE_PASS)]).to_json()
    assert text.startswith('{\n  "releases": [\n    {\n      "deployed_at": ') and text.endswith('"schema": 1\n}\n')
    assert Ledger.from_json('{"schema": 1}') == Ledger()
    with pytest.raises(ValueError, match="ledger schema 2 is not 1"):
        Ledger.from_json('{"schema": 2}')
    with pytest.raises(ValueError, match="no release to attach a smoke verdict to"):
        Ledger().record_smoke(SMOKE_PASS)
    with pytest.raises(ValueError, match="not a release hash: None"):
        rendering_dir(None)


def test_a_release_in_one_line_and_its_time_in_utc():
    assert Release(image=A, profile="cpu-lab", knobs_hash="h").summary() == "aaaaaaaaaaaa deploy smoke=-"
    assert now_iso().endswith("+00:00")


def test_the_container_env_of_a_rendering_as_compose_gives_it():
    compose = yaml.safe_dump(
        {
            "services": {
                SERVICE_NAME: {
                    "image": A,
                    "environment": ["SET=${SET:-}", "UNSET=${UNSET:-}", "LITERAL=a=b", "DOLLARS=x$$y"],
                }
            }
        }
    )
    rendering = Rendering(compose, "SET='from .env'\n")
    assert rendering.container_env() == {"SET": "from .env", "UNSET": "", "LITERAL": "a=b", "DOLLARS": "x$y"}


def test_a_smoke_verdict_without_a_release_says_so_in_full():
    with pytest.raises(ValueError) as refused:
        Ledger().record_smoke(SMOKE_FAIL, "a note")
    assert str(refused.value) == "no release to attach a smoke verdict to"


def test_a_smoke_verdict_without_a_note_keeps_the_releases_note():
    ledger = Ledger([Release(image=A, profile="cpu-lab", knobs_hash="h", note="re-rendered with today's data")])
    ledger.record_smoke(SMOKE_PASS)
    assert (ledger.current.smoke, ledger.current.note) == (SMOKE_PASS, "re-rendered with today's data")
    ledger.record_smoke(SMOKE_FAIL, "smoke FAIL: models")
    assert (ledger.current.smoke, ledger.current.note) == (SMOKE_FAIL, "smoke FAIL: models")


def test_the_release_a_rollback_undoes_is_the_latest_deploy_not_a_rollback_after_it():
    ledger = Ledger([entry(A, R1, SMOKE_PASS), entry(A, R2, SMOKE_FAIL), entry(A, R1, SMOKE_PASS, kind="rollback")])
    assert ledger.latest_deploy().rendering == R2
    assert Ledger().latest_deploy() is None
    ledger.record(entry(A, R3, SMOKE_FAIL))
    ledger.record(entry(A, R1, SMOKE_PASS, kind="rollback"))
    assert ledger.latest_deploy().rendering == R3  # the newest of three deploys, not the second


# A ledger whose releases mount staged models: R1 and R2 verified, R3 verified without a staged model (vLLM loads
# it), R4 current and failed. Always kept: R4 (current) and R3 (last known-good, rollback target).
STAGED = Ledger(
    [
        entry(A, R1, SMOKE_PASS, model="m@1"),
        entry(A, R2, SMOKE_PASS, model="m@2"),
        entry(A, R3, SMOKE_PASS),
        entry(A, R4, SMOKE_FAIL, model="m@4"),
    ]
)


@pytest.mark.parametrize(
    "keep,needed",
    [
        (1, ["m@4"]),  # m@1 and m@2 are the prune's to remove; R3 needs no staged model
        (2, ["m@4"]),  # the newest two renderings are the always-kept R4 and R3
        (3, ["m@2", "m@4"]),  # R2 kept by count alone
        (4, ["m@1", "m@2", "m@4"]),
    ],
)
def test_the_staged_models_a_prune_keeps_are_those_of_the_kept_renderings(keep, needed):
    assert STAGED.models_needed(keep) == needed
