"""The fleet card in Markdown: every rig of a run side by side, with the spread across rigs."""

from __future__ import annotations

import statistics
from typing import Optional, Sequence

from rigkit.card.schema import RigCard, SoakReport
from rigkit.card.text import L2_MARKS, TIER_ORDER, fmt_bytes


def spread(values: Sequence[Optional[float]]) -> str:
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return "—"
    low, high = min(present), max(present)
    cv = statistics.stdev(present) / statistics.fmean(present) if statistics.fmean(present) else 0.0
    return f"{low:.3g}–{high:.3g} (CV {100 * cv:.1f}%)"


def _prompt_key(card: RigCard) -> tuple:
    return tuple((p.kind, p.target_tokens, p.seed) for p in card.repro.prompts)



def fmt_soak_short(soak: SoakReport) -> str:
    """The fleet card's soak cell: verdict, decode retention, memory growth."""
    parts = [f"retention {100 * soak.decode_retention:.0f}%" if soak.decode_retention is not None else None,
             f"{round(soak.memory_growth_mib):+,d} MiB" if soak.memory_growth_mib is not None else None]
    shown = ", ".join(p for p in parts if p)
    return ("PASS" if soak.passed else "FAIL") + (f" ({shown})" if shown else "")



def render_fleet_markdown(cards: Sequence[RigCard]) -> str:
    rigs = [c.rig for c in cards]
    lines = [f"# Fleet card — run {cards[0].run_id if cards else '?'}", "",
             f"{sum(c.passed for c in cards)}/{len(cards)} rigs pass.", ""]
    if len({_prompt_key(c) for c in cards}) > 1:
        lines += ["⚠ Not like for like: the rigs ran different prompt sizes or seeds "
                  "(replay one run's setup with `--data replay=results/<run-id>`).", ""]
    lines += ["| | " + " | ".join(rigs) + " | spread (min–max, CV) |", "|---|" + "---|" * (len(rigs) + 1)]

    def row(title: str, values: list[Optional[float]], fmt) -> None:
        lines.append(f"| {title} | " + " | ".join(fmt(v) if v is not None else "—" for v in values)
                     + f" | {spread(values)} |")

    for name in TIER_ORDER:
        values = [(c.tier(name).ttft_s.mean if c.tier(name) and c.tier(name).ttft_s.n else None) for c in cards]
        if any(v is not None for v in values):
            row(f"TTFT {name} (s)", values, lambda v: f"{v:.3f}")
    for name in TIER_ORDER[1:]:
        values = []
        for c in cards:
            cold, tier = c.tier("cold"), c.tier(name)
            ok = cold and tier and cold.ttft_s.n and tier.ttft_s.n and tier.ttft_s.mean
            values.append(cold.ttft_s.mean / tier.ttft_s.mean if ok else None)
        if any(v is not None for v in values):
            row(f"{name} vs cold (×)", values, lambda v: f"{v:.1f}×")
    for kind in sorted({k.kind for c in cards if c.decode_ab for k in c.decode_ab.kinds}):
        for arm in ("on", "off"):
            values = [next((getattr(k, arm).mean for k in c.decode_ab.kinds if k.kind == kind), None)
                      if c.decode_ab else None for c in cards]
            row(f"decode {kind} {arm.upper()} (tok/s)", values, lambda v: f"{v:.1f}")
    row("KB/token", [c.capacity.kb_per_token if c.capacity else None for c in cards], lambda v: f"{v:.1f}")
    if any(c.l2 for c in cards):
        lines.append("| L2 | " + " | ".join(f"{c.l2.state} {L2_MARKS[c.l2.level]} ({fmt_bytes(c.l2.fs_free_bytes)} free)"
                                             if c.l2 and c.l2.fs_free_bytes is not None
                                             else (f"{c.l2.state} {L2_MARKS[c.l2.level]}" if c.l2 else "—")
                                             for c in cards) + " | |")
    if any(c.soak for c in cards):
        lines.append("| soak | " + " | ".join(fmt_soak_short(c.soak) if c.soak else "—" for c in cards) + " | |")
    lines.append("| tier labels | " + " | ".join(", ".join(t.label for t in c.tiers) or "—" for c in cards) + " | |")
    lines.append("| verdict | " + " | ".join("PASS" if c.passed else "FAIL" for c in cards) + " | |")
    lines += ["", "Per-rig cards: " + ", ".join(f"[{c.rig}]({c.rig}.md)" for c in cards), ""]
    return "\n".join(lines)
