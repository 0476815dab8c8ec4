"""The warm-shared tier on the cards: one row per ordered pair of rigs (prefilled on A, asked of B, labelled by
B's counters), on B's rig card and, for every pair of the run, on the fleet card."""

from __future__ import annotations

from typing import Optional, Sequence

from rigkit.validation.card.schema import RigCard, SharedPair, StatModel
from rigkit.validation.card.text import fmt_gain, fmt_stat_seconds

# A failed pair's greedy outputs are cut to this many characters in its failure line (the JSON keeps them whole).
CLIPPED_CHARS = 60
HEADER = [
    "| A → B | label (B's counters) | B's metric proof | TTFT on B (client) | B cold | vs cold | greedy vs A |",
    "|---|---|---|---|---|---|---|",
]
LEGEND = (
    "Each pair: fresh salted prompts prefilled on A (cold by A's counters), then asked of B; labelled by B's "
    "own /metrics window: warm-shared when B's GPU prefix hits stayed flat and its external hits grew, "
    "retrieved-but-unused when nothing hit, not-shared when B's own GPU pool served (B already had them); "
    "served-but-wrong when B's greedy output differs from A's."
)


def cold_on(rig: str, cards: Sequence[RigCard]) -> tuple[Optional[StatModel], str]:
    """B's cold TTFT and where it comes from: B's own prefills for the other rigs of the run (the same salted
    sizes), else the cold tier of B's validate.py card; (None, "") when the run measured neither."""
    prefills = [t for c in cards for pair in c.shared if pair.source == rig for t in pair.prefill.ttft_s.samples]
    if prefills:
        return StatModel.of(prefills), "its prefills for the other rigs"
    card = next((c for c in cards if c.rig == rig), None)
    tier = card.tier("cold") if card else None
    if tier and tier.ttft_s.n:
        return tier.ttft_s, "its cold tier"
    return None, ""


def pair_row(pair: SharedPair, cold: Optional[StatModel], cold_source: str) -> str:
    asked = pair.asked
    mark = "✓" if pair.passed else "✗"
    proof = asked.proofs[0].text if asked.proofs else "no request completed"
    if len(asked.proofs) > 1 and len(set(asked.labels)) == 1:
        proof += f" (+{len(asked.proofs) - 1} more prompts, same label)"
    if not pair.prefill.passed:
        proof += f"; ✗ the prefill on {pair.source} was labelled {pair.prefill.label}, not cold: the salt was not fresh"
    if asked.aborted:
        proof += f"; {len(asked.aborted)} aborted ({', '.join(asked.aborted)})"
    greedy = f"{sum(c.same for c in asked.greedy)}/{len(asked.greedy)} same" if asked.greedy else "—"
    cold_cell = f"{fmt_stat_seconds(cold)}, {cold_source}" if cold else "—"
    gain = fmt_gain(cold.mean if cold else None, asked.ttft_s.mean)
    return (
        f"| {pair.source} → {pair.target} | {pair.label} {mark} | {proof} | {fmt_stat_seconds(asked.ttft_s)} | "
        f"{cold_cell} | {gain} | {greedy} |"
    )


def shared_lines(pairs: Sequence[SharedPair], cards: Sequence[RigCard]) -> list[str]:
    """The warm-shared table (empty when the run measured no pair); `cards` give each B's cold figure."""
    if not pairs:
        return []
    rows = [pair_row(pair, *cold_on(pair.target, cards)) for pair in pairs]
    return ["## Warm-shared tier (prefilled on rig A, asked of rig B)", "", *HEADER, *rows, "", LEGEND, ""]


def shared_failures(card: RigCard) -> list[str]:
    """One line per failed pair: its label, and why when the counters alone do not say it."""
    failures = []
    for pair in card.shared:
        if pair.passed:
            continue
        why = [f"its prefill on {pair.source} was labelled {pair.prefill.label}"] if not pair.prefill.passed else []
        why += [
            f"the greedy output parts from {pair.source}'s at character {check.first_difference}"
            + (
                f" where {pair.source} was {check.margin_nats:.2f} nats sure of its token"
                if check.margin_nats is not None
                else ""
            )
            + f" ({pair.source} {check.reference_text[:CLIPPED_CHARS]!r}, {pair.target} {check.text[:CLIPPED_CHARS]!r})"
            for check in pair.asked.served_but_wrong[:1]
        ]
        failures.append(
            f"warm-shared {pair.source} → {pair.target}: labelled {pair.label}"
            + (f" ({'; '.join(why)})" if why else "")
        )
    return failures
