"""The router in front of the fleet as `rigkit status` shows it: each gateway's router asked (through the SSH tunnel
to its gateway, as a drain reaches it) whether it answers, which workers it routes to and which it holds healthy,
against the rigs of the inventory. A rig the router does not list (a drain that failed left it out, or the router
started while it did not serve) gets no request until an operator adds it back: the command that does is printed. A
worker the router lists as unhealthy comes back by itself once its health checks pass (rigkit.router.HEALTH_FLAGS)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

from rigkit.errors import RigkitError
from rigkit.fleet.inventory import rigs_among
from rigkit.rollout.router_admin import (
    RouterAdmin,
    add_worker_command,
    gateway_router_url,
    gateways,
    rig_worker_url,
    router_url,
)
from rigkit.router import CONTROLLER_HOST, ROUTER_UNIT

UP, DOWN, DEGRADED = "up", "down", "degraded"
HEALTHY, UNHEALTHY, LEFT_OUT = "healthy", "unhealthy", "left out"
ERROR_CHARS = 160


@dataclass
class RouterStatus:
    """One gateway's router: whether it answers, each rig of the inventory as the router sees it (healthy, unhealthy,
    left out), the URLs it routes to that no rig declares, and what to do."""

    gateway: str
    url: str  # the router as its gateway reaches it
    answers: bool = True
    error: str = ""
    rigs: dict[str, str] = field(default_factory=dict)  # rig -> HEALTHY, UNHEALTHY, LEFT_OUT or why it is no worker
    undeclared: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)

    @property
    def state(self) -> str:
        if not self.answers:
            return DOWN
        return DEGRADED if self.undeclared or any(seen != HEALTHY for seen in self.rigs.values()) else UP

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state, **asdict(self)}

    def lines(self) -> list[str]:
        if not self.answers:
            return [
                f"router {self.gateway} {self.url}: down ({self.error}): clients of the router get no answer",
                *[f"  do: {action}" for action in self.actions],
            ]
        workers = ", ".join(f"{rig} {seen}" for rig, seen in self.rigs.items()) or "none"
        lines = [f"router {self.gateway} {self.url}: {self.state}; rigs: {workers}"]
        lines += [f"  routes to {url}, which no rig of the inventory is" for url in self.undeclared]
        lines += [f"  do: {action}" for action in self.actions]
        return lines


def declared_workers(hosts: Mapping[str, Mapping]) -> dict[str, str]:
    """Every rig of the inventory -> the URL the router knows it by, or why it is none (rigkit.router's refusal)."""
    found = {}
    for rig in rigs_among(hosts, list(hosts)):
        try:
            found[rig] = rig_worker_url(rig, hosts[rig]["data"])
        except RigkitError as exc:
            found[rig] = f"no worker: {exc}"
    return found


def judge(gateway: str, gateway_url: str, declared: Mapping[str, str], workers: Mapping[str, bool]) -> RouterStatus:
    """The router's workers (URL -> healthy, from its /workers) against the declared workers."""
    status = RouterStatus(gateway, gateway_url)
    for rig, url in declared.items():
        if not url.startswith("http"):
            status.rigs[rig] = url
        elif url not in workers:
            status.rigs[rig] = LEFT_OUT
            status.actions.append(
                f"{rig} gets no request until it is added back; on {gateway}: {add_worker_command(gateway_url, url)}"
            )
        else:
            status.rigs[rig] = HEALTHY if workers[url] else UNHEALTHY
    urls = set(declared.values())
    status.undeclared = [url for url in workers if url not in urls]
    return status


def ask_router(gateway: str, data: Mapping[str, Any]) -> dict[str, bool]:
    """The router's workers from the controller, URL -> healthy (RouterError when it does not answer)."""
    with router_url(gateway, data) as url:
        return {worker.url: worker.healthy for worker in RouterAdmin(url).workers()}


def why_down(exc: Exception) -> str:
    """The router's silence in a few words: refused, timed out, or the error cut short."""
    text = str(exc)
    if "[Errno 111]" in text or "Connection refused" in text:
        return "connection refused"
    if "timed out" in text.lower():
        return "timed out"
    return " ".join(text.split())[:ERROR_CHARS]


def start_hint(gateway: str) -> str:
    if gateway == CONTROLLER_HOST:
        return "start the router you run on this machine (the lab's: rigkit lab up --router)"
    return f"on {gateway}: systemctl status {ROUTER_UNIT} (systemd restarts it; it answers once its workers do)"


def router_statuses(
    hosts: Mapping[str, Mapping], ask: Callable[[str, Mapping[str, Any]], Mapping[str, bool]] = ask_router
) -> list[RouterStatus]:
    """Every gateway of the inventory, its router asked and judged."""
    declared = declared_workers(hosts)
    found = []
    for gateway in gateways(hosts):
        data = hosts[gateway]["data"]
        url = gateway_router_url(data)
        try:
            listed = ask(gateway, data)
        except Exception as exc:  # RouterError, the tunnel's own (paramiko): a router down must not stop the report
            down = RouterStatus(gateway, url, answers=False, error=why_down(exc))
            down.rigs = {rig: "-" for rig in declared}
            down.actions.append(start_hint(gateway))
            found.append(down)
            continue
        found.append(judge(gateway, url, declared, listed))
    return found
