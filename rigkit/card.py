"""Results cards: per-rig JSON (versioned schema) + Markdown + PNG plots, and a fleet card.

Layout of a run directory (results/<run-id>/):
    <rig>.card.json      the machine-readable result (the only input of a re-render)
    <rig>.md             the card, in the shape of the user's validation card
    <rig>-ttft.png       TTFT per tier
    <rig>-decode.png     decode A/B with CV bars (when measured)
    fleet.md, fleet-ttft.png   rigs side by side and the spread across rigs

`rigkit card results/<run-id>` re-renders every Markdown and PNG from the JSON files.
"""

from __future__ import annotations

import argparse
import math
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal, Optional, Sequence

from pydantic import BaseModel, Field

import rigkit
from rigkit.errors import ConfigError

SCHEMA_VERSION = 1
CARD_SUFFIX = ".card.json"
RESULTS_DIR = Path("results")

TIER_TITLES = {
    "cold": "Cold (re-prefill)",
    "warm-gpu": "Warm — GPU prefix cache (immediate repeat)",
    "warm-connector": "Warm — connector tier (after GPU eviction)",
    "warm-persistent": "Warm — persistent tier (after a full down/up)",
}
TIER_ORDER = tuple(TIER_TITLES)


# --- schema ----------------------------------------------------------------------------------
class StatModel(BaseModel):
    n: int
    mean: Optional[float] = None
    cv: Optional[float] = None
    samples: list[float] = Field(default_factory=list)

    @classmethod
    def of(cls, samples: Sequence[Optional[float]]) -> "StatModel":
        values = [float(v) for v in samples if v is not None]
        if not values:
            return cls(n=0)
        mean = statistics.fmean(values)
        cv = statistics.stdev(values) / mean if len(values) > 1 and mean else 0.0
        return cls(n=len(values), mean=mean, cv=cv, samples=values)


class TierProof(BaseModel):
    """The counter deltas of one measured request: why it got its label."""

    label: str
    gpu_hits: float
    gpu_queries: float
    external_hits: float
    external_queries: float
    external_kv_transfer_tokens: float
    counters_reset: bool = False
    text: str


class TierResult(BaseModel):
    expected: str
    labels: list[str]  # one per repetition (one salted session each)
    passed: bool
    ttft_s: StatModel  # client side
    server_ttft_s: StatModel  # delta of vllm:time_to_first_token_seconds
    ttft_within_tolerance: list[bool]
    prompt_tokens: list[Optional[int]]
    aborted: list[str] = Field(default_factory=list)  # "prefill"/"decode" per aborted request
    proofs: list[TierProof]

    @property
    def label(self) -> str:
        return self.labels[0] if len(set(self.labels)) == 1 else "inconsistent: " + "/".join(self.labels)


class DecodeKind(BaseModel):
    kind: str
    on: StatModel
    off: StatModel
    delta_pct: float
    within_bands: bool


class DecodeAB(BaseModel):
    arms: dict[str, str]  # "on"/"off" -> profile name
    warmup: int
    measured: int
    output_tokens: int
    kinds: list[DecodeKind]
    verdict: str
    reason: str


class CapacityTier(BaseModel):
    name: str
    size_bytes: int
    sessions: dict[str, float]  # session size in tokens (as text) -> sessions the tier holds


class Capacity(BaseModel):
    kb_per_token: Optional[float] = None
    bytes_grown: int = 0
    tokens_stored: int = 0
    source: str = ""
    tiers: list[CapacityTier] = Field(default_factory=list)


class PromptRecord(BaseModel):
    kind: str
    target_tokens: int
    seed: int
    tokens: Optional[int] = None


class Reproducibility(BaseModel):
    rigkit_version: str = rigkit.__version__
    image_digest: Optional[str] = None
    profile: Optional[str] = None
    knobs: dict[str, object] = Field(default_factory=dict)
    prompts: list[PromptRecord] = Field(default_factory=list)
    output_tokens: Optional[int] = None
    driver_version: Optional[str] = None
    cuda_version: Optional[str] = None
    gpu_models: list[str] = Field(default_factory=list)
    host_ram_bytes: Optional[int] = None
    l2_device: Optional[str] = None
    l2_filesystem: Optional[str] = None
    max_model_len: Optional[int] = None
    num_gpu_blocks: Optional[int] = None
    block_size: Optional[int] = None


