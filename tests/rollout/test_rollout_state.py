"""rigkit.rollout.state: a rig's state from the state command's output (its verified rendering, its ledger)."""

from __future__ import annotations

import pytest
from test_rollout_run import OLD

from rigkit.errors import ConfigError
from rigkit.rollout.state import STATE_SEPARATOR, ReleaseState, parse_release_state, refuse_unreadable
from rigkit.serving.ledger import Ledger, Release


def test_rig_state_from_the_ledger_and_the_verified_hash():
    ledger = Ledger([Release(image=OLD, profile="cpu-lab", knobs_hash="k", smoke="pass", rendering="a" * 64)])
    state = parse_release_state("a" * 64 + "\n" + STATE_SEPARATOR + "\n" + ledger.to_json())
    assert state.verified == "a" * 64 and state.current.image == OLD
    assert state.release_words() == "111111111111 deploy smoke=pass"
    fresh = parse_release_state(STATE_SEPARATOR + "\n")
    assert fresh.verified == "" and fresh.current is None and not fresh.unreadable
    assert parse_release_state(STATE_SEPARATOR + '{"schema": 9}').unreadable


# --- what the mutation check (bench/mutation.py) found no test holding ---------------------------------------


def test_an_unreadable_rig_in_words_and_fields():
    silent = parse_release_state("")
    assert silent == ReleaseState(unreadable="the state command printed nothing")
    assert silent.release_words() == "unreadable (the state command printed nothing)"
    assert ReleaseState().release_words() == "no release"
    # a ledger that does not parse keeps the verified hash read before it, and says why
    garbled = parse_release_state(" " + "b" * 64 + "\n" + STATE_SEPARATOR + '\n{"schema": 9}')
    assert garbled.verified == "b" * 64 and garbled.current is None
    assert garbled.unreadable == "its ledger does not parse: ledger schema 9 is not 1"
    broken = parse_release_state(STATE_SEPARATOR + "\n{not json")
    assert broken.unreadable.startswith("its ledger does not parse: Expecting property name")
    # a release entry with a field the ledger does not know is a TypeError: unreadable too, not a crash
    alien = parse_release_state(STATE_SEPARATOR + '{"schema": 1, "releases": [{"image": "x", "alien": 1}]}')
    assert alien.unreadable.startswith("its ledger does not parse: ") and "alien" in alien.unreadable
    # the hash is stripped; the separator splits at its first occurrence
    state = parse_release_state("c" * 64 + "  \n" + STATE_SEPARATOR + "\n")
    assert state == ReleaseState(verified="c" * 64)


def test_an_unreadable_rig_refuses_the_rollout_naming_the_first_and_every_one():
    good = ReleaseState(verified="a" * 64)
    states = {"rig1": good, "rig2": ReleaseState(unreadable="timed out"), "rig3": ReleaseState(unreadable="refused")}
    with pytest.raises(ConfigError) as refused:
        refuse_unreadable(states)
    error = refused.value
    assert (error.field, error.value) == ("rig2", "timed out")
    assert error.problem == "cannot be read before the rollout starts (it would fail in its batch)"
    assert error.fix == "bring rig2, rig3 back, or leave it out with --limit"
    readable = {"rig1": good}
    assert refuse_unreadable(readable) is readable


def test_the_state_splits_at_the_first_separator_a_ledger_note_may_hold_another():
    note = f"smoke output quoted: {STATE_SEPARATOR}"
    ledger = Ledger([Release(image=OLD, profile="cpu-lab", knobs_hash="k", smoke="pass", note=note)])
    state = parse_release_state("a" * 64 + "\n" + STATE_SEPARATOR + "\n" + ledger.to_json())
    assert state.verified == "a" * 64 and state.current.note == note and not state.unreadable
