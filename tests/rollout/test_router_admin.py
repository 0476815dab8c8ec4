"""rigkit.rollout.router_admin against the REAL vllm-router (the pinned release in .venv, tests/router_process.py) in front
of two tests/fake_openai.py workers on loopback: a drained worker gets no request, is stopped (its streams cut,
as an engine going down cuts them) and started again on its port, and is added back, while a client loop through
the router counts every request that did not complete."""

from __future__ import annotations

import time

import pytest
import requests
from fake_openai import FakeOpenAI
from router_process import Loops, RouterProcess

from rigkit import metrics
from rigkit.errors import ConfigError
from rigkit.fleet.inventory import rigs_among
from rigkit.rollout import router_admin
from rigkit.rollout.router_admin import RouterAdmin, RouterError, drain, drained, restore, wait_idle

# short streams, each a few tens of ms, so a drain finds requests in flight
CHUNKS, TOKEN_GAP_S = 4, 0.03


def worker(port: int = 0) -> FakeOpenAI:
    fake = FakeOpenAI(port)
    fake.stream_chunks, fake.token_gap_s, fake.running_gauge = CHUNKS, TOKEN_GAP_S, True
    return fake.__enter__()


def stop(fake: FakeOpenAI) -> None:
    """The engine goes down: streams it still serves end mid-way, then it stops listening."""
    fake.drop_stream_after = 0
    fake.__exit__()


def in_flight_of(fake_url: str):
    return lambda: metrics.requests_in_flight(requests.get(f"{fake_url}/metrics", timeout=2).text)


class ClientLoop(Loops):
    """Completions through the router, back to back from two threads, until stopped; a request fails when it
    errs, answers non-200 or its stream ends without [DONE]."""

    def __init__(self, url: str):
        self.url, self.ok, self.failed = url, 0, []
        super().__init__(self._run, self._run)

    def _run(self) -> None:
        body = {"model": "tiny", "prompt": "drain me", "max_tokens": CHUNKS, "stream": True}
        while not self.stopping.is_set():
            try:
                response = requests.post(f"{self.url}/v1/completions", json=body, timeout=30)
                if response.status_code == 200 and "data: [DONE]" in response.text:
                    self.ok += 1
                else:
                    self.failed.append(f"{response.status_code} {response.text[-120:]!r}")
            except requests.RequestException as exc:
                self.failed.append(f"{type(exc).__name__}: {exc}")