L2Level = Literal["ok", "warn", "fail"]


class L2Report(BaseModel):
    """The L2 disk tier as validation found it (rigkit.validation.classify_l2 fills it)."""

    path: str
    mount: Optional[str] = None
    fs_size_bytes: Optional[int] = None
    fs_free_bytes: Optional[int] = None
    min_free_bytes: int
    store_bytes: Optional[int] = None
    budget_bytes: int
    janitor: Optional[str] = None  # systemd's word for the janitor unit; None: the connector evicts by itself
    janitor_state: Optional[str] = None  # the janitor's own state from its status file
    evicted_entries: int = 0
    evicted_bytes: int = 0
    last_eviction_reason: Optional[str] = None
    state: str  # ok, low, full, over-budget, janitor-down, unknown
    level: L2Level
    problems: list[str] = Field(default_factory=list)  # each with its fix


class SoakTurn(BaseModel):
    """One turn of one soak conversation, as measured (rigkit.soak runs them)."""

    session: int
    turn: int
    prompt_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None
    decode_tps: Optional[float] = None
    empty_reply: bool = False
    error: Optional[str] = None
    memory_mib: Optional[float] = None  # the rig's memory right after this turn (SoakReport.memory_source)


class SoakReport(BaseModel):
    """The soak's measurements and verdict (rigkit.soak.judge fills it)."""

    sessions: int
    turns: int  # per session
    open_sessions: int
    message_tokens: int
    reply_tokens: int
    memory_source: str
    memory_growth_limit_mib: float
    decode_retention_min: float
    empty_reply_max_fraction: float
    turns_run: int
    errors: int
    answered: int
    empty_replies: int
    baseline_session: Optional[int] = None  # the first clean session: baseline of memory and decode speed
    last_session: Optional[int] = None
    decode_tps_baseline: Optional[float] = None
    decode_tps_last: Optional[float] = None
    decode_retention: Optional[float] = None
    memory_baseline_mib: Optional[float] = None
    memory_last_mib: Optional[float] = None
    memory_growth_mib: Optional[float] = None
    failures: list[str] = Field(default_factory=list)  # each names its rule and numbers
    records: list[SoakTurn] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def empty_fraction(self) -> Optional[float]:
        return self.empty_replies / self.answered if self.answered else None


class RigCard(BaseModel):
    schema_version: Literal[1] = SCHEMA_VERSION
    rig: str
    run_id: str
    created_at: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    repro: Reproducibility = Field(default_factory=Reproducibility)
    connector_configured: bool = True
    prefill_tokens_per_s: Optional[float] = None
    tiers: list[TierResult] = Field(default_factory=list)
    decode_ab: Optional[DecodeAB] = None
    capacity: Optional[Capacity] = None
    l2: Optional[L2Report] = None
    soak: Optional[SoakReport] = None
    failures: list[str] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (not self.failures and all(t.passed for t in self.tiers) and (self.l2 is None or self.l2.level != "fail")
                and (self.soak is None or self.soak.passed))

    def tier(self, expected: str) -> Optional[TierResult]:
        return next((t for t in self.tiers if t.expected == expected), None)


# --- formatting ------------------------------------------------------------------------------
def fmt_seconds(value: Optional[float]) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def fmt_stat_seconds(stat: StatModel) -> str:
    if not stat.n:
        return "— (n=0)"
    return f"{fmt_seconds(stat.mean)} (n={stat.n}, CV {100 * (stat.cv or 0):.1f}%)"


def fmt_stat_plain(stat: StatModel, unit: str = "") -> str:
    if not stat.n:
        return "— (n=0)"
    return f"{stat.mean:.1f}{unit} (n={stat.n}, CV {100 * (stat.cv or 0):.1f}%)"


