"""The card's "⑤ Does the tier pay?" section, its plot (TTFT against context length) and the fleet card's rows
(rigkit.validation.pays does the maths). A card without a sweep is judged at its own session size, from its tier
table and its measured KB/token."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Optional, Sequence

from rigkit.validation.card.plots import _pyplot
from rigkit.validation.card.schema import RigCard
from rigkit.validation.card.text import TIER_TITLES
from rigkit.validation.pays import (
    DISK_TIER,
    SHARE_MIN,
    TIER_LINKS,
    PaysReport,
    RigLimits,
    SweepPoint,
    floor_s,
    fmt_rate,
    fmt_tokens,
    kv_bytes,
    pays_report,
)

WARM_TIERS = ("warm-connector", "warm-persistent")
SWEEP_COLOURS = {"cold": "#C44E52", "warm-gpu": "#55A868", "warm-connector": "#4C72B0", "warm-persistent": "#8172B2"}


def card_point(card: RigCard) -> Optional[SweepPoint]:
    """The card's own tier table as one point of a sweep (its session size), when cold and warm-gpu were measured."""
    cold, warm = card.tier("cold"), card.tier("warm-gpu")
    if not cold or not warm or not cold.ttft_s.mean or not warm.ttft_s.mean:
        return None
    tokens = [t for t in cold.prompt_tokens if t]
    tiers = {}
    for name in WARM_TIERS:
        tier = card.tier(name)
        if tier and tier.passed and tier.ttft_s.mean:
            tiers[name] = tier.ttft_s.mean
    if not tokens or not tiers:
        return None
    return SweepPoint(
        tokens=round(sum(tokens) / len(tokens)),
        cold_s=cold.ttft_s.mean,
        warm_gpu_s=warm.ttft_s.mean,
        tiers=tiers,
        sessions=cold.ttft_s.n,
    )


def does_it_pay(
    card: RigCard, sweep: Sequence[SweepPoint] = (), declared_kv_bytes_per_token: Optional[float] = None
) -> Optional[PaysReport]:
    """Each warm tier against its floor at the sweep's lengths and at the card's own session size (its tier table:
    the only point with the disk tier after a restart), with the KV bytes per token the store's growth measured,
    else the declared figure; None when no warm tier was measured beside cold and warm-gpu."""
    own = card_point(card)
    points = [*sweep, *([own] if own else [])]
    if not points:
        return None
    if card.capacity and card.capacity.kb_per_token:
        per_token, source = card.capacity.kb_per_token * 1000, "measured from the store's growth (③)"
    elif declared_kv_bytes_per_token:
        per_token, source = declared_kv_bytes_per_token, "declared: kv_bytes_per_token, else the model's shape"
    else:
        per_token, source = None, ""
    return pays_report(points, per_token, card.rig_limits, source)


def report_of(card: RigCard) -> Optional[PaysReport]:
    """The card's report as validation wrote it, else (a card written before issue 42) one judged from its own tier
    table."""
    return card.pays if card.pays is not None else does_it_pay(card)


def limits_lines(limits: Optional[RigLimits]) -> list[str]:
    if limits is None:
        return ["Rig limits not measured (rigkit/files/rig_limits.py): no floor, the gain against cold only."]
    lines = []
    if limits.no_gpu:
        lines.append(
            f"- GPU: none on this rig ({limits.no_gpu}): no host-to-device link, so no floor for a CPU tier; "
            "its gain against cold stands"
        )
    for gpu in limits.gpus:
        link = f"PCIe gen {gpu.pcie_gen or '?'} x{gpu.pcie_width or '?'}"
        if gpu.pcie_gen_max and gpu.pcie_gen and gpu.pcie_gen < gpu.pcie_gen_max:
            link += f" (can run gen {gpu.pcie_gen_max})"
        lines.append(
            f"- GPU {gpu.index} {gpu.name or '?'}, {link}: host-to-device {fmt_rate(gpu.pinned.bulk)} pinned "
            f"({fmt_rate(gpu.pinned.blocks)} in {(gpu.block_bytes or 0) / 2**20:.1f} MiB block copies), "
            f"{fmt_rate(gpu.pageable.bulk)} pageable"
        )
    if limits.disk_reads:
        best = max(limits.disk_reads, key=lambda r: r.bytes_per_s or 0)
        lines.append(
            f"- L2 disk {limits.disk_device or '?'} ({limits.disk_filesystem or '?'}, {limits.disk_path}): "
            f"{fmt_rate(best.bytes_per_s)} ({best.threads} threads, {'O_DIRECT' if best.o_direct else 'page cache dropped'}, "
            f"{best.file_bytes / 2**20:.1f} MiB files); one thread {fmt_rate(limits.disk_single_thread)}"
        )
    lines += [f"- not measured: {error}" for error in limits.errors]
    return lines


