"""rigkit.rollout.state: a rig's state from the state command's output (its verified rendering, its ledger)."""

from __future__ import annotations

from test_rollout_run import OLD

from rigkit.rollout.state import STATE_SEPARATOR, parse_release_state
from rigkit.serving.ledger import Ledger, Release


def test_rig_state_from_the_ledger_and_the_verified_hash():
    ledger = Ledger([Release(image=OLD, profile="cpu-lab", knobs_hash="k", smoke="pass", rendering="a" * 64)])
    state = parse_release_state("a" * 64 + "\n" + STATE_SEPARATOR + "\n" + ledger.to_json())
    assert state.verified == "a" * 64 and state.current.image == OLD
    assert state.release_words() == "111111111111 deploy smoke=pass"
    fresh = parse_release_state(STATE_SEPARATOR + "\n")
    assert fresh.verified == "" and fresh.current is None and not fresh.unreadable
    assert parse_release_state(STATE_SEPARATOR + '{"schema": 9}').unreadable
