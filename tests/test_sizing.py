"""Capacity sizing against the real rig's field notes (~131 KB/token in both tiers)."""

import pytest

from rigkit.sizing import capacity_line, required_mem_limit_gb, session_gb, sessions_fitting

KV = 131_000  # lmcache-mp, as in profiles.yaml


@pytest.mark.parametrize("tokens, field_notes_gb", [(50_000, 6.5), (128_000, 17), (262_144, 33)])
def test_session_sizes_match_field_notes(tokens, field_notes_gb):
    # the notes round: within 5%
    assert session_gb(tokens, KV) == pytest.approx(field_notes_gb, rel=0.05)


def test_tier_capacities_match_field_notes():
    assert sessions_fitting(30, 50_000, KV) == 4  # "L1 30 GB holds ~4 sessions of 50K"
    assert sessions_fitting(30, 262_144, KV) == 0  # "<1"
    assert sessions_fitting(50, 50_000, KV) == 7  # "~7"
    assert sessions_fitting(100, 50_000, KV) == 15  # "~15"
    assert sessions_fitting(1000, 50_000, KV) == pytest.approx(155, rel=0.03)  # "1 TB L2 ~155"
    assert sessions_fitting(1000, 262_144, KV) == pytest.approx(30, rel=0.05)  # "~30"


def test_capacity_line():
    line = capacity_line(30, 1000, KV)
    assert line.startswith("L1 30 GB: 4x50K 1x128K 0x262K | L2 1000 GB: 152x50K")
    assert line.endswith("(131 KB/token)")
    assert capacity_line(None, None, KV).startswith("no KV tier")
    assert "L1" not in capacity_line(None, 0.5, 1024)


def test_memory_limit_covers_l1_model_and_headroom():
    # the real rig: L1 60 GB with a ~30 GB model needed 110g; 70g crash-looped at L1 > 40
    assert required_mem_limit_gb(60, 30, 20) == 110
    assert required_mem_limit_gb(41, 30, 20) > 70
