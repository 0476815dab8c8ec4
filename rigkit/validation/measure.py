"""One measured request: /metrics scraped before and after it, and its client TTFT cross-checked against vLLM's own
histogram over that window (rigkit.validation.ttft)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rigkit import metrics
from rigkit.remote.client import ServingClient, StreamResult
from rigkit.validation.greedy import Completion
from rigkit.validation.ttft import TTFTCheck, crosscheck_ttft


@dataclass
class Measured:
    """One request with the /metrics window around it."""

    result: StreamResult
    window: metrics.Delta
    ttft_check: Optional[TTFTCheck]


def measure(
    client: ServingClient,
    prompt: str,
    max_tokens: int,
    timeout_s: Optional[float] = None,
    seed: Optional[int] = None,
    logprobs: int = 0,
) -> Measured:
    """Scrape /metrics, send one streaming request, scrape again: the window proves what served it."""
    before = client.metrics()
    result = client.stream_completion(
        prompt, max_tokens=max_tokens, timeout_s=timeout_s, seed=seed, api_overhead=True, logprobs=logprobs
    )
    after = client.metrics()
    window = metrics.delta(before, after)
    check = crosscheck_ttft(result.ttft_s, window, result.api_overhead_s) if result.ttft_s is not None else None
    return Measured(result, window, check)


def repeat_unmeasured(
    client: ServingClient,
    prompt: str,
    max_tokens: int,
    timeout_s: Optional[float] = None,
    seed: Optional[int] = None,
    logprobs: int = 0,
) -> Optional[Completion]:
    """The same greedy request once more, with no /metrics window: the second run of a numerics band
    (rigkit.validation.greedy.band). None when it did not finish."""
    result = client.stream_completion(prompt, max_tokens=max_tokens, timeout_s=timeout_s, seed=seed, logprobs=logprobs)
    return None if result.aborted else Completion(result.text, result.tokens)
