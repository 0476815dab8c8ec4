"""Faults under load through the router (issue 28), benchmark-style: it prints its figures.

The real vllm-router (tests/router_process.py) on the controller, round_robin over the two host-network rigs as
`deployed` left them (release 1), started with the router role's own health checks (rigkit.router.HEALTH_FLAGS: a
worker that stops answering /health leaves the routing within ROUTER_UNHEALTHY_WITHIN_S). Two client threads send
completions through it back to back; a watcher samples the router's per-worker counter
(vllm_router_processed_requests_total) every WATCH_GAP_S.

The engine of the second rig is SIGKILLed mid-load (the serving container's init process, from inside the rig: a
crash, so compose's restart policy brings it back; `docker kill` would count as a stop by hand). Measured and
printed: requests sent and failed (each failure with its time from the kill), requests in flight at the kill, when
the router last sent the dead rig a request, when it sent it one again once its engine answered. Asserted: no more
requests fail than were in flight at the kill, none sent later than ROUTER_UNHEALTHY_WITHIN_S after it; the router
stops sending within that bound; the other rig keeps serving; traffic comes back without an operator once the
engine is healthy. Measured on the lab (2026-12-03, two runs): 114 and 122 sent, 0 failed, 2 in flight at the kill;
the router last sent rig2 a request 3.7 and 2.8 s after the kill (bound 8 s) and again 74.4 and 46.6 s after it (the
engine's restart). vllm-router retries a request its worker refused on another one: none reached the clients.

The lab's own router (`rigkit lab up --router`, rigkit.lab.router_server; started for the test and stopped again when
the lab ran none) under the same load, its health verdict per worker (vllm_router_worker_health) sampled too, and
`rigkit status inventory/lab_router.py`'s router section computed while the fault lasts:
- the second rig's whole systemd container stopped (`docker stop`: the rig shuts down, its engine and containers with
  it), then started again: no more requests fail than were in flight when the stop began; the router marks it down
  within ROUTER_UNHEALTHY_WITHIN_S of the stop's end (status: `rig2 unhealthy`, never `left out`); its own engine
  serves requests from the router again once the rig is back, without an operator; the lab's shape comes back.
- the router restarted behind its front (a gateway's reload after an upgrade or a config change), three times, then
  killed (SIGKILL): no request fails; the front starts it again; the new router sends to every rig.
Measured on the lab (2026-12-03, three runs each): a whole rig stopped: 350, 499, 267 sent, 0 failed, marked down +3.5 s
from the stop, serving through the router again 37-49 s after its start; the router restarted in place (before the
front, issue 43): connection refused for 2.1-4.0 s (21-40 requests of two clients pausing 0.2 s after each). Run with
the lab router's health flags left out, the first fails (rig2 never marked down); with the router restarted in place (no front), the second.
The figures' table: docs/fleet-operations.md ("Faults under load through the router").
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
from router_process import PROCESSED, WORKER_HEALTH, Loops, RouterProcess, per_worker
from test_fleet_lab import models

from rigkit import metrics
from rigkit.fleet.pyinfra_args import rigkit_executable
from rigkit.fleet.targets import select
from rigkit.lab import router_server
from rigkit.lab.router_server import LAB_ROUTER_METRICS_PORT, lab_router_url
from rigkit.lab.state import read_state, write_state
from rigkit.paths import REPO_ROOT
from rigkit.router import HEALTH_FLAGS, ROUTER_UNHEALTHY_WITHIN_S
from rigkit.serving.render import CONTAINER_NAME
from rigkit.status.router import LEFT_OUT, UNHEALTHY, UP, RouterStatus, router_statuses

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

CLIENTS = 2
WATCH_GAP_S = 0.2
MAX_TOKENS = 16
REQUEST_TIMEOUT_S = 60
BACK_TIMEOUT_S = 240  # the engine's restart (~40-70 s on this 2-core host) and the router's success threshold
SETTLE_S = 1.0  # a sample gap and a request still on the wire when the router marked the worker down
LAB_ROUTER_INVENTORY = REPO_ROOT / "inventory" / "lab_router.py"
REFUSED = "connection refused"
RESTARTS = 3
RESTART_GAP_S = 8.0  # load on the new router before the next event
FAILURE_PAUSE_S = 0.2  # a client that got no answer waits this long before the next (as docs/lab-router.md's loop)


def worker_url(rig) -> str:
    return f"http://127.0.0.1:{rig.serving_port}"


class Load(Loops):
    """CLIENTS threads sending completions through the router back to back, and the counter watcher."""

    def __init__(self, router: RouterProcess, model: str):
        self.router, self.model = router, model
        self.lock = threading.Lock()
        self.requests: list[tuple[float, float, str]] = []  # (start, end, "ok" or why it failed)
        self.samples: list[tuple[float, dict[str, float]]] = []  # the router's per-worker request counter
        self.health: list[tuple[float, dict[str, float]]] = []  # its health checks' verdict per worker (1 or 0)
        super().__init__(*([self._client] * CLIENTS), self._watcher)

    def _client(self) -> None:
        body = {"model": self.model, "prompt": "Faults under load:", "max_tokens": MAX_TOKENS}
        while not self.stopping.is_set():
            start = time.monotonic()
            try:
                response = requests.post(f"{self.router.url}/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S)
                outcome = (
                    "ok"
                    if response.status_code == 200 and response.json().get("choices")
                    else f"{response.status_code} {response.text[:120]!r}"
                )
            except (requests.RequestException, ValueError) as exc:
                outcome = f"{type(exc).__name__}: {REFUSED if '[Errno 111]' in str(exc) else str(exc)[-120:]}"
            with self.lock:
                self.requests.append((start, time.monotonic(), outcome))
            if outcome != "ok":
                self.stopping.wait(FAILURE_PAUSE_S)

    def _watcher(self) -> None:
        while not self.stopping.is_set():
            try:
                series = self.router.series()
            except (requests.RequestException, ValueError):
                pass
            else:
                now = time.monotonic()
                self.samples.append((now, series[PROCESSED]))
                self.health.append((now, series[WORKER_HEALTH]))
            self.stopping.wait(WATCH_GAP_S)

    def in_flight_at(self, moment: float) -> int:
        """Requests sent before ``moment`` that ended after it (read once the loop has moved past it)."""
        with self.lock:
            return sum(start <= moment < end for start, end, _ in self.requests)

    def count(self, worker: str, at: float) -> float:
        before = [counts.get(worker, 0.0) for when, counts in self.samples if when <= at]
        return before[-1] if before else 0.0

    def last_change(self, worker: str, after: float, until: float) -> float:
        """The time of the last sample in (after, until] at which the worker's counter moved (``after`` if none)."""
        last, previous = after, self.count(worker, after)
        for when, counts in self.samples:
            if after < when <= until and counts.get(worker, 0.0) != previous:
                last, previous = when, counts.get(worker, 0.0)
        return last

    def marked(self, worker: str, healthy: bool, after: float) -> float | None:
        """The first sample after ``after`` at which the router's health checks held the worker (un)healthy."""
        return next(
            (when for when, health in self.health if when > after and health.get(worker) == float(healthy)), None
        )

    def first_change(self, worker: str, after: float) -> float | None:
        base = self.count(worker, after)
        return next((when for when, counts in self.samples if when > after and counts.get(worker, 0.0) != base), None)


