"""rigkit.validation: replaying a recorded run's prompts, capacity from measured store growth."""

import pytest

from card_samples import make_card
from rigkit.card.store import write_card
from rigkit.validation import ValidationSettings, capacity_from, replay_data


def test_replay_repeats_the_recorded_prompts(tmp_path):
    card = make_card(seed=4242)
    card.repro.output_tokens = 32
    write_card(tmp_path, card)
    settings = ValidationSettings.from_data(replay_data(tmp_path))
    assert (settings.prompt_tokens, settings.prompt_kind, settings.seed, settings.sessions,
            settings.output_tokens) == (3500, "narrative", 4242, 1, 32)


def test_capacity_from_measured_growth_and_sessions_per_tier():
    # the user's card: 36,721 tokens -> 4.6 GB on disk; an L1 of 30 GB and an L2 of 1 TB
    capacity = capacity_from(4_600_000_000, 36_721, "L2 dir growth", {"L1 30 GB": 30 * 10**9, "L2 1 TB": 10**12},
                             [50_000, 262_144])
    assert capacity.kb_per_token == pytest.approx(125.3, abs=0.1)
    l1, l2 = capacity.tiers
    assert l1.sessions["50000"] == pytest.approx(30e9 / (4.6e9 / 36_721 * 50_000))
    assert 4 < l1.sessions["50000"] < 5 and 150 < l2.sessions["50000"] < 165
    empty = capacity_from(0, 36_721, "L2 dir growth", {}, [50_000])
    assert empty.kb_per_token is None and "no growth" in empty.source
