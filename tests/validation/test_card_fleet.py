"""rigkit.validation.card.fleet: the fleet card puts the rigs side by side with their spread, and says when they differ."""

from card_samples import make_card
from rigkit.validation.card.fleet import render_fleet_markdown


def test_fleet_card_puts_rigs_side_by_side_with_spread():
    md = render_fleet_markdown([make_card("rig1"), make_card("rig2", cold=(2.0, 2.2, 1.8))])
    assert "| | rig1 | rig2 | spread (min–max, CV) |" in md
    assert "| TTFT cold (s) | 1.000 | 2.000 | 1–2 (CV 47.1%) |" in md
    assert "2/2 rigs pass." in md
    assert "Not like for like" not in md


def test_fleet_card_warns_when_rigs_ran_different_prompts():
    md = render_fleet_markdown([make_card("rig1", seed=1), make_card("rig2", seed=2)])
    assert "Not like for like" in md
