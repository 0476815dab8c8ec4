"""The measured figures a fleet card sets side by side, each read from a rig card as a StatModel (mean, CV, samples):
TTFT per tier, the hits that prove each tier, decode tok/s per prompt kind and arm. A replay judges these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from rigkit.validation.card.schema import RigCard, StatModel, TierProof
from rigkit.validation.card.text import TIER_ORDER

# The counter that proves each tier, as the card's metric proof reads it: tokens served from that cache per request.
# A cold request must hit nothing, so its figure is both counters together.
PROOF_HITS: dict[str, tuple[str, Callable[[TierProof], float]]] = {
    "cold": ("GPU + external hits", lambda p: p.gpu_hits + p.external_hits),
    "warm-gpu": ("GPU prefix hits", lambda p: p.gpu_hits),
    "warm-connector": ("external hits", lambda p: p.external_hits),
    "warm-persistent": ("external hits", lambda p: p.external_hits),
}


def fmt_duration(seconds: float) -> str:
    """A TTFT difference or band: to a tenth of a millisecond (a warm tier's band is often under 1 ms)."""
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


@dataclass(frozen=True)
class Figure:
    key: str  # stable name in JSON, e.g. "ttft:cold"
    title: str  # the fleet card's row title
    cell: Callable[[float], str]  # a value in the side-by-side table
    amount: Callable[[float], str]  # a difference, with its unit
    read: Callable[[RigCard], Optional[StatModel]]


def _ttft(tier: str) -> Figure:
    def read(card: RigCard) -> Optional[StatModel]:
        result = card.tier(tier)
        return result.ttft_s if result and result.ttft_s.n else None

    return Figure(f"ttft:{tier}", f"TTFT {tier} (s)", lambda v: f"{v:.3f}", fmt_duration, read)


def _hits(tier: str) -> Figure:
    what, count = PROOF_HITS[tier]

    def read(card: RigCard) -> Optional[StatModel]:
        result = card.tier(tier)
        return StatModel.of([count(p) for p in result.proofs]) if result and result.proofs else None

    return Figure(
        f"hits:{tier}", f"{what} {tier} (tokens/request)", lambda v: f"{v:,.0f}", lambda v: f"{v:,.0f} tokens", read
    )


def _decode(kind: str, arm: str) -> Figure:
    def read(card: RigCard) -> Optional[StatModel]:
        found = next((k for k in card.decode_ab.kinds if k.kind == kind), None) if card.decode_ab else None
        return getattr(found, arm) if found and getattr(found, arm).n else None

    return Figure(
        f"decode:{kind}:{arm}",
        f"decode {kind} {arm.upper()} (tok/s)",
        lambda v: f"{v:.1f}",
        lambda v: f"{v:.1f} tok/s",
        read,
    )


def _present(figures: Sequence[Figure], cards: Sequence[RigCard]) -> list[Figure]:
    return [f for f in figures if any(f.read(c) is not None for c in cards)]


def ttft_figures(cards: Sequence[RigCard]) -> list[Figure]:
    return _present([_ttft(t) for t in TIER_ORDER], cards)


def hit_figures(cards: Sequence[RigCard]) -> list[Figure]:
    return _present([_hits(t) for t in TIER_ORDER], cards)


def decode_figures(cards: Sequence[RigCard]) -> list[Figure]:
    kinds = sorted({k.kind for c in cards if c.decode_ab for k in c.decode_ab.kinds})
    return _present([_decode(kind, arm) for kind in kinds for arm in ("on", "off")], cards)


def judged_figures(cards: Sequence[RigCard]) -> list[Figure]:
    """Every measured figure with a spread (n, CV) that a replay judges, in the fleet card's order."""
    return ttft_figures(cards) + hit_figures(cards) + decode_figures(cards)