def speedup(cold: Optional[TierResult], tier: TierResult) -> str:
    if cold is None or not cold.ttft_s.n or not tier.ttft_s.n or not tier.ttft_s.mean:
        return "—"
    return f"~{cold.ttft_s.mean / tier.ttft_s.mean:.1f}×" if tier is not cold else "1×"


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

    parts = [f"{l2.mount or l2.path} {known(l2.fs_size_bytes)}, {known(l2.fs_free_bytes)} free "
             f"(floor {fmt_bytes(l2.min_free_bytes)})",
             f"store {known(l2.store_bytes)} of budget {fmt_bytes(l2.budget_bytes)}"]
    if l2.janitor is not None:
        janitor = f"janitor {l2.janitor}" + (f" ({l2.janitor_state})" if l2.janitor_state else "")
        if l2.evicted_entries:
            janitor += f", evicted {l2.evicted_entries} entries ({fmt_bytes(l2.evicted_bytes)}) since it started"
        parts.append(janitor)
    return f"**L2**: {' · '.join(parts)} — {l2.state.upper()} {L2_MARKS[l2.level]}"


# --- per-rig Markdown ------------------------------------------------------------------------
def render_rig_markdown(card: RigCard) -> str:
    lines = [f"# Results card — {card.rig} (run {card.run_id})", "",
             f"**Verdict: {'PASS' if card.passed else 'FAIL'}**" + (f" — profile `{card.repro.profile}`"
                                                                      if card.repro.profile else ""), ""]
    failures = card.failures + [f"tier {t.expected}: labelled {t.label}" for t in card.tiers if not t.passed]
    warnings: list[str] = []
    if card.l2:
        (failures if card.l2.level == "fail" else warnings).extend(card.l2.problems)
    if card.soak:
        failures.extend(f"soak: {failure}" for failure in card.soak.failures)
    bullets = [f"- ✗ {f}" for f in failures] + [f"- ⚠ {w}" for w in warnings]
    lines += bullets + ([""] if bullets else [])
    if card.l2:
        lines += [fmt_l2(card.l2), ""]

    lines += ["## ① Serving — decode A/B (toggle only the connector)", ""]
    if card.decode_ab:
        ab = card.decode_ab
        lines += [f"| decode tok/s | connector ON (`{ab.arms.get('on', 'on')}`) | connector OFF "
                  f"(`{ab.arms.get('off', 'off')}`) | delta |", "|---|---|---|---|"]
        for kind in ab.kinds:
            band = "within CV" if kind.within_bands else "outside CV"
            lines.append(f"| {kind.kind} | {fmt_stat_plain(kind.on)} | {fmt_stat_plain(kind.off)} | "
                         f"{kind.delta_pct:+.1f}% ({band}) |")
        lines += ["", f"Verdict: **{ab.verdict}** — {ab.reason}. Interleaved A/B, {ab.warmup} warm-up + "
                  f"{ab.measured} measured runs per kind per arm, {ab.output_tokens} output tokens each.", ""]
    else:
        lines += ["Not measured in this run.", ""]

    tokens = [t for tier in card.tiers for t in tier.prompt_tokens if t]
    size = f"{round(statistics.fmean(tokens)):,}-token salted session" if tokens else "salted session"
    lines += [f"## ② Cache behaviour — {size}", "",
              "| tier | TTFT (client) | vs cold | TTFT (server histogram) | label | metric proof |",
              "|---|---|---|---|---|---|"]
    cold = card.tier("cold")
    for tier in sorted(card.tiers, key=lambda t: TIER_ORDER.index(t.expected) if t.expected in TIER_ORDER else 99):
        mark = "✓" if tier.passed else "✗"
        proof = "; ".join(dict.fromkeys(p.text for p in tier.proofs[:1]))
        if len(tier.proofs) > 1:
            proof += f" (+{len(tier.proofs) - 1} more runs, same label)" if len(set(tier.labels)) == 1 else ""
        aborted = f" — {len(tier.aborted)} aborted ({', '.join(tier.aborted)})" if tier.aborted else ""
        lines.append(f"| {TIER_TITLES.get(tier.expected, tier.expected)} | {fmt_stat_seconds(tier.ttft_s)}{aborted} | "
                     f"{speedup(cold, tier)} | {fmt_stat_seconds(tier.server_ttft_s)} | {tier.label} {mark} | {proof} |")
    checks = [ok for tier in card.tiers for ok in tier.ttft_within_tolerance]
    if checks:
        lines += ["", f"Client TTFT within tolerance of the server histogram: {sum(checks)}/{len(checks)} requests."]
    if card.prefill_tokens_per_s:
        lines += [f"Measured prefill rate: {card.prefill_tokens_per_s:,.0f} tokens/s (sets the long-prefill timeout)."]
    lines.append("")

    lines += ["## ③ Capacity & sizing", ""]
    cap = card.capacity
    if cap and cap.kb_per_token:
        lines += [f"Cache ≈ **{cap.kb_per_token:.1f} KB/token** measured ({fmt_bytes(cap.bytes_grown)} over "
                  f"{cap.tokens_stored:,} tokens stored; {cap.source}).", ""]
        if cap.tiers:
            sizes = list(cap.tiers[0].sessions)
            lines += ["| tier | size | " + " | ".join(f"~{int(s):,}-token sessions" for s in sizes) + " |",
                      "|---|---|" + "---|" * len(sizes)]
            for tier in cap.tiers:
                lines.append(f"| {tier.name} | {fmt_bytes(tier.size_bytes)} | "
                             + " | ".join(f"{tier.sessions[s]:.1f}" for s in sizes) + " |")
            lines.append("")
    else:
        lines += ["Not measured in this run.", ""]

    lines += ["## ④ Stability (soak)", ""] + (render_soak(card.soak) if card.soak else
                                               ["Not run in this run (`validate_soak_sessions` = 0).", ""])

    lines += ["## Reproduce", "", "| | |", "|---|---|"]
    repro = card.repro
    for name, value in [("rigkit", repro.rigkit_version), ("image", repro.image_digest), ("profile", repro.profile),
                        ("knobs", ", ".join(f"{k}={v}" for k, v in sorted(repro.knobs.items())) or None),
                        ("prompts", "; ".join(f"{p.kind} {p.target_tokens} tok (seed {p.seed}"
                                              + (f", actual {p.tokens}" if p.tokens else "") + ")"
                                              for p in repro.prompts) or None),
                        ("output tokens", repro.output_tokens),
                        ("driver / CUDA", f"{repro.driver_version or '—'} / {repro.cuda_version or '—'}"),
                        ("GPUs", ", ".join(repro.gpu_models) or "none (CPU)"),
                        ("host RAM", fmt_bytes(repro.host_ram_bytes) if repro.host_ram_bytes else None),
                        ("L2 device / fs", f"{repro.l2_device or '—'} / {repro.l2_filesystem or '—'}"),
                        ("KV pool", f"{repro.num_gpu_blocks} blocks × {repro.block_size} tokens"
                                    if repro.num_gpu_blocks else None),
                        ("max model len", repro.max_model_len)]:
        lines.append(f"| {name} | {value if value not in (None, '') else '—'} |")
    lines += ["", f"_Schema v{card.schema_version}, created {card.created_at}. Figures: mean (n, CV)._", ""]
    return "\n".join(lines)


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def fmt_soak_short(soak: SoakReport) -> str:
    """The fleet card's soak cell: verdict, decode retention, memory growth."""
    parts = [f"retention {100 * soak.decode_retention:.0f}%" if soak.decode_retention is not None else None,
             f"{round(soak.memory_growth_mib):+,d} MiB" if soak.memory_growth_mib is not None else None]
    shown = ", ".join(p for p in parts if p)
    return ("PASS" if soak.passed else "FAIL") + (f" ({shown})" if shown else "")


