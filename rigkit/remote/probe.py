"""The TTFT probe's transport: where a measured request is streamed from (the rig's own loopback through RigProbe,
or the controller), and the API-overhead request's model name (rigkit/files/ttft_probe.py)."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from rigkit.files import ttft_probe
from rigkit.remote.tunnel import rig_local_url

# The model name of the API-overhead request (rigkit/files/ttft_probe.py api_overhead): one no rig serves, so
# vLLM answers 404 after reading and validating the body and before any engine work.
API_OVERHEAD_MODEL = "rigkit-api-overhead-probe"

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