def kill_engine(rig, rig_exec) -> float:
    """SIGKILL the serving container's init process from inside the rig (a crash); the moment it was sent."""
    pid = rig_exec(rig, f"docker inspect -f '{{{{.State.Pid}}}}' {CONTAINER_NAME}").stdout.strip()
    assert pid.isdigit() and pid != "0", f"{rig.name}: {CONTAINER_NAME} is not running ({pid!r})"
    moment = time.monotonic()
    rig_exec(rig, f"kill -9 {pid}")
    return moment


def test_an_engine_killed_mid_load_costs_its_in_flight_requests_and_comes_back_without_an_operator(
    lab, deployed, rig_exec
):
    rigs = [rig for rig in lab.rigs if not rig.netns][:2]
    if len(rigs) < 2:
        pytest.skip("needs two rigs on host networking")
    victim = rigs[1]
    dead = worker_url(victim)
    with RouterProcess([worker_url(rig) for rig in rigs], policy="round_robin", extra=HEALTH_FLAGS) as router:
        with Load(router, models(rigs[0])[0]) as load:
            time.sleep(5)  # load on both rigs before the fault
            killed = kill_engine(victim, rig_exec)
            time.sleep(ROUTER_UNHEALTHY_WITHIN_S + 2)
            in_flight = load.in_flight_at(killed)
            deadline = time.monotonic() + BACK_TIMEOUT_S
            while load.first_change(dead, killed + ROUTER_UNHEALTHY_WITHIN_S + SETTLE_S) is None:
                assert time.monotonic() < deadline, f"{victim.name} got no request {BACK_TIMEOUT_S} s after the kill"
                time.sleep(1)
            time.sleep(3)  # requests on the rig that came back
        stopped = load.last_change(dead, killed, killed + ROUTER_UNHEALTHY_WITHIN_S + SETTLE_S + 5)
        back = load.first_change(dead, killed + ROUTER_UNHEALTHY_WITHIN_S + SETTLE_S)
    sent = len(load.requests)
    failures = [(start - killed, why) for start, _, why in load.requests if why != "ok"]
    print(
        f"\nfaults under load (router {router.url}, round_robin over {', '.join(r.name for r in rigs)}, "
        f"{CLIENTS} clients back to back, {MAX_TOKENS} tokens each; health: {' '.join(HEALTH_FLAGS)}):"
    )
    print(f"  requests sent {sent}, failed {len(failures)}, in flight at the kill {in_flight}")
    for offset, why in failures:
        print(f"  failed: sent {offset:+.1f} s from the kill: {why}")
    print(
        f"  the router last sent {victim.name} a request {stopped - killed:+.1f} s from the kill "
        f"(bound {ROUTER_UNHEALTHY_WITHIN_S} s); again {back - killed:+.1f} s from it (engine restarted, healthy)"
    )
    assert stopped - killed <= ROUTER_UNHEALTHY_WITHIN_S + SETTLE_S, "the router kept sending to the dead engine"
    # no more fail than died with the engine (vllm-router retries a refused request on another worker), none later
    assert len(failures) <= in_flight, (in_flight, failures)
    assert all(offset <= ROUTER_UNHEALTHY_WITHIN_S + SETTLE_S for offset, _ in failures), failures
    assert load.count(worker_url(rigs[0]), time.monotonic()) > load.count(worker_url(rigs[0]), killed)  # kept serving


