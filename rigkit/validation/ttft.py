"""Client-side TTFT: where it is measured (the rig's own loopback through RigProbe, or the controller) and
how it is cross-checked against vLLM's own histogram over the same request."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from rigkit.files import ttft_probe
from rigkit.remote.tunnel import rig_local_url
from rigkit.validation import metrics

# Client TTFT, less the API server's measured cost of the same request outside the engine's clock, vs the
# delta of vllm:time_to_first_token_seconds over that request: they agree within the larger of these.
TTFT_TOLERANCE_ABS_S = 0.005
TTFT_TOLERANCE_REL = 0.05
# The model name of the API-overhead request (rigkit/files/ttft_probe.py api_overhead): one no rig serves, so
# vLLM answers 404 after reading and validating the body and before any engine work.
API_OVERHEAD_MODEL = "rigkit-api-overhead-probe"


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


# Where a client that streams from the controller itself sits: behind the tunnel or the LAN.
CONTROLLER_TRANSPORT = "the controller"
# (command, stdin) -> the command's stdout on the rig, None when it failed
RigCommand = Callable[[str, str], Optional[str]]


@dataclass(frozen=True)
class RigProbe:
    """Streams the measured requests from the rig itself: rigkit/files/ttft_probe.py, run by the rig's python3
    over an SSH connection the controller already holds, timing the first token on the rig's loopback, where
    its own clients sit. The controller keeps everything else (prompts, /metrics, orchestration)."""

    run: RigCommand
    base_url: str  # the serving API as a process on the rig reaches it (rigkit.remote.tunnel.rig_local_url)
    transport: str  # what the card says measured the client TTFT

    @classmethod
    def on(cls, rig: str, run: RigCommand, bind_address: str, port: int) -> "RigProbe":
        """The probe of `rig`, reaching the serving API bound to bind_address:port as the rig's own clients do."""
        return cls(
            run=run,
            base_url=rig_local_url(bind_address, port),
            transport=f"{rig}'s loopback (rigkit's probe, run by the rig's python3 over SSH)",
        )

    def command(self) -> str:
        """The rig's python3 running the probe's source as it is on the controller (nothing installed)."""
        return "python3 -c " + shlex.quote(Path(ttft_probe.__file__).read_text())

    def stream(
        self, path: str, body: dict, connect_timeout_s: float, timeout_s: float, overhead_model: Optional[str] = None
    ) -> dict:
        request = {
            "url": self.base_url.rstrip("/") + path,
            "body": body,
            "connect_timeout_s": connect_timeout_s,
            "timeout_s": timeout_s,
            "overhead_model": overhead_model,
        }
        output = self.run(self.command(), json.dumps(request))
        try:
            return json.loads((output or "").strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {
                "error": f"the TTFT probe on the rig printed no result ({(output or '').strip()[:200]!r}): "
                "check that the rig has python3",
                "total_s": 0.0,
            }
