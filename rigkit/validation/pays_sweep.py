"""The sweep of context lengths behind "where does the tier pay?" (rigkit.validation.pays), from the tier procedure's
own building blocks (rigkit.validation.procedure): salted prompts, a /metrics window around every request, labels
from counter deltas, the GPU pool evicted by fillers sized from vllm:cache_config_info.

Each session runs cold, warm-gpu, the fillers, then its CPU tier (warm-connector) before the next session starts:
only that session and its fillers must fit the CPU tier (its LRU evicts the older sessions first), where batching
every session's cold run before one filler pass would need them all to fit (issue 42: at l1_size_gb 30 a 32K
session was evicted before its CPU-tier request). A measurement whose counters prove another tier than expected is
kept out of the means, and counted.

validate.py runs it after the tier procedure when validate_pays_lengths names lengths (sweep_after_tiers).
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from rigkit.errors import ConfigError
from rigkit.metrics import Snapshot
from rigkit.prompts import PromptSpec
from rigkit.remote.client import ServingClient, prefill_timeout
from rigkit.validation.measure import measure
from rigkit.validation.pays import SweepPoint
from rigkit.validation.procedure import CONTEXT_SLACK_TOKENS, TierValidation, ValidationSettings, evict_gpu_pool
from rigkit.validation.tiers import Tier, label

# Added to the run's seed for the sweep's prompt bodies: apart from the tier procedure's (seed - 1, seed + i,
# seed + 10,000 + i); every prompt is salted with a new session id anyway, so this only keeps bodies distinct
SWEEP_SEED_OFFSET = 100_000


@dataclass
class PointRecord:
    """One context length as measured: every request's TTFT and the label its counters proved, per tier."""

    tokens: int
    ttft_s: dict[str, list[float]] = field(default_factory=dict)
    labels: dict[str, list[str]] = field(default_factory=dict)
    fillers_sent: int = 0

    def add(self, expected: Tier, proved: Tier, ttft_s: Optional[float]) -> None:
        self.labels.setdefault(expected.value, []).append(proved.value)
        if proved == expected and ttft_s is not None:
            self.ttft_s.setdefault(expected.value, []).append(ttft_s)

    def point(self) -> Optional[SweepPoint]:
        """The means as a SweepPoint; None without a proven cold and warm-gpu figure."""
        means = {tier: statistics.fmean(values) for tier, values in self.ttft_s.items() if values}
        cold, warm = means.pop(Tier.COLD.value, None), means.pop(Tier.WARM_GPU.value, None)
        if cold is None or warm is None:
            return None
        sessions = len(self.ttft_s.get(Tier.COLD.value, []))
        return SweepPoint(tokens=self.tokens, cold_s=cold, warm_gpu_s=warm, tiers=means, sessions=sessions)


def measure_point(
    client: ServingClient,
    pool: Snapshot,
    settings: ValidationSettings,
    tokens: int,
    seed: int,
    timeout_s: float,
    connector_configured: bool = True,
    progress: Callable[[str], None] = lambda _: None,
) -> PointRecord:
    """`settings.sessions` salted sessions of `tokens` tokens: cold, warm-gpu and (with a connector) warm-connector."""
    record = PointRecord(tokens)
    at_length = dataclasses.replace(settings, prompt_tokens=tokens)
    for i in range(settings.sessions):
        prompt = client.build_prompt(PromptSpec(settings.prompt_kind, tokens, seed + i))
        steps = [Tier.COLD, Tier.WARM_GPU] + ([Tier.WARM_CONNECTOR] if connector_configured else [])
        for expected in steps:
            if expected == Tier.WARM_CONNECTOR:
                record.fillers_sent += evict_gpu_pool(client, pool, at_length, timeout_s)
            measured = measure(client, prompt.text, settings.output_tokens, timeout_s, seed=prompt.spec.seed)
            proved = label(measured.window, expected, connector_configured).tier
            ttft = None if measured.result.aborted else measured.result.ttft_s
            record.add(expected, proved, ttft)
            progress(
                f"{tokens} tokens, session {i + 1}/{settings.sessions}: {expected.value} "
                f"{'?' if ttft is None else f'{1000 * ttft:,.0f} ms'}"
                + ("" if proved == expected else f" (counters prove {proved.value}: not counted)")
            )
    return record


def sweep(
    client: ServingClient,
    pool: Snapshot,
    settings: ValidationSettings,
    lengths: Sequence[int],
    seed: int,
    timeout_s: float,
    connector_configured: bool = True,
    progress: Callable[[str], None] = lambda _: None,
) -> list[PointRecord]:
    """measure_point at every length, longest first (the longest is the one the card's verdict needs most)."""
    return [
        measure_point(client, pool, settings, tokens, seed + 1000 * n, timeout_s, connector_configured, progress)
        for n, tokens in enumerate(sorted(lengths, reverse=True))
    ]


def check_lengths_fit(lengths: Sequence[int], output_tokens: int, max_model_len: Optional[int]) -> None:
    """ConfigError when a sweep length and its reply do not fit max_model_len (the declared knob before any rig is
    asked, the server's after; None: unknown)."""
    room = (max_model_len or 0) - output_tokens - CONTEXT_SLACK_TOKENS
    too_long = [tokens for tokens in lengths if max_model_len and tokens > room]
    if too_long:
        raise ConfigError(
            "validate_pays_lengths",
            ",".join(str(t) for t in lengths),
            f"{', '.join(f'{t:,}' for t in too_long)} tokens with the reply (validate_output_tokens {output_tokens}) "
            f"do not fit max-model-len {max_model_len:,}",
            f"keep every length <= {room:,}",
        )


def uncounted(records: Sequence[PointRecord]) -> list[str]:
    """Per length, the measurements whose counters proved another tier than expected (kept out of the means)."""
    lines = []
    for record in records:
        for expected, proved in record.labels.items():
            others = [label for label in proved if label != expected]
            if others:
                lines.append(f"{record.tokens:,} tokens {expected}: {len(others)} of {len(proved)} proved {others[0]}")
    return lines


def sweep_after_tiers(
    client: ServingClient,
    validation: TierValidation,
    settings: ValidationSettings,
    connector_configured: bool,
    progress: Callable[[str], None] = lambda _: None,
) -> list[SweepPoint]:
    """The sweep at settings.pays_lengths on the engine the tier procedure left ready, timed out from its measured
    prefill rate; the points whose cold and warm-gpu were proven."""
    check_lengths_fit(settings.pays_lengths, settings.output_tokens, client.max_model_len)
    timeout_s = prefill_timeout(max(settings.pays_lengths), validation.prefill_tokens_per_s)
    seed = (settings.seed if settings.seed is not None else random.randrange(2**31)) + SWEEP_SEED_OFFSET
    records = sweep(
        client, validation.pool, settings, settings.pays_lengths, seed, timeout_s, connector_configured, progress
    )
    for line in uncounted(records):
        progress(f"not counted: {line}")
    return [point for point in (record.point() for record in records) if point is not None]