def wait_for(condition, timeout_s: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture()
def two_workers():
    a, b = worker(), worker()
    try:
        with RouterProcess([a.url, b.url]) as router:
            yield router, a, b
    finally:
        for fake in (a, b):
            fake.__exit__()


def test_a_drained_worker_gets_nothing_while_it_is_replaced_and_no_request_fails(two_workers):
    router, a, b = two_workers
    admin = RouterAdmin(router.url)
    port = int(a.url.rpartition(":")[2])
    with ClientLoop(router.url) as loop:
        wait_for(lambda: len(a.completions) > 5 and len(b.completions) > 5, what="traffic on both workers")
        drain(admin, a.url, in_flight_of(a.url))
        assert a.url not in admin.list_workers()
        reached_old = len(a.completions)
        stop(a)
        served_by_b = len(b.completions)
        wait_for(lambda: len(b.completions) > served_by_b + 20, what="b serving alone")
        replacement = worker(port)  # the new release, on the rig's port
        try:
            time.sleep(0.5)
            assert replacement.completions == [] and len(a.completions) == reached_old
            restore(admin, a.url)
            wait_for(lambda: len(replacement.completions) > 5, what="the re-added worker's traffic")
        finally:
            loop.__exit__()
            replacement.__exit__()
    assert loop.failed == [], loop.failed[:5]
    assert loop.ok > 50
    assert set(admin.list_workers()) == {a.url, b.url}


def test_drained_puts_a_worker_back_only_when_its_block_succeeded(two_workers):
    router, a, b = two_workers
    admin = RouterAdmin(router.url)
    with drained(admin, b.url, in_flight_of(b.url)):
        assert admin.list_workers() == [a.url]
    assert set(admin.list_workers()) == {a.url, b.url}
    with pytest.raises(RuntimeError):
        with drained(admin, b.url, in_flight_of(b.url)):
            raise RuntimeError("the upgrade failed")
    assert admin.list_workers() == [a.url]  # a failed upgrade stays out


def test_a_drain_that_never_goes_idle_puts_the_worker_back(two_workers):
    router, a, b = two_workers
    admin = RouterAdmin(router.url)
    with pytest.raises(RouterError) as busy:
        drain(admin, a.url, lambda: 3, timeout_s=0.3, poll_s=0.05)
    assert "still busy" in str(busy.value) and "requests in flight: 3" in str(busy.value)
    assert a.url in admin.list_workers()


def test_refusals_name_the_worker_and_the_router(two_workers):
    router, a, b = two_workers
    admin = RouterAdmin(router.url)
    with pytest.raises(RouterError) as unknown:
        admin.remove("http://127.0.0.1:9")
    assert unknown.value.field == "worker" and a.url in str(unknown.value) and b.url in str(unknown.value)

    class IgnoresRemoves(RouterAdmin):
        """A router that answers a remove as 0.1.17 answers one for a URL it does not know: 200, nothing done."""

        def _call(self, method, path, timeout_s=None, **params):
            if path == "/remove_worker":
                return super()._call("GET", "/health")
            return super()._call(method, path, timeout_s, **params)

    with pytest.raises(RouterError) as kept:
        IgnoresRemoves(router.url).remove(a.url)
    assert "still routed to after /remove_worker" in str(kept.value)
    admin.remove(a.url)
    stop(a)
    with pytest.raises(RouterError) as refused:
        admin.add(a.url, timeout_s=1.0)
    assert "not added back" in str(refused.value) and "add_worker?url=" + a.url in str(refused.value)
    with pytest.raises(RouterError) as down:
        RouterAdmin(f"http://127.0.0.1:{router.prometheus_port + 1}", timeout_s=1).list_workers()
    assert "unreachable" in str(down.value)


def test_idle_means_zero_for_the_settle_time_and_a_busy_rig_times_out():
    now = [0.0]
    readings = iter([2, 0, 1, 0, 0, 0, 0])

    def clock():
        return now[0]

    def sleep(seconds):
        now[0] += seconds

    wait_idle(lambda: next(readings), "http://rig", poll_s=0.5, settle_s=1.0, clock=clock, sleep=sleep)
    assert now[0] == 2.5  # the 0 at 0.5 s did not count: a request followed it
    now[0] = 0.0
    with pytest.raises(RouterError) as busy:
        wait_idle(lambda: 1, "http://rig", timeout_s=5, clock=clock, sleep=sleep)
    assert now[0] == 5.0 and "still busy 5 s" in str(busy.value)
    with pytest.raises(RouterError) as unreadable:
        wait_idle(
            lambda: metrics.requests_in_flight("# no gauges\n"), "http://rig", timeout_s=1, clock=clock, sleep=sleep
        )
    assert "unreadable (MetricsError" in str(unreadable.value)


def test_in_flight_reads_a_real_vllm_scrape():
    from pathlib import Path

    text = (Path(__file__).parents[1] / "fixtures" / "metrics" / "00-idle.txt").read_text()
    assert metrics.requests_in_flight(text) == 0
    busy = text.replace(
        'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0',
        'vllm:num_requests_running{engine="0",model_name="tiny"} 2.0',
    )
    assert busy != text and metrics.requests_in_flight(busy) == 2


def test_where_the_router_and_the_rigs_are_from_the_inventory():
    hosts = {
        "rig1": {"data": {}, "groups": ["lab"]},
        "gw": {"data": {}, "groups": ["routers"]},
        "rig2": {"data": {}, "groups": []},
    }
    assert router_admin.gateways(hosts) == ["gw"]
    assert rigs_among(hosts, ["rig1", "gw", "rig2"]) == ["rig1", "rig2"]
    rig = {
        "serving_profile": "cpu-lab",
        "serving_image": "r/x@sha256:" + "1" * 64,
        "serving_port": 8101,
        "ssh_hostname": "10.0.0.5",
    }
    # the URL the router role starts the router with (rigkit.router): a loopback bind only where SSH is loopback too
    assert router_admin.rig_worker_url("rig1", {**rig, "ssh_hostname": "127.0.0.1"}) == "http://127.0.0.1:8101"
    with pytest.raises(ConfigError, match="cannot reach"):
        router_admin.rig_worker_url("rig1", rig)
    assert router_admin.rig_worker_url("rig1", {**rig, "bind_address": "0.0.0.0"}) == "http://10.0.0.5:8101"
    assert router_admin.rig_worker_url("rig1", {**rig, "bind_address": "10.1.0.5"}) == "http://10.1.0.5:8101"
    with router_admin.router_url("@local", {"router_port": 8399}) as url:
        assert url == "http://127.0.0.1:8399"
