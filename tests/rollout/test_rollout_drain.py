"""rigkit.rollout.drain inside the rollout, as data: the order of router calls and pyinfra runs per rig (drain ->
deploy, which smokes -> cache proof -> restore), a failed rig left out, the rollback rig by rig, the re-run that
puts a rig back, and the refusals. The fleet is test_rollout's (real captured pyinfra output, real renderings);
the router is a stand-in keeping its worker list (the real router's behaviour is tests/rollout/test_router_admin.py's)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from test_rollout_run import NEW, STOPPED_MID_DEPLOY, FakeFleet, host_data, rendering_hash

from rigkit.errors import ConfigError
from rigkit.rollout import drain as rollout_drain
from rigkit.rollout import run as rollout
from rigkit.rollout.plan import RolloutSettings
from rigkit.rollout.record import RolloutRecord, record_path

GATEWAY = "gw"
GATEWAY_ROUTER = "http://127.0.0.1:8300"  # the router as its gateway reaches it (router_port's default)
ALL_OK = STOPPED_MID_DEPLOY.replace("rig6", "rig8")  # the capture's failed rig renamed away: rig4, rig5 deploy fine


def worker(rig: str) -> str:
    return f"http://127.0.0.1:{8100 + int(rig[3:])}"  # the rig's loopback bind, as the lab's gateway reaches it


class FakeRouter:
    """The router's worker list across the rollout's sessions; every call lands in the shared event log."""

    def __init__(self, events: list, rigs):
        self.events, self.workers = events, [worker(rig) for rig in rigs]

    def admin(self, url, gateway_url=None):
        router = self

        class Admin:
            def __init__(self):
                self.gateway_url = gateway_url  # as router_session derives it from the gateway's data

            def list_workers(self):
                return list(router.workers)

            def remove(self, url):
                router.events.append(("remove", url))
                router.workers.remove(url)

            def add(self, url):
                router.events.append(("add", url))
                router.workers.append(url)

        return Admin()


class RoutedFleet(FakeFleet):
    def __init__(self, monkeypatch, rigs, output=ALL_OK):
        super().__init__(monkeypatch, output)
        self.events: list = []
        self.router = FakeRouter(self.events, rigs)
        monkeypatch.setattr(rollout_drain, "RouterAdmin", self.router.admin)
        monkeypatch.setattr(rollout_drain, "router_url", self.router_url)
        monkeypatch.setattr(rollout_drain, "rig_in_flight", self.in_flight)

    @contextmanager
    def router_url(self, gateway, data):
        assert gateway == GATEWAY
        yield "http://gateway-tunnel"

    @contextmanager
    def in_flight(self, rig, data):
        def reading():
            self.events.append(("idle?", rig))
            return 0

        yield reading

    def pyinfra(self, argv):
        rigs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--limit"]
        self.events.append((argv[-1], *rigs))
        return super().pyinfra(argv)

    def prove(self, rig, data, stack):
        self.events.append(("prove", rig))
        return super().prove(rig, data, stack)

    def steps(self) -> list:
        """The events with the idle polls folded into one ("idle", rig) per drain."""
        out = []
        for event in self.events:
            step = ("idle", event[1]) if event[0] == "idle?" else event
            if not out or out[-1] != step:
                out.append(step)
        return out


def roll(tmp_path, rigs, canary=1, batch=1, on_failure="leave"):
    hosts = {rig: {"data": host_data(rig, NEW), "groups": ["lab"]} for rig in rigs}
    hosts[GATEWAY] = {"data": {"ssh_hostname": "127.0.0.1"}, "groups": ["routers"]}
    return rollout.run_rollout(
        "inventory/fleet.py",
        "deploy.py",
        [],
        hosts,
        rigs,
        RolloutSettings(canary, batch, on_failure, True),
        records=tmp_path,
    )


@pytest.fixture(autouse=True)
def quick_idle(monkeypatch):
    monkeypatch.setattr(rollout_drain, "wait_idle", lambda reading, url: [reading() for _ in range(3)])


def test_each_rig_leaves_the_router_for_its_deploy_and_returns_after_smoke_and_proof(monkeypatch, tmp_path):
    fake = RoutedFleet(monkeypatch, ["rig4", "rig5"])
    status, summary = roll(tmp_path, ["rig4", "rig5"])
    assert status == 0, summary
    assert fake.steps() == [
        ("remove", worker("rig4")),
        ("idle", "rig4"),
        ("deploy.py", "rig4"),
        ("prove", "rig4"),
        ("add", worker("rig4")),
        ("remove", worker("rig5")),
        ("idle", "rig5"),
        ("deploy.py", "rig5"),
        ("add", worker("rig5")),
    ]
    assert sorted(fake.router.workers) == [worker("rig4"), worker("rig5")]
    flat = " ".join(summary.split())
    assert "router on gw: 2 rigs routed" in flat and f"rig5: back in the router ({worker('rig5')})" in flat


def test_a_failed_rig_stays_out_and_the_rollback_goes_rig_by_rig_through_the_router(monkeypatch, tmp_path):
    fake = RoutedFleet(monkeypatch, ["rig4", "rig5", "rig6"], output=STOPPED_MID_DEPLOY)  # rig6's deploy fails
    status, summary = roll(tmp_path, ["rig4", "rig5", "rig6"], on_failure="rollback")
    assert status == 1
    drained = lambda rig, run: [("remove", worker(rig)), ("idle", rig), (run, rig)]  # noqa: E731
    assert fake.steps() == [
        *drained("rig4", "deploy.py"),
        ("prove", "rig4"),
        ("add", worker("rig4")),
        *drained("rig5", "deploy.py"),
        ("add", worker("rig5")),
        *drained("rig6", "deploy.py"),  # failed: not added back
        *drained("rig4", "rollback.py"),
        ("add", worker("rig4")),
        *drained("rig5", "rollback.py"),
        ("add", worker("rig5")),
    ]
    assert worker("rig6") not in fake.router.workers
    flat = " ".join(summary.split())
    assert "rig6: left out of the router (it failed at" in flat
    assert "router on gw: 3 rigs routed" in flat  # as the rollout began, not as it ended (rig6 out)
    # the command that puts it back, whole on its own line (never wrapped: it is copied as it stands)
    assert f"    curl -X POST '{GATEWAY_ROUTER}/add_worker?url={worker('rig6')}'  # on gw" in summary.splitlines()
    record = RolloutRecord.from_json(record_path("inventory/fleet.py", tmp_path).read_text())
    assert record.out_of_router == {"rig6": [GATEWAY]}


def test_the_re_run_that_gets_a_left_out_rig_verified_puts_it_back(monkeypatch, tmp_path):
    fake = RoutedFleet(monkeypatch, ["rig4", "rig5", "rig6"], output=STOPPED_MID_DEPLOY)
    assert roll(tmp_path, ["rig4", "rig5", "rig6"])[0] == 1
    fake.events.clear()
    fake.output = STOPPED_MID_DEPLOY.replace("rig6", "rig8").replace("rig4", "rig6")  # rig6 deploys fine now
    status, summary = roll(tmp_path, ["rig4", "rig5", "rig6"])
    assert status == 0, summary
    assert fake.steps() == [("deploy.py", "rig6"), ("add", worker("rig6"))]  # out already: no second drain
    assert worker("rig6") in fake.router.workers
    record = RolloutRecord.from_json(record_path("inventory/fleet.py", tmp_path).read_text())
    assert record.out_of_router == {}


def test_a_stage_that_would_drain_every_routed_rig_is_refused_before_any_rig_is_touched(monkeypatch, tmp_path):
    fake = RoutedFleet(monkeypatch, ["rig4", "rig5"])
    with pytest.raises(ConfigError) as refused:
        roll(tmp_path, ["rig4", "rig5"], canary=0, batch=0)
    assert refused.value.field == "rollout_batch" and "no rig left to serve" in str(refused.value)
    assert "--batch 1" in str(refused.value)
    with pytest.raises(ConfigError) as canaries:
        roll(tmp_path, ["rig4", "rig5"], canary=2, batch=1)
    assert canaries.value.field == "rollout_canary"
    assert fake.events == [] and fake.runs == []
    assert roll(tmp_path, ["rig4", "rig5"], canary=1, batch=1)[0] == 0


def test_the_last_rig_the_router_routes_to_is_not_drained_for_a_rollback(monkeypatch, tmp_path):
    fake = RoutedFleet(monkeypatch, ["rig4", "rig6"], output=STOPPED_MID_DEPLOY)  # rig6's deploy fails
    status, summary = roll(tmp_path, ["rig4", "rig6"], on_failure="rollback")
    assert status == 1
    assert fake.router.workers == [worker("rig4")] and ("rollback.py", "rig4") not in fake.steps()
    assert fake.verified["rig4"] == rendering_hash("rig4", NEW)
    assert "rig4: not rolled back (it is the only rig the router on gw still routes to" in " ".join(summary.split())


def test_without_a_router_in_the_inventory_nothing_is_drained(monkeypatch, tmp_path):
    fake = RoutedFleet(monkeypatch, ["rig4", "rig5"])
    hosts = {rig: {"data": host_data(rig, NEW), "groups": ["lab"]} for rig in ["rig4", "rig5"]}
    status, summary = rollout.run_rollout(
        "inventory/fleet.py",
        "deploy.py",
        [],
        hosts,
        ["rig4", "rig5"],
        RolloutSettings(0, 0 + 2, "leave", True),
        records=tmp_path,
    )
    assert status == 0 and fake.steps() == [("deploy.py", "rig4", "rig5")] and "router" not in summary