# --- the lab's own router (`rigkit lab up --router`): the whole rig stopped, the router restarted --------------------


class LabRouter:
    """The lab router (rigkit.lab.router_server) as the Load above reads it: its URL and per-worker counter."""

    url = lab_router_url()

    @staticmethod
    def series() -> dict[str, dict[str, float]]:
        return per_worker(LAB_ROUTER_METRICS_PORT)


@pytest.fixture()
def lab_router(lab, deployed):
    """The lab router in front of the serving host-network rigs, as `rigkit lab up --router` runs it; stopped again
    afterwards when the lab ran none before (the lab's shape is restored)."""
    ran = router_server.router_pid() is not None
    state = read_state()
    state.router = router_server.ensure_router(lab.rigs, print)
    write_state(state)
    yield state.router
    if not ran:
        router_server.stop_router(print)
        state = read_state()
        state.router = None
        write_state(state)


def router_status_now() -> RouterStatus:
    """`rigkit status inventory/lab_router.py`'s router section, as the command computes it."""
    [status] = router_statuses(select(str(LAB_ROUTER_INVENTORY)).hosts)
    return status


def since(moment: float | None, origin: float) -> str:
    return "never" if moment is None else f"{moment - origin:+.1f} s"


def served_tokens(worker: str) -> float:
    """Tokens the worker's engine generated since it started (0 while it does not answer)."""
    try:
        return metrics.parse(requests.get(f"{worker}/metrics", timeout=2).text).generation_tokens
    except requests.RequestException:
        return 0.0