def pays_lines(card: RigCard) -> list[str]:
    """The rig card's section: the rig's limits, per tier and length its floor, share and gain, where it pays."""
    lines = ["## ⑤ Does the tier pay?", ""]
    report = report_of(card)
    if report is None:
        return lines + ["No warm tier measured beside cold and warm-gpu in this run.", ""]
    lines += limits_lines(card.rig_limits) + [""]
    if report.kv_bytes_per_token:
        lines += [f"KV per token: {report.kv_bytes_per_token / 1000:.1f} KB ({report.kv_bytes_source}).", ""]
    if report.floors:
        lines += [
            "| tier | tokens | TTFT | warm-gpu | floor | rate | share of the limit | vs cold | |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for f in report.floors:
            share = "—" if f.share is None else f"{100 * f.share:.0f} % of {fmt_rate(f.limit_bytes_per_s)} ({f.limit})"
            floor = "—" if f.floor_s is None else f"{1000 * f.floor_s:,.0f} ms"
            gain = "—" if f.gain is None else f"{f.gain:.2f}×"
            mark = f"⚠ {f.flag}" if f.flag else ("✓" if f.share is not None else "")
            lines.append(
                f"| {TIER_TITLES.get(f.tier, f.tier)} | {f.tokens:,} | {1000 * f.tier_s:,.0f} ms | "
                f"{1000 * f.warm_gpu_s:,.0f} ms | {floor} | {fmt_rate(f.rate_bytes_per_s)} | {share} | {gain} | {mark} |"
            )
        flagged = any(f.flag for f in report.floors)
        lines += [
            "",
            "Floor = warm-gpu TTFT + the session's KV over the tier's limit; share = the floor's transfer time / "
            f"the measured one (tier − warm-gpu), at least {100 * SHARE_MIN:.0f} % expected"
            + ("; ⚠ below it, with the likely cause." if flagged else "."),
            "",
        ]
    else:
        lines += ["KV per token unknown (no store growth measured, none declared): no floor.", ""]
    lines += [f"- {TIER_TITLES.get(b.tier, b.tier)}: **{b.text}**" for b in report.breakevens] + [""]
    return lines


def plot_pays(card: RigCard, path: Path) -> bool:
    """TTFT against context length (both linear axes, values printed), one line per tier, and the disk tier's floor
    at the probed disk rate where no point measured that tier; False without a sweep of two lengths or more."""
    report = card.pays
    if report is None or len(report.sweep) < 2:
        return False
    plt = _pyplot()
    points = sorted(report.sweep, key=lambda p: p.tokens)
    series = {"cold": [p.cold_s for p in points], "warm-gpu": [p.warm_gpu_s for p in points]}
    for tier in WARM_TIERS:
        if any(tier in p.tiers for p in points):
            series[tier] = [p.tiers.get(tier) for p in points]
    probed = [b for b in report.breakevens if b.tier == DISK_TIER and DISK_TIER not in series]
    disk = card.rig_limits.disk if card.rig_limits else None
    if probed and disk and report.kv_bytes_per_token:
        series[f"{DISK_TIER} floor (probed disk {fmt_rate(disk)})"] = [
            floor_s(p.warm_gpu_s, kv_bytes(report.kv_bytes_per_token, p.tokens), disk) for p in points
        ]
    fig, ax = plt.subplots(figsize=(8, 5.2))
    for name, values in series.items():
        xs = [p.tokens for p, v in zip(points, values) if v is not None]
        ys = [1000 * v for v in values if v is not None]
        floor = name.startswith(DISK_TIER)
        ax.plot(
            xs,
            ys,
            marker="o",
            linestyle="--" if floor else "-",
            label=name,
            color=SWEEP_COLOURS.get(DISK_TIER if floor else name),
        )
        below = name == "warm-gpu"  # printed under its points: warm tiers sit just above it
        for x, y in zip(xs, ys):
            ax.annotate(
                f"{y:,.0f}",
                (x, y),
                textcoords="offset points",
                xytext=(0, -13 if below else 6),
                ha="center",
                fontsize=8,
            )
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("TTFT, client side (ms)")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    verdicts = "\n".join(textwrap.shorten(f"{b.tier}: {b.text}", 110) for b in report.breakevens)
    ax.set_title(f"{card.rig}: where each tier pays\n{verdicts}", fontsize=8.5)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def fleet_pays_lines(cards: Sequence[RigCard]) -> list[str]:
    """The fleet card's comparison: per rig its link, disk and each warm tier's share of its floor and breakeven."""
    reports = {card.rig: report_of(card) for card in cards}
    if not any(reports.values()):
        return []
    lines = [
        "## Does the tier pay? (per rig)",
        "",
        "| rig | pinned link | disk | tier | share of its floor (longest length) | where it pays |",
        "|---|---|---|---|---|---|",
    ]
    for card in cards:
        report, limits = reports[card.rig], card.rig_limits
        if report is None:
            continue
        for b in report.breakevens:
            floors = [f for f in report.floors if f.tier == b.tier and f.share is not None]
            share = f"{100 * floors[-1].share:.0f} % at {fmt_tokens(floors[-1].tokens)}" if floors else "—"
            lines.append(
                f"| {card.rig} | {fmt_rate(limits.pinned if limits else None)} | "
                f"{fmt_rate(limits.disk if limits else None)} | {b.tier} ({TIER_LINKS.get(b.tier, '?')}) | {share} | "
                f"{b.text} |"
            )
    return lines + [""]
