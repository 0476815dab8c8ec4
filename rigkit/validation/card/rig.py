"""One rig's card in Markdown: verdict, decode A/B, cache tiers, capacity, soak, how to reproduce."""

from __future__ import annotations

import statistics
from typing import Optional

from rigkit.validation.card.pays import pays_lines
from rigkit.validation.card.schema import GreedyCheck, RigCard, SoakReport, SpecDecode, TierResult, TTFTClient
from rigkit.validation.card.shared import shared_failures, shared_lines
from rigkit.validation.card.text import (
    NOT_READ,
    TIER_ORDER,
    TIER_TITLES,
    fmt_bytes,
    fmt_gain,
    fmt_l2,
    fmt_power_limit_declared,
    fmt_power_limits,
    fmt_seconds,
    fmt_stat_plain,
    fmt_stat_seconds,
)

# A greedy output shown on the card is cut to this many characters (the JSON keeps all of it).
GREEDY_SHOWN_CHARS = 160


def speedup(cold: Optional[TierResult], tier: TierResult) -> str:
    """TTFT gain over cold. A tier its counters prove keeps its label when it is no faster than recomputing
    (the H200's disk tier: 124 ms against a cold 87 ms): the gain column says so."""
    if cold is None or not cold.ttft_s.n or not tier.ttft_s.n:
        return "—"
    return "1×" if tier is cold else fmt_gain(cold.ttft_s.mean, tier.ttft_s.mean)


def ordered(tiers: list[TierResult]) -> list[TierResult]:
    return sorted(tiers, key=lambda t: TIER_ORDER.index(t.expected) if t.expected in TIER_ORDER else 99)


def tier_failure(tier: TierResult) -> str:
    wrong = tier.served_but_wrong
    if wrong:
        references = " / ".join(dict.fromkeys(check.reference for check in wrong))
        return (
            f"tier {tier.expected}: served-but-wrong: its counters prove {tier.counters_label}, but the logprobs "
            f"of {len(wrong)} of {len(tier.greedy)} sessions moved from the {references} run's further than this "
            f"path's tolerance (below)"
        )
    if tier.inconclusive:
        return (
            f"tier {tier.expected}: served right is inconclusive: the output of {len(tier.inconclusive)} of "
            f"{len(tier.greedy)} sessions differs and no band measured in this run explains it (below)"
        )
    return f"tier {tier.expected}: labelled {tier.label}"


def fmt_tolerance(client: TTFTClient) -> str:
    return f"max({100 * client.tolerance_rel:g} %, {1000 * client.tolerance_abs_s:g} ms)"


def api_overhead_note(card: RigCard) -> str:
    """How much of each client TTFT was the API server's own work outside the histogram's clock."""
    overheads = [
        pair.api_overhead_s for tier in card.tiers for pair in tier.ttft_pairs if pair.api_overhead_s is not None
    ]
    if not overheads:
        return ""
    return (
        f" Before comparing, each request's API overhead was subtracted (the same body under a model name "
        f"the server refuses with 404, timed just before it): median {fmt_seconds(statistics.median(overheads))}"
        f" over {len(overheads)} requests; the table shows the client figure as measured."
    )


def ttft_warnings(card: RigCard) -> list[str]:
    """A tier whose client TTFT strays from the server histogram: the card's timing, not its cache, is in doubt
    (the labels come from counters), so it warns and names where the client figure was measured."""
    if card.ttft_client is None:
        return []
    warnings = []
    for tier in ordered(card.tiers):
        misses = [pair for pair in tier.ttft_pairs if not pair.within]
        if not misses:
            continue
        worst = max(misses, key=lambda pair: abs(pair.compared_s - (pair.server_s or 0.0)))
        server = (
            f"server {fmt_seconds(worst.server_s)}, {1000 * (worst.compared_s - worst.server_s):+.0f} ms"
            if worst.server_s is not None
            else "no single-request histogram window"
        )
        overhead = "" if worst.api_overhead_s is None else f" less {fmt_seconds(worst.api_overhead_s)} API overhead"
        warnings.append(
            f"{tier.expected}: client TTFT outside {fmt_tolerance(card.ttft_client)} of the server "
            f"histogram on {len(misses)} of {len(tier.ttft_pairs)} requests (worst: client "
            f"{fmt_seconds(worst.client_s)}{overhead}, {server}), measured on "
            f"{card.ttft_client.transport}"
        )
    return warnings


