"""The sweep of context lengths behind "where does the tier pay?" (rigkit.validation.pays), from the tier procedure's
own building blocks (rigkit.validation.procedure): salted prompts, a /metrics window around every request, labels
from counter deltas, the GPU pool evicted by fillers sized from vllm:cache_config_info.

Each session runs cold, warm-gpu, the fillers, then its CPU tier (warm-connector) before the next session starts:
only that session and its fillers must fit the CPU tier (its LRU evicts the older sessions first), where batching
every session's cold run before one filler pass would need them all to fit (issue 42: at l1_size_gb 30 a 32K
session was evicted before its CPU-tier request). A measurement whose counters prove another tier than expected is
kept out of the means, and counted.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from rigkit.metrics import Snapshot
from rigkit.prompts import PromptSpec
from rigkit.remote.client import ServingClient
from rigkit.validation.measure import measure
from rigkit.validation.pays import SweepPoint
from rigkit.validation.procedure import ValidationSettings, evict_gpu_pool
from rigkit.validation.tiers import Tier, label


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
