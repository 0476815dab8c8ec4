import json

import pytest

from rigkit.ledger import SMOKE_FAIL, SMOKE_PASS, Ledger, Release

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
