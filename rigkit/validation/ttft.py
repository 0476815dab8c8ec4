"""Client-side TTFT (measured where rigkit.remote.probe says): how it is cross-checked against vLLM's own
histogram over the same request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rigkit import metrics

# Client TTFT, less the API server's measured cost of the same request outside the engine's clock, vs the
# delta of vllm:time_to_first_token_seconds over that request: they agree within the larger of these.
TTFT_TOLERANCE_ABS_S = 0.005
TTFT_TOLERANCE_REL = 0.05


def less_api_overhead(client_s: float, api_overhead_s: Optional[float]) -> float:
    """The client figure held against the histogram: less the API overhead when it was measured."""
    return client_s - (api_overhead_s or 0.0)


@dataclass(frozen=True)
class TTFTCheck:
    client_s: float
    server_s: Optional[float]
    server_requests: float
    within: bool
    api_overhead_s: Optional[float] = None  # None: not measured, the client figure is compared as it is

    @property
    def compared_s(self) -> float:
        return less_api_overhead(self.client_s, self.api_overhead_s)

    @property
    def difference_s(self) -> Optional[float]:
        return None if self.server_s is None else self.compared_s - self.server_s


def ttft_tolerance_s(server_s: float) -> float:
    """How far a client figure may be from the server's: max(TTFT_TOLERANCE_REL, TTFT_TOLERANCE_ABS_S)."""
    return max(TTFT_TOLERANCE_ABS_S, TTFT_TOLERANCE_REL * server_s)


def ttft_agrees(client_s: float, server_s: float) -> bool:
    """Client TTFT within ttft_tolerance_s of the server's figure."""
    return abs(client_s - server_s) <= ttft_tolerance_s(server_s)


def crosscheck_ttft(client_ttft_s: float, window: metrics.Delta, api_overhead_s: Optional[float] = None) -> TTFTCheck:
    """Compare a client-side TTFT, less the request's measured API overhead when known, with vLLM's own
    histogram delta over the same single request."""
    server_s, compared_s = window.server_ttft_mean, less_api_overhead(client_ttft_s, api_overhead_s)
    within = server_s is not None and window.ttft_count == 1 and ttft_agrees(compared_s, server_s)
    return TTFTCheck(client_ttft_s, server_s, window.ttft_count, within, api_overhead_s)
