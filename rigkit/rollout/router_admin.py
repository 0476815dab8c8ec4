"""vllm-router's admin endpoints, from the controller: list, remove and add workers, and drain a rig.

    with router_url(gateway, hosts[gateway]["data"]) as url:
        admin = RouterAdmin(url)
        with drained(admin, rig_worker_url(rig, hosts[rig]["data"]), in_flight):
            ...  # down/up the rig: the router sends it nothing meanwhile

Measured with vllm-router 0.1.17 (tests/rollout/test_router_admin.py runs the real one): GET /list_workers ->
{"urls": [...]}; GET /workers -> {"workers": [{"url", "is_healthy", "load", ...}]}, where "load" counts the
requests the router has in flight on a worker under cache_aware and power_of_two but stays 0 under
round_robin, and a removed worker is no longer listed, so a drain waits on the rig's own gauges
(vllm:num_requests_running/_waiting, rigkit.metrics.requests_in_flight) instead. POST /remove_worker?url=U
answers 200 "Successfully removed worker" for a URL it does not know too, so a remove is checked against the
list before and after. POST /add_worker?url=U health-checks U first and answers 400 when U already is a worker,
or after --worker-startup-timeout-secs (default 600 s) when U is not healthy. A request already sent to a
worker when it is removed still completes. The admin endpoints take no key: the router binds the gateway's
loopback (router_bind_address) and the controller reaches it through rigkit.remote.tunnel's SSH tunnel.
"""

from __future__ import annotations

import shlex
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional

import requests

from rigkit.errors import RigkitError
from rigkit.remote.http_session import server_session
from rigkit.remote.tunnel import serving_url
from rigkit.router import CONTROLLER_HOST, worker_address, worker_url
from rigkit.router import router_url as on_gateway
from rigkit.settings.defaults import ROUTER_GROUP, ROUTER_VARIABLES
from rigkit.settings.hostdata import rig_settings
from rigkit.settings.variables import resolve

ADMIN_TIMEOUT_S = 10.0
# /add_worker returns once the router's own health check of the worker passed; the rig has just passed its
# smoke, so a healthy one answers at once
ADD_TIMEOUT_S = 60.0
# a drained rig still finishing what the router had sent it: how long to wait before its down/up
IDLE_TIMEOUT_S = 300.0
IDLE_POLL_S = 0.5
# idle means idle this long: a request the router sent just before the remove may still be on the wire
IDLE_SETTLE_S = 1.0
# pyinfra's name for the controller itself: a router started there is reached directly
LOCAL_HOST = CONTROLLER_HOST


class RouterError(RigkitError):
    """The router did not do what the rollout asked of it (unreachable, unknown worker, a remove that did not
    take, an add it refused)."""


@dataclass(frozen=True)
class Worker:
    url: str
    healthy: bool
    load: int  # requests the router has in flight on it (cache_aware, power_of_two; 0 under round_robin)


def add_worker_command(router_on_gateway: str, worker_url: str) -> str:
    """The shell command that puts ``worker_url`` back into the router, run on its gateway (``router_on_gateway``:
    the router's URL as the gateway reaches it, rigkit.router.router_url); the router health-checks it first."""
    return f"curl -X POST {shlex.quote(f'{router_on_gateway}/add_worker?url={worker_url}')}"


class RouterAdmin:
    """One router's admin endpoints at ``url`` (direct or through the tunnel to its gateway); ``gateway_url`` is the
    router as its gateway reaches it (the by-hand commands printed run there), ``url`` when not given."""

    def __init__(
        self,
        url: str,
        session: Optional[requests.Session] = None,
        timeout_s: float = ADMIN_TIMEOUT_S,
        gateway_url: Optional[str] = None,
    ):
        self.url = url.rstrip("/")
        self.gateway_url = (gateway_url or url).rstrip("/")
        self.session = session or server_session()
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, timeout_s: Optional[float] = None, **params: str) -> requests.Response:
        try:
            return self.session.request(
                method, f"{self.url}{path}", params=params or None, timeout=timeout_s or self.timeout_s
            )
        except requests.RequestException as exc:
            raise RouterError(
                "router",
                self.url,
                f"unreachable ({type(exc).__name__}: {exc})",
                "check that the router runs on the gateway (systemctl status on it) and that "
                "router_bind_address/router_port in the gateway's data are where it listens",
            ) from None

    def _json(self, path: str) -> Any:
        response = self._call("GET", path)
        try:
            response.raise_for_status()
            return response.json()
        except (requests.HTTPError, ValueError) as exc:
            raise RouterError(
                "router",
                f"{self.url}{path}",
                f"answered {response.status_code} {response.text[:200]!r} ({exc})",
                "is it vllm-router? check router_port",
            ) from None

    def health(self) -> None:
        response = self._call("GET", "/health")
        if response.status_code != 200:
            raise RouterError(
                "router",
                f"{self.url}/health",
                f"answered {response.status_code} {response.text[:200]!r}",
                "read the router's journal on the gateway",
            )

    def list_workers(self) -> list[str]:
        return list(self._json("/list_workers")["urls"])

    def workers(self) -> list[Worker]:
        return [
            Worker(w["url"], bool(w.get("is_healthy")), int(w.get("load") or 0))
            for w in self._json("/workers")["workers"]
        ]

    def remove(self, worker_url: str) -> None:
        """Take ``worker_url`` out of the routing; the router sends it no new request once this returns."""
        listed = self.list_workers()
        if worker_url not in listed:
            raise RouterError(
                "worker",
                worker_url,
                f"unknown to the router at {self.url} (it routes to {', '.join(listed) or 'no worker'})",
                "the router's --worker-urls and the rig's "
                "address (bind_address, serving_port) must name the rig the same way",
            )
        response = self._call("POST", "/remove_worker", url=worker_url)
        if worker_url in self.list_workers():
            raise RouterError(
                "worker",
                worker_url,
                f"still routed to after /remove_worker (answered {response.status_code} {response.text[:200]!r})",
                "read the router's journal",
            )

    def add(self, worker_url: str, timeout_s: float = ADD_TIMEOUT_S) -> None:
        """Route to ``worker_url`` again (the router health-checks it first); nothing to do when it is listed."""
        if worker_url in self.list_workers():
            return
        try:
            response = self._call("POST", "/add_worker", timeout_s=timeout_s, url=worker_url)
            answered = f"answered {response.status_code} {response.text[:200]!r}"
        except RouterError as exc:  # no answer within timeout_s: the router's health check of it still waits
            answered = exc.problem
        if worker_url not in self.list_workers():
            raise RouterError(
                "worker",
                worker_url,
                f"not added back to the router ({answered})",
                f"check the rig's API, then on the gateway: {add_worker_command(self.gateway_url, worker_url)}",
            )


