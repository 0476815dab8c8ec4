"""A rolling upgrade through the router loses no request (`rigkit deploy --batch 1` with a router in the inventory).

The router is the real vllm-router from .venv, started by this test on the controller (tests/router_process.py)
over the lab's two host-networked rigs (their APIs on 127.0.0.1:<serving_port>, which the controller shares), and
declared in a copy of the lab inventory as the gateway "@local" (group routers): rigkit.router_admin reaches it
directly, as it reaches a gateway's router through the SSH tunnel. While `rigkit deploy --batch 1` takes both rigs
from release 1 to release 2, a client loop sends a short completion through the router every 0.2 s and a watcher
reads the router's worker list and its per-worker request counter (vllm_router_processed_requests_total) as often:

- no request fails;
- each rig leaves the router once, the two windows do not overlap, and while a rig is out the router sends it
  nothing (its counter does not move); each rig serves release 2 afterwards and gets requests again.

Two vLLM restarts for the upgrade (one per rig, in turn), and two in parallel afterwards to put both rigs back on
release 1 (plain deploy.py, as the other lab tests expect the `deployed` release).
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
from rigkit.paths import REPO_ROOT
from test_fleet_lab import LAB_INVENTORY, models, serving_image_of

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

REQUEST_GAP_S = 0.2
WATCH_GAP_S = 0.2
# the drain waits until the rig's requests are done (rigkit.router_admin.IDLE_SETTLE_S); a 4-token CPU completion
# takes well under a second
SETTLED_S = 3.0


@pytest.fixture(scope="module")
def rigs(lab, deployed):
    shared = [rig for rig in lab.rigs if not rig.netns][:2]
    if len(shared) < 2:
        pytest.skip(f"needs 2 rigs on the host network, the lab has {len(shared)}")
    release_1 = lab.serving_image["releases"]["1"]
    assert [serving_image_of(rig) for rig in shared] == [release_1] * 2, "both rigs start on release 1"
    return shared


def worker_url(rig) -> str:
    return f"http://127.0.0.1:{rig.serving_port}"


@pytest.fixture(scope="module")
def router(rigs, lab, run_pyinfra):
    with RouterProcess([worker_url(rig) for rig in rigs], policy="round_robin") as process:
        yield process
    # back on release 1 for the tests after this one (both at once: no router watches any more)
    limits = [arg for rig in rigs for arg in ("--limit", rig.name)]
    result = run_pyinfra([*limits, "--data", f"serving_image={lab.serving_image['releases']['1']}"],
                         deploy="deploy.py")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


@pytest.fixture(scope="module")
def inventory(rigs, router, tmp_path_factory) -> Path:
    """The lab inventory's two rigs, and the router on the controller as the gateway."""
    path = tmp_path_factory.mktemp("inventory") / "router_lab.py"
    names = [rig.name for rig in rigs]
    path.write_text(
        "import runpy as _runpy\n"
        f"lab = [(_n, _d) for _n, _d in _runpy.run_path({str(LAB_INVENTORY)!r})['lab'] if _n in {names!r}]\n"
        f"routers = [('@local', {{'router_bind_address': '127.0.0.1', 'router_port': {router.port}}})]\n")
    return path


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


def test_a_rolling_upgrade_through_the_router_loses_no_request(lab, rigs, router, inventory, tmp_path):
    release_2 = lab.serving_image["releases"]["2"]
    rigkit = Path(sys.executable).with_name("rigkit")
    with Traffic(router, models(rigs[0])[0]) as traffic:
        traffic.served(10)  # traffic on both rigs before the rollout
        result = subprocess.run([str(rigkit), "deploy", str(inventory), "--batch", "1", "--data",
                                 f"serving_image={release_2}"], cwd=REPO_ROOT, capture_output=True, text=True,
                                timeout=3600, env={**os.environ, "RIGKIT_ROLLOUTS_DIR": str(tmp_path)})
        traffic.served(10)  # and after it
    output = result.stdout[-6000:] + result.stderr[-3000:]
    assert result.returncode == 0, output
    summary = " ".join(result.stdout.rsplit("--> rigkit rollout:", 1)[1].split())
    assert "router on @local: 2 rigs routed" in summary, summary
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
    (a_start, a_end), (b_start, b_end) = windows.values()
    assert a_end < b_start or b_end < a_start, f"both rigs out of the router at once: {windows}"
    for rig in rigs:
        assert f"{rig.name}: back in the router ({worker_url(rig)})" in summary, summary
