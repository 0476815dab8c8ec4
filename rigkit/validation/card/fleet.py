"""The fleet card in Markdown: every rig of a run side by side, with the spread across rigs; a replay's fleet card
puts the recorded rigs beside them, lists the setup differences and judges each figure (rigkit.validation.card.replay)."""

from __future__ import annotations

import statistics
from typing import Optional, Sequence

from rigkit.validation.card.figures import Figure, decode_figures, hit_figures, ttft_figures
from rigkit.validation.card.pays import fleet_pays_lines
from rigkit.validation.card.replay import RULE, VERDICT_MARKS, compare, fmt_change, fmt_setup_value, recorded_title
from rigkit.validation.card.schema import FigureVerdict, ReplayComparison, RigCard, SoakReport
from rigkit.validation.card.shared import shared_lines
from rigkit.validation.card.text import L2_MARKS, TIER_ORDER, fmt_bytes


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
    parts = [
        f"retention {100 * soak.decode_retention:.0f}%" if soak.decode_retention is not None else None,
        f"{round(soak.memory_growth_mib):+,d} MiB" if soak.memory_growth_mib is not None else None,
    ]
    shown = ", ".join(p for p in parts if p)
    return ("PASS" if soak.passed else "FAIL") + (f" ({shown})" if shown else "")


def render_fleet_markdown(cards: Sequence[RigCard], recorded: Sequence[RigCard] = ()) -> str:
    """The fleet card; with `recorded` (the cards of the run this one replays) the recorded rigs stand beside the
    new ones, marked as recorded with their date, followed by the setup differences and a verdict per figure."""
    comparison = compare(recorded, cards) if recorded else None
    columns = [*recorded, *cards]
    titles = [recorded_title(c) for c in recorded] + [c.rig for c in cards]
    title = f"# Fleet card — run {cards[0].run_id if cards else '?'}"
    lines = [
        title + (f" (replay of run {comparison.recorded_run})" if comparison else ""),
        "",
        f"{sum(c.passed for c in cards)}/{len(cards)} rigs pass."
        + (f" Recorded run: {sum(c.passed for c in recorded)}/{len(recorded)} passed." if recorded else ""),
        "",
    ]
    if len({_prompt_key(c) for c in columns if c.tiers}) > 1:  # a card holding warm-shared pairs only ran no tier
        lines += [
            "⚠ Not like for like: the rigs ran different prompt sizes or seeds "
            "(replay one run's setup with `--data replay=results/<run-id>`).",
            "",
        ]
    verdicts: dict[str, list[FigureVerdict]] = {}  # figure key -> one verdict per new rig
    if comparison:
        lines += render_setup_differences(comparison)
        for verdict in comparison.figures:
            verdicts.setdefault(verdict.figure, []).append(verdict)
    extra = " replay verdict |" if comparison else ""
    lines += [
        "| | " + " | ".join(titles) + " | spread (min–max, CV) |" + extra,
        "|---|" + "---|" * (len(titles) + 1) + ("---|" if comparison else ""),
    ]
    blank = " |" if comparison else ""

    def row(title: str, values: list[Optional[float]], fmt, verdict: str = blank) -> None:
        lines.append(
            f"| {title} | "
            + " | ".join(fmt(v) if v is not None else "—" for v in values)
            + f" | {spread(values)} |"
            + verdict
        )

    def figure_row(figure: Figure) -> None:
        stats = [figure.read(c) for c in columns]
        cell = blank
        if comparison:
            cell = " " + "; ".join(verdict_cell(figure, v, len(cards) > 1) for v in verdicts[figure.key]) + " |"
        row(figure.title, [s.mean if s else None for s in stats], figure.cell, cell)

    for figure in ttft_figures(columns):
        figure_row(figure)
    for name in TIER_ORDER[1:]:
        values = []
        for c in columns:
            cold, tier = c.tier("cold"), c.tier(name)
            ok = cold and tier and cold.ttft_s.n and tier.ttft_s.n and tier.ttft_s.mean
            values.append(cold.ttft_s.mean / tier.ttft_s.mean if ok else None)
        if any(v is not None for v in values):
            row(f"{name} vs cold (×)", values, lambda v: f"{v:.1f}×")
    for figure in hit_figures(columns) + decode_figures(columns):
        figure_row(figure)
    row(
        "KB/token",
        [c.capacity.kb_per_token if c.capacity else None for c in columns],
        lambda v: f"{v:.1f}",
        " not judged (one measurement per rig, no CV) |" if comparison else "",
    )
    if any(c.l2 for c in columns):
        lines.append(
            "| L2 | "
            + " | ".join(
                f"{c.l2.state} {L2_MARKS[c.l2.level]} ({fmt_bytes(c.l2.fs_free_bytes)} free)"
                if c.l2 and c.l2.fs_free_bytes is not None
                else (f"{c.l2.state} {L2_MARKS[c.l2.level]}" if c.l2 else "—")
                for c in columns
            )
            + " | |"
            + blank
        )
    if any(c.soak for c in columns):
        lines.append(
            "| soak | " + " | ".join(fmt_soak_short(c.soak) if c.soak else "—" for c in columns) + " | |" + blank
        )
    lines.append(
        "| tier labels | " + " | ".join(", ".join(t.label for t in c.tiers) or "—" for c in columns) + " | |" + blank
    )
    lines.append("| verdict | " + " | ".join("PASS" if c.passed else "FAIL" for c in columns) + " | |" + blank)
    if comparison:
        lines += [
            "",
            f"Replay verdict: {comparison.count('reproduces')} figures reproduce, "
            f"{comparison.count('differs')} differ, {comparison.count('not compared')} not compared. "
            f'Legend: a column titled "(recorded DATE)" is a rig of run {comparison.recorded_run} as its card '
            f"recorded it on that date (kept in `recorded/` of this run's directory); {RULE}. A verdict gives "
            "this run − recorded, in the figure's unit and relative to the recorded mean, and the half-widths "
            "of both bands (`replay.json` has every number). Spread: over every column, recorded ones included.",
        ]
    lines.append("")
    lines += shared_lines(sorted((pair for c in cards for pair in c.shared), key=lambda p: (p.source, p.target)), cards)
    lines += fleet_pays_lines(cards)
    lines += ["Per-rig cards: " + ", ".join(f"[{c.rig}]({c.rig}.md)" for c in cards), ""]
    return "\n".join(lines)


