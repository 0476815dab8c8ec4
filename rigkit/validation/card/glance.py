"""A rig card at a glance, for the terminal and the plots: per tier its client TTFT, how many times faster than
cold, the metric proof in a few words and the verdict. validate.py prints it per rig, `rigkit demo` and
`rigkit card` for every rig of a run; the Markdown card holds the whole proof."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from rigkit.validation.card.schema import RigCard, TierProof, TierResult
from rigkit.validation.card.text import TIER_ORDER, fmt_seconds


@dataclass(frozen=True)
class TierGlance:
    tier: str  # the tier the procedure expected
    ttft: str  # mean client TTFT and its sessions
    faster: str  # times faster than cold ("1×" for cold, "—" when not measured)
    proof: str  # the counters that gave the label, in a few words
    verdict: str  # "✓ <label>" or "✗ <label> (expected <tier>)"
    passed: bool


def times_faster(cold: Optional[TierResult], tier: TierResult) -> Optional[float]:
    """Cold's mean client TTFT over this tier's (None when either was not measured)."""
    if cold is None or not cold.ttft_s.n or not tier.ttft_s.n or not tier.ttft_s.mean:
        return None
    return cold.ttft_s.mean / tier.ttft_s.mean


def fmt_times_faster(ratio: Optional[float], is_cold: bool = False) -> str:
    if is_cold:
        return "1×"
    if ratio is None:
        return "—"
    return f"{ratio:.1f}×" if ratio >= 1 else f"{ratio:.2f}× (slower)"


def proof_words(proof: TierProof) -> str:
    """One request's counter deltas, shortly: which cache served how many prompt tokens."""
    gpu, external = proof.gpu_hits, proof.external_hits
    if gpu > 0 and external > 0:
        return f"GPU hits +{gpu:,.0f}, connector +{external:,.0f}"
    if gpu > 0:
        return f"GPU prefix hits +{gpu:,.0f}"
    if external > 0:
        store = f" ({proof.store_tier})" if proof.store_tier else ""
        return f"connector hits +{external:,.0f}{store}, GPU +0"
    return "no cache hit"


def tier_proof_words(tier: TierResult) -> str:
    if not tier.proofs:
        return "—"
    words = proof_words(tier.proofs[0])
    if len(set(tier.labels)) > 1:
        words += f"; sessions disagree ({'/'.join(tier.labels)})"
    return words


def tier_glance(card: RigCard, tier: TierResult) -> TierGlance:
    cold = card.tier("cold")
    stat = tier.ttft_s
    ttft = f"{fmt_seconds(stat.mean)} (n={stat.n})" if stat.n else "— (n=0)"
    label = tier.label
    wrong = tier.served_but_wrong
    if tier.passed:
        verdict = f"✓ {label}"
    elif wrong:
        verdict = f"✗ {label} (logprobs of {len(wrong)}/{len(tier.greedy)} sessions moved past its tolerance)"
    elif tier.inconclusive:
        verdict = (
            f"✗ {label}: served right inconclusive ({len(tier.inconclusive)}/{len(tier.greedy)} sessions differ, "
            "no measured band explains it)"
        )
    else:
        verdict = f"✗ {label}" + ("" if label == tier.expected else f" (expected {tier.expected})")
    return TierGlance(
        tier=tier.expected,
        ttft=ttft,
        faster=fmt_times_faster(times_faster(cold, tier), tier is cold),
        proof=tier_proof_words(tier),
        verdict=verdict,
        passed=tier.passed,
    )


def ordered_tiers(card: RigCard) -> list[TierResult]:
    return sorted(card.tiers, key=lambda t: TIER_ORDER.index(t.expected) if t.expected in TIER_ORDER else 99)


HEADER = ("tier", "TTFT (client)", "vs cold", "proof (metric deltas)", "verdict")


def glance_lines(card: RigCard, card_path: Optional[Path] = None) -> list[str]:
    """The rig's verdict line, then its tier table, aligned for a terminal."""
    where = f" — {card_path}" if card_path else ""
    head = f"{card.rig}: {'PASS' if card.passed else 'FAIL'}{where}"
    if not card.tiers:
        return [head, "  no tier measured in this run"]
    rows = [HEADER] + [
        (g.tier, g.ttft, g.faster, g.proof, g.verdict) for g in (tier_glance(card, t) for t in ordered_tiers(card))
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER) - 1)]
    lines = [head] + [
        "  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1] for row in rows
    ]
    failures = [f for f in card.failures] + (
        [f"L2: {p}" for p in card.l2.problems] if card.l2 and card.l2.level == "fail" else []
    )
    lines += [f"  ✗ {failure}" for failure in failures]
    return lines


def run_lines(cards: Sequence[RigCard], run_dir: Path) -> list[str]:
    """Every rig of a run at a glance, then where its cards are."""
    lines: list[str] = []
    for card in cards:
        lines += glance_lines(card, run_dir / f"{card.rig}.md") + [""]
    lines.append(f"run directory: {run_dir} (fleet.md, per-rig cards <rig>.md, plots *-ttft.png, JSON *.card.json)")
    return lines
