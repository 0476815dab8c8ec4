"""The card's PNG plots (matplotlib, headless): TTFT per tier, decode A/B."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rigkit.validation.card.schema import RigCard
from rigkit.validation.card.text import TIER_ORDER


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ttft(cards: Sequence[RigCard], path: Path) -> None:
    """Grouped bars: TTFT per tier (log scale), one group per tier, one bar per rig, CV error bars."""
    plt = _pyplot()
    tiers = [t for t in TIER_ORDER if any(c.tier(t) for c in cards)]
    fig, ax = plt.subplots(figsize=(max(6, 2 + 1.6 * len(tiers)), 4))
    width = 0.8 / max(1, len(cards))
    for i, card in enumerate(cards):
        means, errors = [], []
        for name in tiers:
            tier = card.tier(name)
            mean = tier.ttft_s.mean if tier and tier.ttft_s.n else float("nan")
            means.append(mean)
            errors.append(mean * (tier.ttft_s.cv or 0) if tier and tier.ttft_s.n else 0)
        positions = [x + (i - (len(cards) - 1) / 2) * width for x in range(len(tiers))]
        ax.bar(positions, means, width, yerr=errors, capsize=3, label=card.rig)
    ax.set_xticks(range(len(tiers)), tiers)
    ax.set_yscale("log")
    ax.set_ylabel("TTFT, client side (s)")
    ax.set_title("TTFT per cache tier (bars: CV)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_decode(card: RigCard, path: Path) -> None:
    plt = _pyplot()
    ab = card.decode_ab
    assert ab is not None
    fig, ax = plt.subplots(figsize=(6, 4))
    kinds = [k.kind for k in ab.kinds]
    for offset, arm in ((-0.2, "on"), (0.2, "off")):
        stats = [getattr(k, arm) for k in ab.kinds]
        ax.bar([x + offset for x in range(len(kinds))], [s.mean or 0 for s in stats], 0.4,
               yerr=[(s.mean or 0) * (s.cv or 0) for s in stats], capsize=4, label=f"connector {arm.upper()}")
    ax.set_xticks(range(len(kinds)), kinds)
    ax.set_ylabel("decode tok/s")
    ax.set_title(f"{card.rig}: decode A/B — {ab.verdict} (bars: CV)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