def render_soak(soak: SoakReport) -> list[str]:
    """The card's soak table: each rule with its measured numbers and its limit."""
    def mib(value: Optional[float]) -> str:
        return f"{value:,.0f} MiB" if value is not None else "?"

    planned = soak.sessions * soak.turns
    lines = [f"{soak.sessions} conversations × {soak.turns} turns ({soak.open_sessions} open at once; each turn "
             f"sends the conversation so far plus a new ~{soak.message_tokens}-token user message, replies up to "
             f"{soak.reply_tokens} tokens); {soak.turns_run} of {planned} turns ran.", "",
             "| check | measured | limit | |", "|---|---|---|---|",
             f"| errors | {soak.errors} of {soak.turns_run} turns | none | {_mark(not soak.errors)} |"]
    if soak.empty_fraction is not None:
        ok = soak.empty_fraction < soak.empty_reply_max_fraction
        lines.append(f"| empty replies | {soak.empty_replies} of {soak.answered} answered "
                     f"({100 * soak.empty_fraction:.0f}%) | < {100 * soak.empty_reply_max_fraction:.0f}% "
                     f"| {_mark(ok)} |")
    else:
        lines.append(f"| empty replies | — (no turn answered) | < {100 * soak.empty_reply_max_fraction:.0f}% | ✗ |")
    if soak.decode_retention is not None:
        ok = soak.decode_retention >= soak.decode_retention_min
        lines.append(f"| decode retention | {100 * soak.decode_retention:.0f}% (session {soak.last_session}: "
                     f"{soak.decode_tps_last:.1f} tok/s vs first clean session {soak.baseline_session}: "
                     f"{soak.decode_tps_baseline:.1f} tok/s) | ≥ {100 * soak.decode_retention_min:.0f}% "
                     f"| {_mark(ok)} |")
    else:
        lines.append(f"| decode retention | — (not measured) | ≥ {100 * soak.decode_retention_min:.0f}% | ✗ |")
    if soak.memory_growth_mib is not None:
        ok = soak.memory_growth_mib <= soak.memory_growth_limit_mib
        lines.append(f"| memory growth | {round(soak.memory_growth_mib):+,d} MiB "
                     f"({mib(soak.memory_baseline_mib)} after session {soak.baseline_session} → "
                     f"{mib(soak.memory_last_mib)} at the end; {soak.memory_source}) | ≤ {soak.memory_growth_limit_mib:,.0f} MiB | {_mark(ok)} |")
    else:
        lines.append(f"| memory growth | — (not measured; {soak.memory_source}) | "
                     f"≤ {soak.memory_growth_limit_mib:,.0f} MiB | ✗ |")
    lines += ["", f"Verdict: **{'PASS' if soak.passed else 'FAIL'}**"
              + ("" if soak.passed else " — " + "; ".join(soak.failures)) + ".", ""]
    return lines