def wait_for(condition, timeout_s: float, what: str) -> float:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout_s:.0f} s"
        time.sleep(0.5)
    return time.monotonic()


def test_a_whole_rig_stopped_mid_load_costs_its_in_flight_requests_and_comes_back_without_an_operator(
    lab, lab_router, assert_stack_comes_back, rig_diagnostics
):
    behind = [rig for rig in lab.rigs if rig.name in lab_router["workers"]]
    if len(behind) < 2:
        pytest.skip(f"the lab router has {len(behind)} rig(s) behind it; needs two")
    victim, dead = behind[-1], lab_router["workers"][behind[-1].name]
    assert router_status_now().state == UP
    with Load(LabRouter(), models(behind[0])[0]) as load:
        time.sleep(5)  # load on every rig before the fault
        stopping = time.monotonic()
        # the rig's systemd container: its init shuts the rig down (the engine, its containers) as a host going down
        subprocess.run(["docker", "stop", victim.container], check=True, capture_output=True, timeout=120)
        stopped = time.monotonic()
        time.sleep(ROUTER_UNHEALTHY_WITHIN_S + 2)
        down_status = router_status_now()
        started = time.monotonic()
        subprocess.run(["docker", "start", victim.container], check=True, capture_output=True, timeout=120)
        try:  # the rig's own engine counts what it served since it started: only the router sends it requests
            back = wait_for(lambda: served_tokens(dead) > 0, BACK_TIMEOUT_S, f"a request served by {victim.name}")
        except AssertionError:
            print(rig_diagnostics(victim))
            raise
        time.sleep(3)
    in_flight = load.in_flight_at(stopping)
    last_sent = load.last_change(dead, stopping, started)
    marked_down, marked_up = load.marked(dead, False, stopping), load.marked(dead, True, started)
    sent = len(load.requests)
    failures = [(start - stopping, why) for start, _, why in load.requests if why != "ok"]
    print(
        f"\nwhole rig stopped under load (lab router {LabRouter.url}, round_robin over "
        f"{', '.join(lab_router['workers'])}, {CLIENTS} clients back to back, {MAX_TOKENS} tokens each):"
    )
    print(f"  requests sent {sent}, failed {len(failures)}, in flight when the stop began {in_flight}")
    for offset, why in failures:
        print(f"  failed: sent {offset:+.1f} s from the stop: {why}")
    print(
        f"  docker stop {victim.container} took {stopped - stopping:.1f} s; the router last sent {victim.name} a "
        f"request {last_sent - stopping:+.1f} s from the stop (bound: the stop's end + {ROUTER_UNHEALTHY_WITHIN_S} s)"
    )
    print(
        f"  the router's health checks marked {victim.name} down {since(marked_down, stopping)} from the stop "
        f"(bound: its end + {ROUTER_UNHEALTHY_WITHIN_S} s) and up again {since(marked_up, started)} from the start"
    )
    print(f"  rigkit status while it was down: {' | '.join(down_status.lines())}")
    print(f"  rig started again; its first request through the router {back - started:+.1f} s from the start")
    assert marked_down is not None and marked_down <= stopped + ROUTER_UNHEALTHY_WITHIN_S + SETTLE_S, marked_down
    assert down_status.rigs[victim.name] == UNHEALTHY, down_status.lines()
    assert last_sent <= stopped + ROUTER_UNHEALTHY_WITHIN_S + SETTLE_S, "the router kept sending to the stopped rig"
    assert len(failures) <= in_flight, (in_flight, failures)
    assert all(offset <= stopped - stopping + ROUTER_UNHEALTHY_WITHIN_S + SETTLE_S for offset, _ in failures)
    assert down_status.rigs[victim.name] != LEFT_OUT, "the router dropped the rig: it would need an operator"
    assert_stack_comes_back(victim)  # the lab's shape: the rig serves as before
    assert router_status_now().state == UP


