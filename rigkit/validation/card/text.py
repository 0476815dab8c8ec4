"""How a card writes its figures: durations, statistics, bytes, tier names, the L2 line."""

from __future__ import annotations

import math
from typing import Optional, Sequence

from rigkit.validation.card.schema import L2Report, StatModel

# The tiers a card reports, in the order it shows them, with their row titles.
# a machine fact of an endpoint known by its URL: rigkit never read its machine
NOT_READ = "not read (an endpoint known by its URL)"
TIER_TITLES = {
    "cold": "Cold (re-prefill)",
    "warm-gpu": "Warm — GPU prefix cache (immediate repeat)",
    "warm-connector": "Warm — connector tier (after GPU eviction)",
    "warm-persistent": "Warm — persistent tier (after a full down/up)",
}
TIER_ORDER = tuple(TIER_TITLES)


def fmt_seconds(value: Optional[float]) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def fmt_gain(cold_s: Optional[float], warm_s: Optional[float]) -> str:
    """TTFT gain of a warm figure over a cold one; a warm tier no faster than recomputing says so."""
    if not cold_s or not warm_s:
        return "—"
    ratio = cold_s / warm_s
    return f"~{ratio:.1f}×" if ratio > 1 else f"no gain ({ratio:.2f}×: no faster than recomputing)"


def fmt_stat_seconds(stat: StatModel) -> str:
    if not stat.n:
        return "— (n=0)"
    return f"{fmt_seconds(stat.mean)} (n={stat.n}, CV {100 * (stat.cv or 0):.1f}%)"


def fmt_stat_plain(stat: StatModel, unit: str = "") -> str:
    if not stat.n:
        return "— (n=0)"
    return f"{stat.mean:.1f}{unit} (n={stat.n}, CV {100 * (stat.cv or 0):.1f}%)"


def fmt_bytes(value: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{value:.0f} B"
        value /= 1000
    return f"{value:.1f} TB"


L2_MARKS = {"ok": "✓", "warn": "⚠", "fail": "✗"}


def fmt_l2(l2: L2Report) -> str:
    """The card's one "L2" line: the filesystem, the store against its budget, the janitor, the verdict."""

    def known(value: Optional[int]) -> str:
        return fmt_bytes(value) if value is not None else "?"

    parts = [
        f"{l2.mount or l2.path} {known(l2.fs_size_bytes)}, {known(l2.fs_free_bytes)} free "
        f"(floor {fmt_bytes(l2.min_free_bytes)})",
        f"store {known(l2.store_bytes)} of budget {fmt_bytes(l2.budget_bytes)}",
    ]
    if l2.janitor is not None:
        janitor = f"janitor {l2.janitor}" + (f" ({l2.janitor_state})" if l2.janitor_state else "")
        if l2.evicted_entries:
            janitor += f", evicted {l2.evicted_entries} entries ({fmt_bytes(l2.evicted_bytes)}) since it started"
        parts.append(janitor)
    return f"**L2**: {' · '.join(parts)} — {l2.state.upper()} {L2_MARKS[l2.level]}"


def fmt_power_limit_declared(watts: Optional[float]) -> str:
    return f"{watts:g} W" if watts is not None else "none (the cards' default)"


def fmt_power_limits(watts: Sequence[Optional[float]]) -> str:
    """Each GPU's enforced limit ("260 W" when every GPU enforces the same, else "GPU 0 260 W, GPU 1 700 W")."""
    if not watts:
        return "—"
    shown = [f"{w:g} W" if w is not None else "not reported" for w in watts]
    return shown[0] if len(set(shown)) == 1 else ", ".join(f"GPU {i} {w}" for i, w in enumerate(shown))