# --- plots -----------------------------------------------------------------------------------
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


# --- fleet -----------------------------------------------------------------------------------
def spread(values: Sequence[Optional[float]]) -> str:
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return "—"
    low, high = min(present), max(present)
    cv = statistics.stdev(present) / statistics.fmean(present) if statistics.fmean(present) else 0.0
    return f"{low:.3g}–{high:.3g} (CV {100 * cv:.1f}%)"


def _prompt_key(card: RigCard) -> tuple:
    return tuple((p.kind, p.target_tokens, p.seed) for p in card.repro.prompts)


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


# --- files -----------------------------------------------------------------------------------
def write_card(run_dir: Path, card: RigCard) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / f"{card.rig}{CARD_SUFFIX}"
    path.write_text(card.model_dump_json(indent=2) + "\n")
    return path


def load_cards(run_dir: Path) -> list[RigCard]:
    paths = sorted(run_dir.glob(f"*{CARD_SUFFIX}"))
    if not paths:
        raise ConfigError("run_dir", str(run_dir), f"no *{CARD_SUFFIX} files",
                          "pass a results/<run-id> directory written by validate.py")
    cards = []
    for path in paths:
        try:
            cards.append(RigCard.model_validate_json(path.read_text()))
        except ValueError as exc:
            raise ConfigError(str(path), None, f"not a schema v{SCHEMA_VERSION} rig card ({exc})",
                              "re-run validate.py for that rig or fix the JSON") from None
    return cards


def render_run(run_dir: Path) -> list[Path]:
    """(Re-)render every rig card and the fleet card of a run from its JSON files."""
    cards = load_cards(run_dir)
    written = []
    for card in cards:
        md = run_dir / f"{card.rig}.md"
        md.write_text(render_rig_markdown(card))
        written.append(md)
        if card.tiers:
            plot_ttft([card], run_dir / f"{card.rig}-ttft.png")
            written.append(run_dir / f"{card.rig}-ttft.png")
        if card.decode_ab:
            plot_decode(card, run_dir / f"{card.rig}-decode.png")
            written.append(run_dir / f"{card.rig}-decode.png")
    fleet = run_dir / "fleet.md"
    fleet.write_text(render_fleet_markdown(cards))
    written.append(fleet)
    if any(c.tiers for c in cards):
        plot_ttft(cards, run_dir / "fleet-ttft.png")
        written.append(run_dir / "fleet-ttft.png")
    return written


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


# --- CLI -------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="results/<run-id> directory holding <rig>.card.json files")


def run(args: argparse.Namespace) -> int:
    try:
        written = render_run(args.run_dir)
    except ConfigError as exc:
        print(f"rigkit card: {exc}")
        return 2
    for path in written:
        print(path)
    return 0