def _clip(text: str) -> str:
    return repr(text if len(text) <= GREEDY_SHOWN_CHARS else text[:GREEDY_SHOWN_CHARS] + "…")


def fmt_shift(check: GreedyCheck) -> str:
    """Where a warm output parted from its reference, and how far its logprobs moved against the tolerance."""
    where = (
        "the same tokens"
        if check.first_difference is None
        else f"parts at character {check.first_difference}"
        + (f", token {check.first_difference_token}" if check.first_difference_token is not None else "")
    )
    if check.shift_nats is None:
        if check.near_tie_nats is not None and check.margin_nats is not None:  # a card before the shift verdict
            return f"{where}, margin {check.margin_nats:.3f} nats (near tie {check.near_tie_nats:g})"
        return f"{where}, no logprobs to compare (none asked, or the reply carried none where its reference did)"
    limit = "no tolerance measured" if check.tolerance_nats is None else f"tolerance {check.tolerance_nats:.4f}"
    relation = "≤" if check.verdict in ("same", "numerics") else ">" if check.tolerance_nats is not None else "vs"
    exact = " (bit-exact path)" if check.tolerance_exact else ""
    return (
        f"{where}; logprobs moved {check.shift_nats:.4f} nats over {check.positions_compared} positions "
        f"{relation} {limit}{exact}"
    )


WORDS = {"same": "same", "numerics": "≈ numerics", "inconclusive": "? inconclusive", "served-but-wrong": "DIFFERS"}
MARKS = {"numerics": "≈ numerics", "inconclusive": "? inconclusive", "served-but-wrong": "✗ served-but-wrong"}


def numerics_lines(card: RigCard) -> list[str]:
    """The bands the verdict was measured against, and each tier's tolerance."""
    bands = card.numerics
    if bands is None:
        return []

    def nats(value: Optional[float]) -> str:
        return "not measured" if value is None else f"{value:.4f} nats"

    tolerances = ", ".join(
        f"{tier} {nats(value)}" + (" (bit-exact)" if tier in bands.exact_tiers else "")
        for tier, value in bands.tolerances.items()
    )
    return [
        f"Numerics on this rig, measured in this run over {bands.sessions} sessions: the GPU prefix cache asked "
        f"twice moved logprobs by {nats(bands.repeat_nats)}, against the fresh prefill by "
        f"{nats(bands.cached_vs_fresh_nats)} (ceiling {bands.ceiling_nats:g}). Tolerances: {tolerances}."
    ]


