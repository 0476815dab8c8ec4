"""rigkit.validation.card.plots: the TTFT plot reads at a glance (linear ms, values and times-faster on the bars, every session
drawn, one panel per rig, the verdict under each tier), checked on the figure matplotlib builds."""

from pathlib import Path

import pytest

from card_samples import make_card
from rigkit.validation.card.plots import plot_ttft, ttft_figure
from rigkit.validation.card.store import load_cards

LAB_RUN = Path(__file__).parents[1] / "fixtures" / "cards" / "lab-2026-12-01-1229"


def texts(ax) -> list[str]:
    return [text.get_text() for text in ax.texts]


def visible_axes(fig) -> list:
    return [ax for ax in fig.axes if ax.get_visible()]


def test_one_rig_is_one_panel_in_linear_ms_with_values_and_times_faster_on_its_bars():
    (card,) = load_cards(LAB_RUN)  # a real lab card: cold 202 ms, warm-gpu 54 ms, ...
    fig = ttft_figure([card])
    (ax,) = visible_axes(fig)
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0
    assert "(ms)" in ax.get_ylabel()
    heights = [patch.get_height() for patch in ax.patches]
    assert heights == pytest.approx([1000 * t.ttft_s.mean for t in card.tiers])
    cold, warm_gpu = card.tier("cold").ttft_s.mean, card.tier("warm-gpu").ttft_s.mean
    assert f"{1000 * cold:,.0f} ms\ncold" in texts(ax)
    assert f"{1000 * warm_gpu:,.0f} ms\n{cold / warm_gpu:.1f}× faster" in texts(ax)


def test_every_session_is_a_dot_not_an_error_bar():
    (card,) = load_cards(LAB_RUN)
    (ax,) = visible_axes(ttft_figure([card]))
    dots = [tuple(point) for collection in ax.collections for point in collection.get_offsets()]
    wanted = sorted(1000 * sample for tier in card.tiers for sample in tier.ttft_s.samples)
    assert sorted(y for _, y in dots) == pytest.approx(wanted)
    assert not any(line.get_label().startswith("_errorbar") for line in ax.lines)


def test_the_fleet_plot_has_one_panel_per_rig_on_one_shared_axis():
    cards = [make_card(f"rig{i}", cold=(1.0 + i / 10, 1.1, 0.9)) for i in range(1, 5)]
    fig = ttft_figure(cards)
    axes = visible_axes(fig)
    assert [ax.get_title() for ax in axes] == [f"rig{i}: PASS" for i in range(1, 5)]
    assert len({ax.get_ylim() for ax in axes}) == 1  # one scale: rigs compare by eye
    assert "4/4 rigs pass" in fig._suptitle.get_text()


def test_the_proofs_verdict_is_under_each_tier_and_a_failed_tier_stands_out():
    cards = [make_card("rig1"), make_card("rig2", connector_label="mixed")]
    ok, failed = visible_axes(ttft_figure(cards))
    assert [tick.get_text() for tick in ok.get_xticklabels()][2] == "warm-connector\n✓ warm-connector"
    tick = [tick for tick in failed.get_xticklabels()][2]
    assert tick.get_text() == "warm-connector\n✗ mixed"
    assert tick.get_color() != "black"
    assert failed.get_title() == "rig2: FAIL"
    assert failed.patches[2].get_hatch() == "//" and ok.patches[2].get_hatch() is None


def test_a_tier_a_rig_did_not_measure_says_so(tmp_path):
    short = make_card("rig2")
    short.tiers = short.tiers[:3]
    fig = ttft_figure([make_card("rig1"), short])
    ticks = [tick.get_text() for tick in visible_axes(fig)[1].get_xticklabels()]
    assert ticks[3] == "warm-persistent\n(not measured)"
    plot_ttft([make_card("rig1"), short], tmp_path / "fleet-ttft.png")
    assert (tmp_path / "fleet-ttft.png").read_bytes()[:4] == b"\x89PNG"
