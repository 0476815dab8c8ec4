"""A rolling upgrade through the router loses no request (`rigkit deploy --batch 1` with a router in the inventory).

The router is the real vllm-router from .venv, started by this test on the controller (tests/router_process.py)
over all three lab rigs, and declared in a copy of the lab inventory as the gateway "@local" (group routers):
rigkit.router_admin reaches it directly, as it reaches a gateway's router through the SSH tunnel. rig1 and rig2
share this machine's network (their APIs on 127.0.0.1:<serving_port>); rig3 lives in its own network namespace, so
its API binds 0.0.0.0 behind the API firewall (as tests/lab/test_api_firewall_lab.py deploys it) and the router
reaches it at http://<rig address>:<serving_port> from the host end of its veth, the address the firewall allows
(the router runs on the controller: the same source as the deploy's SSH session). While `rigkit deploy --batch 1`
takes the three rigs from release 1 to release 2, one at a time, a client loop sends a short completion through
the router every 0.2 s and a watcher reads the router's worker list and its per-worker request counter
(vllm_router_processed_requests_total) as often:

- no request fails;
- each rig leaves the router once, no two windows overlap, and while a rig is out the router sends it nothing
  (its counter does not move); each rig serves release 2 afterwards and gets requests again.

vLLM starts: one before (rig3 rebound to 0.0.0.0 behind its firewall, still release 1: rig1 and rig2 stay as
the `deployed` fixture left them), three for the upgrade (one per rig, in turn), and three in parallel afterwards
with the usual data (plain deploy.py): release 1 everywhere, rig3 on its loopback with no firewall, as the lab
tests after this one expect.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from router_process import Loops, RouterProcess
from rigkit.firewall import API_FIREWALL
from rigkit.paths import REPO_ROOT
from test_fleet_lab import LAB_INVENTORY, models, serving_image_of

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

REQUEST_GAP_S = 0.2
WATCH_GAP_S = 0.2
# the drain waits until the rig's requests are done (rigkit.router_admin.IDLE_SETTLE_S); a 4-token CPU completion
# takes well under a second
SETTLED_S = 3.0
DEPLOY_TIMEOUT_S = 1800


def worker_url(rig) -> str:
    """The rig's API as the router on the controller reaches it: the shared loopback, or a netns rig's address."""
    return f"http://{rig.rig_address if rig.netns else '127.0.0.1'}:{rig.serving_port}"


def exposure(rig) -> dict:
    """A netns rig's host data for the router: its API on every address, firewalled to loopback and the host end
    of its veth (where the router on the controller connects from, declared rather than left to the deploy's
    SSH session, which comes from the same address)."""
    return {"bind_address": "0.0.0.0", "api_firewall": True, "api_allowed_sources": [rig.host_address]}


def write_inventory(path: Path, host_data, rigs, router_port: int | None = None) -> Path:
    """The lab inventory's data of ``rigs`` (group lab), each netns rig exposed to the router; with ``router_port``,
    the router on the controller as the gateway."""
    lab = [(rig.name, {**host_data[rig.name], **(exposure(rig) if rig.netns else {})}) for rig in rigs]
    text = f"lab = {lab!r}\n"
    if router_port is not None:
        text += f"routers = [('@local', {{'router_bind_address': '127.0.0.1', 'router_port': {router_port}}})]\n"
    path.write_text(text)
    return path


def api_exposure(rig, rig_exec) -> tuple[bool, str]:
    """Whether the rig's API firewall table is loaded, and the address its API listens on ("" when it does not)."""
    loaded = API_FIREWALL.table in rig_exec(rig, "nft list tables", check=False).stdout
    fields = rig_exec(rig, f"ss -ltnH 'sport = :{rig.serving_port}'").stdout.split()
    return loaded, fields[3].rsplit(":", 1)[0] if len(fields) > 3 else ""


