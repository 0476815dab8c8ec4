"""Facts about the router on the gateway, read through ROUTER_CHECK (rigkit/files/router_check.py)."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

from rigkit.router import ROUTER_CHECK


class RouterWorkers(FactBase):
    """The router's /health (waited for, up to ``timeout_s``) and its /list_workers:
    {"ready", "waited_s", "urls", "error"}."""

    def requires_command(self, *args, **kwargs) -> str:
        return "python3"

    def command(self, url: str, timeout_s: int) -> str:
        return f"python3 {ROUTER_CHECK} {shlex.quote(url)} {int(timeout_s)}"

    def process(self, output):
        return json.loads("".join(output))