def verdict_cell(figure: Figure, verdict: FigureVerdict, name_rig: bool) -> str:
    """A figure's verdict in the table: mark, word, difference, the two bands' half-widths."""
    who = f"{verdict.rig}: " if name_rig else ""
    if verdict.verdict == "not compared":
        return f"{VERDICT_MARKS[verdict.verdict]} {who}{verdict.text}"
    old, new = verdict.recorded, verdict.new
    bands = f"±{figure.amount(abs(old.mean) * (old.cv or 0))} / ±{figure.amount(abs(new.mean) * (new.cv or 0))}"
    return (
        f"{VERDICT_MARKS[verdict.verdict]} {who}{verdict.verdict} "
        f"{fmt_change(figure, verdict.delta, verdict.delta_pct)}, bands {bands}"
    )


def render_setup_differences(comparison: ReplayComparison) -> list[str]:
    """Every setting that is not the same on every rig, recorded and new, with each rig's value."""
    if not comparison.setup_differences:
        return [
            "Setup: every setting the cards record (rigkit.validation.card.replay.setup_of) is the same on every rig, "
            "recorded and new.",
            "",
        ]
    lines = [
        f"## Setup differences ({len(comparison.setup_differences)})",
        "",
        "| setting | recorded | this run |",
        "|---|---|---|",
    ]
    lines += [
        f"| {d.setting} | {fmt_setup_value(d.recorded)} | {fmt_setup_value(d.new)} |"
        for d in comparison.setup_differences
    ]
    return lines + ["", "Settings not listed are the same on every rig.", ""]