def wait_idle(
    in_flight: Callable[[], float],
    worker_url: str,
    timeout_s: float = IDLE_TIMEOUT_S,
    poll_s: float = IDLE_POLL_S,
    settle_s: float = IDLE_SETTLE_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Until ``in_flight()`` (the rig's requests running or waiting) has read 0 for ``settle_s``."""
    start = clock()
    idle_since: Optional[float] = None
    last = None
    while True:
        now = clock()
        try:
            last = in_flight()
        except Exception as exc:  # an unreadable /metrics cannot say the rig is idle
            last, idle_since = f"unreadable ({type(exc).__name__}: {exc})", None
        else:
            if last == 0:
                idle_since = now if idle_since is None else idle_since
                if now - idle_since >= settle_s:
                    return
            else:
                idle_since = None
        if now - start >= timeout_s:
            raise RouterError(
                "worker",
                worker_url,
                f"still busy {timeout_s:.0f} s after it left the router (requests in flight: {last})",
                "let its long requests finish, then run again; it was put back in the router",
            )
        sleep(poll_s)


def drain(admin: RouterAdmin, worker_url: str, in_flight: Optional[Callable[[], float]] = None, **wait: Any) -> None:
    """Remove the worker, then wait until the rig finished what the router had sent it; on a wait that times
    out the worker is added back (it still serves its old release) and the RouterError raised."""
    admin.remove(worker_url)
    if in_flight is None:
        return
    try:
        wait_idle(in_flight, worker_url, **wait)
    except RouterError:
        admin.add(worker_url)
        raise


def restore(admin: RouterAdmin, worker_url: str) -> None:
    admin.add(worker_url)


@contextmanager
def drained(
    admin: RouterAdmin, worker_url: str, in_flight: Optional[Callable[[], float]] = None, **wait: Any
) -> Iterator[None]:
    """The worker out of the router for the block; back in only when the block ends without an exception
    (a rig whose upgrade failed stays out)."""
    drain(admin, worker_url, in_flight, **wait)
    yield
    restore(admin, worker_url)


# --- where the router and its workers are, from the inventory ----------------------------------------------------


def gateways(hosts: Mapping[str, Mapping]) -> list[str]:
    """The inventory's router hosts (group ROUTER_GROUP), in inventory order."""
    return [name for name, info in hosts.items() if ROUTER_GROUP in info.get("groups", ())]


def rig_worker_url(rig: str, data: Mapping[str, Any]) -> str:
    """The rig's serving API as the router on the gateway lists it: rigkit.router's one derivation (the router
    role starts the router with these URLs, so a drain names the worker exactly as the router knows it)."""

    knobs = rig_settings(dict(data)).stack.knobs
    return worker_url(worker_address(rig, data, knobs["bind_address"]), knobs["serving_port"])


def gateway_router_url(data: Mapping[str, Any]) -> str:
    """The router's base URL as a process on its gateway reaches it (rigkit.router.router_url, from the gateway's
    data): where the by-hand commands printed for it point."""

    return on_gateway(resolve(ROUTER_VARIABLES, dict(data)))


@contextmanager
def router_url(gateway: str, data: Mapping[str, Any]) -> Iterator[str]:
    """The router's base URL from the controller: through an SSH tunnel to the gateway when the router binds the
    gateway's loopback (its admin endpoints take no key and are never exposed), direct otherwise; a gateway named
    @local is the controller itself."""

    if gateway == LOCAL_HOST:
        yield gateway_router_url(data)
        return
    section = resolve(ROUTER_VARIABLES, dict(data))
    bind, port = section["router_bind_address"], section["router_port"]
    with serving_url(data, bind, port, inventory_name=gateway) as url:
        yield url