def deploy(run_pyinfra, rigs, inventory: Path | str = LAB_INVENTORY, data=()) -> None:
    limits = [arg for rig in rigs for arg in ("--limit", rig.name)]
    result = run_pyinfra([*limits, *data], inventory=inventory, deploy="deploy.py", timeout=DEPLOY_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


@pytest.fixture(scope="module")
def rigs(lab, deployed, netns_rig, lab_host_data, run_pyinfra, rig_exec, tmp_path_factory):
    """The two host-network rigs as `deployed` left them and the netns rig exposed to the router, all on release 1;
    afterwards all three on the usual deploy again."""
    shared = [rig for rig in lab.rigs if not rig.netns][:2]
    if len(shared) < 2:
        pytest.skip(f"needs 2 rigs on the host network, the lab has {len(shared)}")
    rigs = [*shared, netns_rig]
    release_1 = lab.serving_image["releases"]["1"]
    assert [serving_image_of(rig) for rig in rigs] == [release_1] * 3, "the three rigs start on release 1"
    try:
        exposed = write_inventory(tmp_path_factory.mktemp("exposed") / "exposed.py", lab_host_data, rigs)
        deploy(run_pyinfra, [netns_rig], exposed)
        assert api_exposure(netns_rig, rig_exec) == (True, "0.0.0.0")
        yield rigs
    finally:
        # back on release 1, rig3 on its loopback with no firewall, for the tests after this one (all three at
        # once: no router watches any more)
        deploy(run_pyinfra, rigs, data=["--data", f"serving_image={release_1}"])
        assert api_exposure(netns_rig, rig_exec) == (False, "127.0.0.1"), "the netns rig is not back on its loopback"


@pytest.fixture(scope="module")
def router(rigs):
    with RouterProcess([worker_url(rig) for rig in rigs], policy="round_robin") as process:
        yield process


@pytest.fixture(scope="module")
def inventory(rigs, router, lab_host_data, tmp_path_factory) -> Path:
    """The three rigs (rig3 exposed as it now runs), and the router on the controller as the gateway."""
    return write_inventory(tmp_path_factory.mktemp("inventory") / "router_lab.py", lab_host_data, rigs, router.port)


class Traffic(Loops):
    """The client loop and the watcher, in threads, until the block ends."""

    def __init__(self, router: RouterProcess, model: str):
        self.router, self.model = router, model
        self.ok = 0
        self.failed: list[str] = []
        # (time, listed worker URLs, processed counter by worker URL)
        self.watch: list[tuple[float, list[str], dict[str, float]]] = []
        super().__init__(self._requests, self._watcher)

    def _requests(self) -> None:
        body = {"model": self.model, "prompt": "The fleet serves as one:", "max_tokens": 4}
        while not self.stopping.is_set():
            try:
                response = requests.post(f"{self.router.url}/v1/completions", json=body, timeout=60)
                if response.status_code == 200 and response.json().get("choices"):
                    self.ok += 1
                else:
                    self.failed.append(f"{time.monotonic():.1f}: {response.status_code} {response.text[:200]!r}")
            except (requests.RequestException, ValueError) as exc:
                self.failed.append(f"{time.monotonic():.1f}: {type(exc).__name__}: {exc}")
            self.stopping.wait(REQUEST_GAP_S)

    def _watcher(self) -> None:
        while not self.stopping.is_set():
            try:
                listed = requests.get(f"{self.router.url}/list_workers", timeout=5).json()["urls"]
                self.watch.append((time.monotonic(), listed, self.router.processed()))
            except (requests.RequestException, ValueError, KeyError):
                pass  # a missed sample widens nothing: windows are read from the samples there are
            self.stopping.wait(WATCH_GAP_S)

    def served(self, more: int, timeout_s: float = 60.0) -> None:
        """Until ``more`` requests more than now completed."""
        target, deadline = self.ok + more, time.monotonic() + timeout_s
        while self.ok < target and not self.failed:
            assert time.monotonic() < deadline, f"{self.ok} requests served, {target} expected"
            time.sleep(REQUEST_GAP_S)

    def windows(self, worker: str) -> list[list[int]]:
        """Runs of consecutive samples in which ``worker`` was not listed, as sample indices."""
        runs: list[list[int]] = []
        for index, (_, listed, _) in enumerate(self.watch):
            if worker in listed:
                continue
            if runs and runs[-1][-1] == index - 1:
                runs[-1].append(index)
            else:
                runs.append([index])
        return runs


def test_a_rolling_upgrade_through_the_router_loses_no_request(lab, rigs, router, inventory, rig_exec, tmp_path):
    release_2 = lab.serving_image["releases"]["2"]
    rigkit = Path(sys.executable).with_name("rigkit")
    with Traffic(router, models(rigs[0])[0]) as traffic:
        traffic.served(10)  # traffic on every rig before the rollout
        routed_before = router.processed()
        result = subprocess.run([str(rigkit), "deploy", str(inventory), "--batch", "1", "--data",
                                 f"serving_image={release_2}"], cwd=REPO_ROOT, capture_output=True, text=True,
                                timeout=3600, env={**os.environ, "RIGKIT_ROLLOUTS_DIR": str(tmp_path)})
        traffic.served(10)  # and after it
    output = result.stdout[-6000:] + result.stderr[-3000:]
    assert result.returncode == 0, output
    summary = " ".join(result.stdout.rsplit("--> rigkit rollout:", 1)[1].split())
    assert f"router on @local: {len(rigs)} rigs routed" in summary, summary
    # round_robin reached each rig, rig3 through its firewall, before any rig left
    assert all(routed_before.get(worker_url(rig), 0.0) > 0 for rig in rigs), routed_before
    assert traffic.failed == [], (traffic.failed[:10], output)
    assert traffic.ok > 50, traffic.ok

    windows = {}
    for rig in rigs:
        worker = worker_url(rig)
        out = traffic.windows(worker)
        assert len(out) == 1, f"{rig.name} left the router {len(out)} times: {out}"
        window = out[0]
        first, last = window[0], window[-1]
        assert 0 < first and last < len(traffic.watch) - 1, "the watch saw it in the router before and after"
        # a request sent just before the remove may finish (and be counted) early in the window; once the drain's
        # wait is over (SETTLED_S in) until it came back, the router's count for it must not move
        settled = first + int(SETTLED_S / WATCH_GAP_S)
        assert settled < last, f"{rig.name} was out of the router for {len(window)} samples only"
        before = traffic.watch[settled][2].get(worker, 0.0)
        during = [traffic.watch[index][2].get(worker, 0.0) for index in window[window.index(settled):]]
        assert all(count == before for count in during), f"{rig.name} got requests while out: {before} {during}"
        assert traffic.watch[-1][2].get(worker, 0.0) > before, f"{rig.name} got no request after it came back"
        assert serving_image_of(rig) == release_2
        windows[rig.name] = (traffic.watch[first][0], traffic.watch[last][0])
    spans = sorted(windows.values())
    assert all(end < start for (_, end), (start, _) in zip(spans, spans[1:])), \
        f"two rigs out of the router at once: {windows}"
    # the rollout's deploy kept the netns rig exposed as before (its firewall loaded, its API on 0.0.0.0)
    for rig in rigs:
        if rig.netns:
            assert api_exposure(rig, rig_exec) == (True, "0.0.0.0"), rig.name
    for rig in rigs:
        assert f"{rig.name}: back in the router ({worker_url(rig)})" in summary, summary