def power_lines(card: RigCard) -> list[str]:
    """The self-test: each damage to the store, caught or missed."""
    power = card.power
    if power is None:
        return ["The check's power was not measured in this run (`validate_power_selftest`)."]
    smallest = power.smallest_caught or "none of them"
    missed = [row for row in power.rows if not row.caught]
    lines = [
        f"The check's power on {power.tier} (self-test sessions of their own, their store entries damaged before "
        f"the restart): the smallest damage caught, every larger one caught too, is **{smallest}**.",
    ]
    for row in missed:
        moved = "no logprob" if row.shift_nats is None else f"{row.shift_nats:.3f} nats"
        lines.append(
            f"**Missed: {row.damage}** (its session moved {moved}, within this path's tolerance of "
            f"{power.tolerance_nats or 0:.3f}): damage like it to this store would pass this card."
        )
    lines += [
        "",
        "| damage | files | bytes damaged | counters | verdict | shift (nats) | caught |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in power.rows:
        moved = "— (no logprobs in the reply)" if row.shift_nats is None else f"{row.shift_nats:.4f}"
        lines.append(
            f"| {row.damage}: {row.description} | {row.files} | {row.bytes_damaged:,} | {row.label} | {row.verdict} "
            f"| {moved} | {'✓ caught' if row.caught else '✗ missed (below the check’s power)'} |"
        )
    if power.restarted_after:
        lines += [
            "",
            f"Afterwards the self-test's {power.entries_removed} damaged store files were deleted and the engine "
            "restarted: no damaged entry or KV loaded from one stays behind.",
        ]
    return lines + [""]


def greedy_lines(card: RigCard, output_tokens: Optional[int]) -> list[str]:
    """Each warm tier's greedy outputs and logprobs against its references, the bands they were judged by, every
    output that differs (both texts, where they part, the shift) and the check's power."""
    warm = [tier for tier in ordered(card.tiers) if tier.greedy]
    if not warm:
        return []

    def counts(tier: TierResult) -> str:
        extra = [
            f"{len(found)} {word}"
            for word, found in (("numerics", tier.numerics), ("inconclusive", tier.inconclusive))
            if found
        ]
        return f"{tier.expected} {sum(c.same for c in tier.greedy)}/{len(tier.greedy)} same" + "".join(
            f" + {e}" for e in extra
        )

    size = f", {output_tokens} tokens" if output_tokens else ""
    lines = [
        f"Served right: greedy output (temperature 0, each session's seed{size}) and its top logprobs against the "
        f"cold run's (a connector tier: also warm-gpu's, the same cached-prefix path): "
        f"{', '.join(counts(t) for t in warm)}. The verdict reads how far the top logprobs moved where both runs "
        "saw the same text, against the path's tolerance measured in this run."
    ]
    lines += numerics_lines(card)
    drifts = [c.logprob_drift for t in warm for c in t.greedy if c.logprob_drift is not None]
    if drifts:
        lines.append(f"Largest chosen-token logprob difference where the outputs agreed: {max(drifts):.4f} nats.")
    sessions: dict[str, dict] = {}  # session -> its cold text and each warm tier's word, in tier order
    for tier in warm:
        for check in tier.greedy:
            seen = sessions.setdefault(check.session, {})
            if check.reference == "cold":
                seen.setdefault("cold", check.reference_text)
            if seen.get(str(tier.expected), "same") == "same":
                seen[str(tier.expected)] = WORDS[check.verdict]
    for session, seen in sessions.items():
        verdicts = ", ".join(f"{name} {word}" for name, word in seen.items() if name != "cold")
        lines.append(f"- session {session}: cold {_clip(seen.get('cold', ''))}; {verdicts}")
    for tier in warm:
        for check in tier.greedy:
            if check.verdict == "same":
                continue
            lines.append(
                f"- {MARKS[check.verdict]}: {tier.expected}, session {check.session}, against {check.reference}: "
                f"{fmt_shift(check)}: {check.reference} {_clip(check.reference_text)}, "
                f"{tier.expected} {_clip(check.text)}"
            )
    return lines + [""] + power_lines(card)


def render_rig_markdown(card: RigCard) -> str:
    lines = [
        f"# Results card — {card.rig} (run {card.run_id})",
        "",
        f"**Verdict: {'PASS' if card.passed else 'FAIL'}**"
        + (f" — profile `{card.repro.profile}`" if card.repro.profile else ""),
        "",
    ]
    failures = card.failures + [tier_failure(t) for t in card.tiers if not t.passed] + shared_failures(card)
    warnings: list[str] = ttft_warnings(card)
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
        lines += [
            f"| decode tok/s | connector ON (`{ab.arms.get('on', 'on')}`) | connector OFF "
            f"(`{ab.arms.get('off', 'off')}`) | delta |",
            "|---|---|---|---|",
        ]
        for kind in ab.kinds:
            band = "within CV" if kind.within_bands else "outside CV"
            lines.append(
                f"| {kind.kind} | {fmt_stat_plain(kind.on)} | {fmt_stat_plain(kind.off)} | "
                f"{kind.delta_pct:+.1f}% ({band}) |"
            )
        if ab.spec_decode:
            lines.append(
                f"| spec-decode acceptance | {fmt_acceptance(ab.spec_decode.get('on'))} | "
                f"{fmt_acceptance(ab.spec_decode.get('off'))} | |"
            )
        lines += [
            "",
            f"Verdict: **{ab.verdict}** — {ab.reason}. Interleaved A/B, {ab.warmup} warm-up + "
            f"{ab.measured} measured runs per kind per arm, {ab.output_tokens} output tokens each.",
            "",
        ]
    else:
        lines += ["Decode A/B not measured in this run.", ""]
    if card.spec_decode:
        spec = card.spec_decode
        lines += [
            "| speculative decoding | acceptance (accepted / draft tokens) | mean acceptance length | over |",
            "|---|---|---|---|",
            f"| this run | {fmt_acceptance(spec)} | {spec.mean_acceptance_length:.2f} tokens per step | "
            f"{spec.window} |",
            "",
        ]

    tokens = [t for tier in card.tiers for t in tier.prompt_tokens if t]
    size = f"{round(statistics.fmean(tokens)):,}-token salted session" if tokens else "salted session"
    lines += [f"## ② Cache behaviour — {size}", ""]
    lines += (
        [
            "| tier | TTFT (client) | vs cold | TTFT (server histogram) | label | metric proof |",
            "|---|---|---|---|---|---|",
        ]
        if card.tiers
        else [
            "Tiers not measured in this run (validate.py wrote no card for this rig; the pairs below are "
            "rigkit validate-shared's)."
        ]
    )
    cold = card.tier("cold")
    for tier in ordered(card.tiers):
        mark = "✓" if tier.passed else "✗"
        proof = "; ".join(dict.fromkeys(p.text for p in tier.proofs[:1]))
        if len(tier.proofs) > 1:
            proof += f" (+{len(tier.proofs) - 1} more runs, same label)" if len(set(tier.labels)) == 1 else ""
        aborted = f" — {len(tier.aborted)} aborted ({', '.join(tier.aborted)})" if tier.aborted else ""
        label = tier.label + (f" ({tier.store_tier})" if tier.store_tier else "")
        lines.append(
            f"| {TIER_TITLES.get(tier.expected, tier.expected)} | {fmt_stat_seconds(tier.ttft_s)}{aborted} | "
            f"{speedup(cold, tier)} | {fmt_stat_seconds(tier.server_ttft_s)} | {label} {mark} | {proof} |"
        )
    for expected, why in card.not_applicable.items():
        lines.append(f"| {TIER_TITLES.get(expected, expected)} | — | — | — | not applicable | {why} |")
    checks = [ok for tier in card.tiers for ok in tier.ttft_within_tolerance]
    if checks and card.ttft_client:
        lines += [
            "",
            f"Client TTFT measured on {card.ttft_client.transport}; within "
            f"{fmt_tolerance(card.ttft_client)} of the server histogram's figure for the same request: "
            f"{sum(checks)}/{len(checks)} requests.{api_overhead_note(card)}",
        ]
    elif checks:
        lines += ["", f"Client TTFT within tolerance of the server histogram: {sum(checks)}/{len(checks)} requests."]
    greedy = greedy_lines(card, card.repro.output_tokens)
    lines += [""] + greedy if greedy else []
    if card.prefill_tokens_per_s:
        lines += [f"Measured prefill rate: {card.prefill_tokens_per_s:,.0f} tokens/s (sets the long-prefill timeout)."]
    lines.append("")
    lines += shared_lines(card.shared, [card])

    lines += ["## ③ Capacity & sizing", ""]
    cap = card.capacity
    if cap and cap.kb_per_token:
        lines += [
            f"Cache ≈ **{cap.kb_per_token:.1f} KB/token** measured ({fmt_bytes(cap.bytes_grown)} over "
            f"{cap.tokens_stored:,} tokens stored; {cap.source}).",
            "",
        ]
        if cap.tiers:
            sizes = list(cap.tiers[0].sessions)
            lines += [
                "| tier | size | " + " | ".join(f"~{int(s):,}-token sessions" for s in sizes) + " |",
                "|---|---|" + "---|" * len(sizes),
            ]
            for tier in cap.tiers:
                # a count by an eviction rule is of whole sessions (a part of one is recomputed)
                shown = "{:.0f}" if tier.rule else "{:.1f}"
                lines.append(
                    f"| {tier.name} | {fmt_bytes(tier.size_bytes)} | "
                    + " | ".join(shown.format(tier.sessions[s]) for s in sizes)
                    + " |"
                )
            lines += [""] + [
                f"{tier.name}: {tier.rule}; whole sessions held before an eviction fires."
                if tier.rule
                else f"{tier.name}: counted on the whole tier."
                for tier in cap.tiers
            ]
            lines.append("")
    else:
        lines += ["Not measured in this run.", ""]

    lines += ["## ④ Stability (soak)", ""] + (
        render_soak(card.soak) if card.soak else ["Not run in this run (`validate_soak_sessions` = 0).", ""]
    )
    lines += pays_lines(card)

    lines += ["## Reproduce", "", "| | |", "|---|---|"]
    repro = card.repro
    for name, value in [
        ("rigkit", repro.rigkit_version),
        ("image", repro.image_digest),
        ("model", repro.model_source),
        ("profile", repro.profile),
        ("knobs", ", ".join(f"{k}={v}" for k, v in sorted(repro.knobs.items())) or None),
        (
            "prompts",
            "; ".join(
                f"{p.kind} {p.target_tokens} tok (seed {p.seed}" + (f", actual {p.tokens}" if p.tokens else "") + ")"
                for p in repro.prompts
            )
            or None,
        ),
        ("output tokens", repro.output_tokens),
        ("driver / CUDA", f"{repro.driver_version or '—'} / {repro.cuda_version or '—'}"),
        ("GPUs", ", ".join(repro.gpu_models) or ("none (CPU)" if repro.machine_read else NOT_READ)),
        *(
            [
                (
                    "GPU power limit",
                    f"declared {fmt_power_limit_declared(repro.power_limit_declared_w)}, "
                    f"enforced {fmt_power_limits(repro.power_limits_enforced_w)}",
                )
            ]
            if repro.gpu_models
            else []
        ),
        ("host RAM", fmt_bytes(repro.host_ram_bytes) if repro.host_ram_bytes else None),
        ("L2 device / fs", f"{repro.l2_device or '—'} / {repro.l2_filesystem or '—'}"),
        *([("L2 integrity", repro.l2_integrity)] if repro.l2_integrity else []),
        ("KV pool", f"{repro.num_gpu_blocks} blocks × {repro.block_size} tokens" if repro.num_gpu_blocks else None),
        ("max model len", repro.max_model_len),
    ]:
        lines.append(f"| {name} | {value if value not in (None, '') else '—'} |")
    lines += ["", f"_Schema v{card.schema_version}, created {card.created_at}. Figures: mean (n, CV)._", ""]
    return "\n".join(lines)


def fmt_acceptance(spec: Optional[SpecDecode]) -> str:
    if spec is None or spec.acceptance_rate is None:
        return "—"
    return f"{100 * spec.acceptance_rate:.1f} % ({spec.accepted_tokens:,.0f} / {spec.draft_tokens:,.0f})"


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def render_soak(soak: SoakReport) -> list[str]:
    """The card's soak table: each rule with its measured numbers and its limit."""

    def mib(value: Optional[float]) -> str:
        return f"{value:,.0f} MiB" if value is not None else "?"

    planned = soak.sessions * soak.turns
    lines = [
        f"{soak.sessions} conversations × {soak.turns} turns ({soak.open_sessions} open at once; each turn "
        f"sends the conversation so far plus a new ~{soak.message_tokens}-token user message, replies up to "
        f"{soak.reply_tokens} tokens); {soak.turns_run} of {planned} turns ran.",
        "",
        "| check | measured | limit | |",
        "|---|---|---|---|",
        f"| errors | {soak.errors} of {soak.turns_run} turns | none | {_mark(not soak.errors)} |",
    ]
    if soak.empty_fraction is not None:
        ok = soak.empty_fraction < soak.empty_reply_max_fraction
        lines.append(
            f"| empty replies | {soak.empty_replies} of {soak.answered} answered "
            f"({100 * soak.empty_fraction:.0f}%) | < {100 * soak.empty_reply_max_fraction:.0f}% "
            f"| {_mark(ok)} |"
        )
    else:
        lines.append(f"| empty replies | — (no turn answered) | < {100 * soak.empty_reply_max_fraction:.0f}% | ✗ |")
    if soak.decode_retention is not None:
        ok = soak.decode_retention >= soak.decode_retention_min
        lines.append(
            f"| decode retention | {100 * soak.decode_retention:.0f}% (session {soak.last_session}: "
            f"{soak.decode_tps_last:.1f} tok/s vs first clean session {soak.baseline_session}: "
            f"{soak.decode_tps_baseline:.1f} tok/s) | ≥ {100 * soak.decode_retention_min:.0f}% "
            f"| {_mark(ok)} |"
        )
    else:
        lines.append(f"| decode retention | — (not measured) | ≥ {100 * soak.decode_retention_min:.0f}% | ✗ |")
    if soak.memory_growth_mib is not None:
        ok = soak.memory_growth_mib <= soak.memory_growth_limit_mib
        lines.append(
            f"| memory growth | {round(soak.memory_growth_mib):+,d} MiB "
            f"({mib(soak.memory_baseline_mib)} after session {soak.baseline_session} → "
            f"{mib(soak.memory_last_mib)} at the end; {soak.memory_source}) | ≤ {soak.memory_growth_limit_mib:,.0f} MiB | {_mark(ok)} |"
        )
    else:
        lines.append(
            f"| memory growth | — (not measured; {soak.memory_source}) | "
            f"≤ {soak.memory_growth_limit_mib:,.0f} MiB | ✗ |"
        )
    lines += [
        "",
        f"Verdict: **{'PASS' if soak.passed else 'FAIL'}**"
        + ("" if soak.passed else " — " + "; ".join(soak.failures))
        + ".",
        "",
    ]
    return lines
