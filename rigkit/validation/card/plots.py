"""The card's PNG plots (matplotlib, headless): TTFT per tier, decode A/B."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from rigkit.validation.card.glance import times_faster
from rigkit.validation.card.schema import RigCard
from rigkit.validation.card.text import TIER_ORDER


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# Per tier: the bar's colour when its label is proven, and when it is not.
PASS_COLOUR, FAIL_COLOUR = "#4C72B0", "#C44E52"
SAMPLE_COLOUR = "black"
PANEL_COLUMNS = 3  # the fleet plot wraps its rig panels after this many
PANEL_HEIGHT, TIER_WIDTH = 4.2, 1.5  # inches: a rig panel's height, and its width per tier (tick labels fit)
TICK_LABEL_CHARS = 15  # a longer label (served-but-wrong, retrieved-but-unused) wraps after its first hyphen
HEADROOM = 1.32  # the y axis ends this far above the highest sample: room for the value labels


def _tiers_of(cards: Sequence[RigCard]) -> list[str]:
    return [t for t in TIER_ORDER if any(c.tier(t) for c in cards)]


def _top_ms(cards: Sequence[RigCard]) -> float:
    samples = [1000 * s for c in cards for t in c.tiers for s in (t.ttft_s.samples or [t.ttft_s.mean or 0.0])]
    return max(samples, default=1.0) or 1.0


def _tick_label(tier_name: str, card: RigCard) -> str:
    tier = card.tier(tier_name)
    if tier is None:
        return f"{tier_name}\n(not measured)"
    label = tier.label if len(tier.label) <= TICK_LABEL_CHARS else tier.label.replace("-", "-\n", 1)
    return f"{tier_name}\n{'✓' if tier.passed else '✗'} {label}"


def _draw_rig(ax, card: RigCard, tiers: Sequence[str], top_ms: float) -> None:
    """One rig's panel: a bar per tier at the mean client TTFT (ms, linear from 0), every session's own figure as
    a dot, the bar labelled with its mean and times faster than cold, the label its counters prove under it."""
    cold = card.tier("cold")
    for x, name in enumerate(tiers):
        tier = card.tier(name)
        if tier is None or not tier.ttft_s.n:
            continue  # its tick says "(not measured)"
        mean_ms = 1000 * (tier.ttft_s.mean or 0.0)
        samples_ms = [1000 * s for s in tier.ttft_s.samples] or [mean_ms]
        colour = PASS_COLOUR if tier.passed else FAIL_COLOUR
        ax.bar(
            x,
            mean_ms,
            0.62,
            color=colour,
            alpha=0.85,
            hatch=None if tier.passed else "//",
            edgecolor="white" if tier.passed else "black",
        )
        offsets = (
            [0.0]
            if len(samples_ms) == 1
            else [-0.18 + 0.36 * i / (len(samples_ms) - 1) for i in range(len(samples_ms))]
        )
        ax.scatter([x + o for o in offsets], samples_ms, s=14, color=SAMPLE_COLOUR, zorder=3)
        ratio = times_faster(cold, tier)
        faster = (
            "cold"
            if tier is cold
            else ("—" if ratio is None else f"{ratio:.1f}× faster" if ratio >= 1 else f"{ratio:.2f}× (slower)")
        )
        ax.text(
            x,
            max(samples_ms + [mean_ms]) + 0.03 * top_ms,
            f"{mean_ms:,.0f} ms\n{faster}",
            ha="center",
            va="bottom",
            fontsize=9,
            fontweight="bold",
        )
    ax.set_xticks(range(len(tiers)), [_tick_label(name, card) for name in tiers], fontsize=8)
    for tick, name in zip(ax.get_xticklabels(), tiers):
        tier = card.tier(name)
        tick.set_color("black" if tier is None or tier.passed else FAIL_COLOUR)
    ax.set_ylim(0, top_ms * HEADROOM)
    ax.set_xlim(-0.6, len(tiers) - 0.4)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title(
        f"{card.rig}: {'PASS' if card.passed else 'FAIL'}",
        fontsize=11,
        color="black" if card.passed else FAIL_COLOUR,
        fontweight="bold",
    )


TTFT_NOTE = (
    "bar: mean client TTFT, linear ms from 0 (the times-faster figure is a ratio of bars); dot: each "
    "session; under each tier: ✓/✗ and the label its counters prove"
)


def plot_ttft(cards: Sequence[RigCard], path: Path) -> None:
    plt = _pyplot()
    fig = ttft_figure(cards)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def ttft_figure(cards: Sequence[RigCard]):
    """TTFT per cache tier, one panel per rig (one rig: one panel), on one linear ms axis shared by every panel.

    Linear, not log: a log axis squeezes 180 ms against 25 ms into a small step and made readers read its
    scientific-notation ticks; the bars carry their values, so a warm tier short beside cold still reads."""
    plt = _pyplot()
    tiers = _tiers_of(cards)
    columns = max(1, min(PANEL_COLUMNS, len(cards)))
    rows = math.ceil(len(cards) / columns)
    width = 0.9 + TIER_WIDTH * max(2, len(tiers))
    fig, axes = plt.subplots(
        rows, columns, figsize=(width * columns, PANEL_HEIGHT * rows + 0.6), sharey=True, squeeze=False
    )
    top = _top_ms(cards)
    for index, card in enumerate(cards):
        _draw_rig(axes[index // columns][index % columns], card, tiers, top)
    for index in range(len(cards), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    for row in axes:
        row[0].set_ylabel("TTFT, client side (ms)")
    run = cards[0].run_id if cards else "?"
    passed = sum(c.passed for c in cards)
    title = (
        f"TTFT per cache tier — run {run}"
        if len(cards) == 1
        else f"TTFT per cache tier — run {run}: {passed}/{len(cards)} rigs pass"
    )
    fig.suptitle(title, fontsize=12)
    fig.text(0.5, 0.005, TTFT_NOTE, ha="center", va="bottom", fontsize=7.5, color="dimgrey", wrap=True)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def plot_decode(card: RigCard, path: Path) -> None:
    plt = _pyplot()
    ab = card.decode_ab
    assert ab is not None
    fig, ax = plt.subplots(figsize=(6, 4))
    kinds = [k.kind for k in ab.kinds]
    for offset, arm in ((-0.2, "on"), (0.2, "off")):
        stats = [getattr(k, arm) for k in ab.kinds]
        ax.bar(
            [x + offset for x in range(len(kinds))],
            [s.mean or 0 for s in stats],
            0.4,
            yerr=[(s.mean or 0) * (s.cv or 0) for s in stats],
            capsize=4,
            label=f"connector {arm.upper()}",
        )
    ax.set_xticks(range(len(kinds)), kinds)
    ax.set_ylabel("decode tok/s")
    ax.set_title(f"{card.rig}: decode A/B — {ab.verdict} (bars: CV)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