def front_children(front_pid: int) -> list[int]:
    """The routers the lab router's front runs (one, but for a moment of a restart)."""
    return [int(child) for child in Path(f"/proc/{front_pid}/task/{front_pid}/children").read_text().split()]


def test_a_router_restart_and_a_killed_router_lose_no_request(lab, lab_router):
    """Issue 43: restarted in place, the router refused every connection for 2-5 s (47 of 51 requests); killed, nothing
    in the lab restarted it. Behind the front (rigkit/files/router_front.py, as the gateway's unit runs it) a restart
    (what `systemctl reload` does after an upgrade or a config change) and a SIGKILL of vllm-router lose no request:
    connections wait, accepted, for the next router."""
    workers = list(lab_router["workers"].values())
    front = router_server.router_pid()
    assert front, "the lab router runs no front"
    events = []
    with Load(LabRouter(), models(lab.rig(next(iter(lab_router["workers"]))))[0]) as load:
        time.sleep(5)
        for _ in range(RESTARTS):
            [before] = front_children(front)
            events.append(("restart", time.monotonic()))
            router_server.restart_router(print)
            wait_for(lambda: front_children(front) not in ([], [before]), 60, "a new router behind the front")
            time.sleep(RESTART_GAP_S)
        [router] = front_children(front)
        events.append(("kill -9", time.monotonic()))
        os.kill(router, signal.SIGKILL)
        wait_for(lambda: front_children(front) not in ([], [router]), 60, "the router started again by the front")
        time.sleep(RESTART_GAP_S)
    failures = [(start, why) for start, _, why in load.requests if why != "ok"]
    print(
        f"\nrouter restarted and killed under load (lab router {LabRouter.url} behind its front, over "
        f"{', '.join(lab_router['workers'])}, {CLIENTS} clients back to back, {MAX_TOKENS} tokens each; "
        f"breaker: {' '.join(HEALTH_FLAGS[8:])}):"
    )
    print(f"  requests sent {len(load.requests)}, failed {len(failures)}")
    for what, moment in events:
        during = [end - start for start, end, _ in load.requests if start <= moment + RESTART_GAP_S and end >= moment]
        print(f"  {what}: {len(during)} requests spanned it, the longest {max(during, default=0):.1f} s")
    for start, why in failures:
        print(f"  failed: {why}")
    assert failures == [], failures
    assert router_status_now().state == UP
    assert {worker for worker in load.samples[-1][1]} == set(workers)  # the new router sends to every rig


def test_a_plain_deploy_of_every_rig_behind_the_lab_router_stops_before_any_rig_restarts(lab, lab_router):
    """Issue 43: with the lab's router serving, `rigkit deploy inventory/lab.py` (no router declared) restarted both
    rigs at once and 276 of 322 requests failed, with no warning. The rigs know the router they are behind
    (`lab up --router` recorded it on them, as a gateway's deploy does): the run is refused before pyinfra starts."""
    behind = list(lab_router["workers"])
    if len(behind) < 2:
        pytest.skip(f"the lab router has {len(behind)} rig(s) behind it; needs two")
    started = {rig: container_started(lab.rig(rig)) for rig in behind}
    refused = subprocess.run(
        [rigkit_executable(), "deploy", str(REPO_ROOT / "inventory" / "lab.py"), *[f"--limit={rig}" for rig in behind]],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(
        f"\nrigkit deploy inventory/lab.py behind the lab router: exit {refused.returncode}: {refused.stderr.strip()}"
    )
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr
    assert f"{', '.join(behind)} were last deployed behind the router on @local" in refused.stderr
    assert "pass --all-at-once to restart them together anyway" in refused.stderr
    assert {rig: container_started(lab.rig(rig)) for rig in behind} == started  # nothing restarted


def container_started(rig) -> str:
    """When the rig's serving container last started (docker inspect inside the rig)."""
    return subprocess.run(
        ["docker", "exec", rig.container, "docker", "inspect", "-f", "{{.State.StartedAt}}", CONTAINER_NAME],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
