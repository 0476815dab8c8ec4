"""rigkit status's router section against the REAL vllm-router (the pinned release in .venv, tests/router_process.py)
in front of two tests/fake_openai.py workers on loopback: up with both rigs healthy, a rig left out (named with the
command that adds it back), the router down; and the command's exit status with it."""

from __future__ import annotations

import argparse
import json

import pytest
import requests
from fake_openai import FakeOpenAI
from router_process import RouterProcess

from rigkit.commands import status as status_command
from rigkit.fleet.targets import Targets
from rigkit.router import CONTROLLER_HOST
from rigkit.status import router as router_status
from rigkit.status.router import DEGRADED, DOWN, HEALTHY, LEFT_OUT, UNHEALTHY, UP, judge, router_statuses

IMAGE = "r/x@sha256:" + "1" * 64


def rig(port: int) -> dict:
    return {
        "data": {
            "serving_profile": "cpu-lab",
            "serving_image": IMAGE,
            "serving_port": port,
            "ssh_hostname": "127.0.0.1",
        },
        "groups": ["lab"],
    }


def inventory(workers, router_port: int) -> dict:
    hosts = {f"rig{index}": rig(int(fake.url.rsplit(":", 1)[1])) for index, fake in enumerate(workers, 1)}
    hosts[CONTROLLER_HOST] = {"data": {"router_port": router_port}, "groups": ["routers"]}
    return hosts


@pytest.fixture()
def fleet():
    a, b = FakeOpenAI().__enter__(), FakeOpenAI().__enter__()
    try:
        with RouterProcess([a.url, b.url]) as router:
            yield router, inventory([a, b], router.port), b
    finally:
        for fake in (a, b):
            fake.__exit__()


def test_the_router_up_with_every_rig_healthy_then_a_rig_left_out(fleet):
    router, hosts, b = fleet
    [status] = router_statuses(hosts)
    assert (status.state, status.rigs, status.actions) == (UP, {"rig1": HEALTHY, "rig2": HEALTHY}, [])
    assert status.lines() == [f"router @local {router.url}: up; rigs: rig1 healthy, rig2 healthy"]

    requests.post(f"{router.url}/remove_worker", params={"url": b.url}, timeout=10)
    [status] = router_statuses(hosts)
    assert (status.state, status.rigs["rig2"]) == (DEGRADED, LEFT_OUT)
    assert status.actions == [
        f"rig2 gets no request until it is added back; on @local: curl -X POST '{router.url}/add_worker?url={b.url}'"
    ]


def test_a_router_that_does_not_answer_is_down_and_says_what_to_do(fleet):
    router, hosts, _ = fleet
    router.__exit__()
    [status] = router_statuses(hosts)
    assert (status.state, status.rigs) == (DOWN, {"rig1": "-", "rig2": "-"})
    assert status.error == "connection refused"
    assert status.lines()[0] == (
        f"router @local {router.url}: down (connection refused): clients of the router get no answer"
    )
    assert "rigkit lab up --router" in status.lines()[1]
    hosts["gw"] = {"data": {"ssh_hostname": "10.0.0.9"}, "groups": ["routers"]}
    assert router_status.start_hint("gw") == (
        "on gw: systemctl status rigkit-router.service (systemd restarts it; it answers once its workers do)"
    )


@pytest.mark.parametrize(
    "workers, expected_state, expected_rigs, undeclared",
    [
        ({"http://127.0.0.1:1": True, "http://127.0.0.1:2": True}, UP, {"a": HEALTHY, "b": HEALTHY}, []),
        ({"http://127.0.0.1:1": True, "http://127.0.0.1:2": False}, DEGRADED, {"a": HEALTHY, "b": UNHEALTHY}, []),
        ({"http://127.0.0.1:1": True, "http://127.0.0.1:9": True}, DEGRADED, {"a": HEALTHY, "b": LEFT_OUT}, ["9"]),
    ],
)
def test_the_routers_workers_against_the_declared_rigs(workers, expected_state, expected_rigs, undeclared):
    status = judge("gw", "http://127.0.0.1:8000", {"a": "http://127.0.0.1:1", "b": "http://127.0.0.1:2"}, workers)
    assert (status.state, status.rigs) == (expected_state, expected_rigs)
    assert [url.rsplit(":", 1)[1] for url in status.undeclared] == undeclared


def test_a_rig_that_cannot_be_a_worker_says_why():
    hosts = {"rig1": rig(8101), "gw": {"data": {}, "groups": ["routers"]}}
    hosts["rig1"]["data"]["ssh_hostname"] = "10.0.0.5"  # its API on its own loopback: the gateway cannot reach it
    [status] = router_statuses(hosts, ask=lambda gateway, data: {})
    assert status.state == DEGRADED and status.rigs["rig1"].startswith("no worker: rig1.bind_address=")


def test_the_command_prints_the_router_and_fails_while_it_is_down(fleet, monkeypatch, capsys):
    router, hosts, _ = fleet
    monkeypatch.setattr(status_command, "select", lambda *args: Targets("inv.py", hosts, ["rig1", "rig2"]))
    monkeypatch.setattr(status_command, "fleet_status", lambda targets: [])  # the rigs' side: tests/status/
    args = argparse.Namespace(inventory="inv.py", limit=[], data=[], json=False)
    assert status_command.run(args) == 0
    assert f"router @local {router.url}: up; rigs: rig1 healthy, rig2 healthy" in capsys.readouterr().out
    assert status_command.run(argparse.Namespace(**{**vars(args), "json": True})) == 0
    [routed] = json.loads(capsys.readouterr().out)["routers"]
    assert (routed["gateway"], routed["state"], routed["rigs"]) == ("@local", UP, {"rig1": HEALTHY, "rig2": HEALTHY})
    router.__exit__()
    assert status_command.run(args) == 1
    assert f"router @local {router.url}: down" in capsys.readouterr().out
