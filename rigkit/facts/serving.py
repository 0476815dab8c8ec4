"""Facts about the serving stack on the rig: its containers, found by rigkit's stack label."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

from rigkit.serving.render import STACK_LABEL



class StackContainers(FactBase):
    """``docker inspect`` of every container (running or not) that carries rigkit's stack label."""

    def requires_command(self, *args, **kwargs) -> str:
        return "docker"

    def command(self, stack: str) -> str:
        selector = shlex.quote(f"label={STACK_LABEL}={stack}")
        return f"ids=$(docker ps -aq --filter {selector}); [ -z \"$ids\" ] && echo '[]' || docker inspect $ids"

    def process(self, output):
        return [
            {
                "id": c["Id"][:12],
                "name": c["Name"].lstrip("/"),
                "image": c["Config"]["Image"],
                "labels": c["Config"].get("Labels") or {},
                "running": bool(c["State"].get("Running")),
                "status": c["State"].get("Status"),
            }
            for c in json.loads("".join(output))
        ]
