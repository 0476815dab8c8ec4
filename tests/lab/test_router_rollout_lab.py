"""The fleet behind the router on the lab: the netns rig exposed to it behind the API firewall, then a rolling
upgrade of all three rigs through it and a rolling rollback of two of them, neither losing a request (issue 15).

rig1 and rig2 share this machine's network (their APIs on 127.0.0.1:<serving_port>); rig3 lives in its own
network namespace, so the router on the controller can reach it only once its API binds beyond loopback. The
module's first deploy gives rig3 bind_address 0.0.0.0 and api_firewall in its host data (a copy of the lab
inventory): its API then answers the host end of its veth (10.213.N.1: the controller, where the router runs;
allowed as the address the deploy's SSH session comes from, no api_allowed_sources declared) and its own loopback,
and drops anything else. "Anything else" is the rig's own address seen from inside the rig (source 10.213.N.2, not
allowed): the lab has no third host on the veth's /30. Only the netns rig takes the firewall: rigs on host
networking share this machine's network namespace, where nft rules would be this machine's firewall
(rigkit.settings.firewalls.refuse_on_shared_network refuses them; a test checks this machine's namespace holds no rigkit table).

The rolling upgrade: the real vllm-router from .venv, started by this test on the controller (tests/router_process.py)
over the three rigs (rig3 at http://<rig address>:<serving_port>), declared in the inventory as the gateway "@local"
(group routers): rigkit.rollout.router_admin reaches it directly, as it reaches a gateway's router through the SSH tunnel.
While `rigkit deploy --batch 1` takes the three rigs from release 1 to release 2, one at a time, a client loop sends
a short completion through the router every 0.2 s and a watcher reads the router's worker list and its per-worker
request counter (vllm_router_processed_requests_total) as often:

- no request fails, and before the rollout every rig got requests through the router (rig3 through its firewall);
- each rig leaves the router once, no two windows overlap, and while a rig is out the router sends it nothing
  (its counter does not move); each rig serves release 2 afterwards and gets requests again.

The rolling rollback (rigkit.rollout.rollback), under the same loop and watcher: `rigkit deploy --deploy rollback.py
--batch 1 --limit rig1 --limit rig2` takes rig1 and rig2 back to release 1 (the verified rendering each ran before
the upgrade), one at a time. No request fails; each of the two leaves the router once, in turn, gets nothing while
out and requests again once back, its ledger's current entry a rollback whose smoke passed; rig3 never leaves the
router, keeps getting requests and stays on release 2.

The tests run in file order: the firewall's, on rig3 as exposed on release 1 (a re-run of that deploy changes
nothing), then the upgrade, then the rollback (it starts from where the upgrade left the rigs and says so when they
are not there). vLLM starts: one for rig3's new bind, three for the upgrade (one per rig, in turn), two for the
rollback (rig1, rig2, in turn), and at the end, in parallel, those the usual data (plain deploy.py) needs: release 1
everywhere, rig3 on its loopback with its firewall removed, as the lab tests after this module expect (rig1 and rig2,
rolled back to the rendering they ran before, restart only if that differs from what the usual data renders).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import requests
from router_process import Loops, RouterProcess
from test_fleet_lab import LAB_INVENTORY, ledger, models, serving_image_of

from rigkit.firewall import API_FIREWALL
from rigkit.fleet.pyinfra_args import rigkit_executable
from rigkit.lab.pyinfra_output import parse_results
from rigkit.paths import REPO_ROOT
from rigkit.remote.tunnel import serving_url
from rigkit.serving.ledger import ROLLBACK_KIND, SMOKE_PASS

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

REQUEST_GAP_S = 0.2
WATCH_GAP_S = 0.2
# the drain waits until the rig's requests are done (rigkit.rollout.router_admin.IDLE_SETTLE_S); a 4-token CPU completion
# takes well under a second
SETTLED_S = 3.0
DEPLOY_TIMEOUT_S = 1800
DROPPED_WITHIN_S = 3  # a dropped SYN never answers: curl gives up after this
# a netns rig's host data for the router: its API on every address, behind the API firewall (which allows the
# controller, where the router runs, from the deploy's own SSH session)
EXPOSED = {"bind_address": "0.0.0.0", "api_firewall": True}


def worker_url(rig) -> str:
    """The rig's API as the router on the controller reaches it: the shared loopback, or a netns rig's address."""
    return f"http://{rig.rig_address if rig.netns else '127.0.0.1'}:{rig.serving_port}"


def write_inventory(path: Path, host_data, rigs, router_port: int | None = None) -> Path:
    """The lab inventory's data of ``rigs`` (group lab), each netns rig EXPOSED; with ``router_port``, the router
    on the controller as the gateway."""
    lab = [(rig.name, {**host_data[rig.name], **(EXPOSED if rig.netns else {})}) for rig in rigs]
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


def deploy(run_pyinfra, rigs, inventory: Path | str = LAB_INVENTORY, data=()) -> subprocess.CompletedProcess:
    limits = [arg for rig in rigs for arg in ("--limit", rig.name)]
    result = run_pyinfra([*limits, *data], inventory=inventory, deploy="deploy.py", timeout=DEPLOY_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return result


def host_network_pair(lab) -> list:
    return [rig for rig in lab.rigs if not rig.netns][:2]


@pytest.fixture(scope="module")
def exposed(lab, deployed, netns_rig, lab_host_data, run_pyinfra, rig_exec, tmp_path_factory) -> Path:
    """The netns rig EXPOSED (release 1, as `deployed` left it otherwise); the inventory that says so. Afterwards
    every rig of this module back on the usual deploy: one run, the upgraded rigs restarting in parallel."""
    rigs = [*host_network_pair(lab), netns_rig]
    inventory = write_inventory(tmp_path_factory.mktemp("exposed") / "exposed.py", lab_host_data, rigs)
    try:
        deploy(run_pyinfra, [netns_rig], inventory)
        yield inventory
    finally:
        deploy(run_pyinfra, rigs, data=["--data", f"serving_image={lab.serving_image['releases']['1']}"])
        left = rig_exec(
            netns_rig,
            f"ls {API_FIREWALL.ruleset_path} 2>&1; systemctl is-enabled {API_FIREWALL.unit_name} 2>&1",
            check=False,
        ).stdout
        assert "No such file" in left, left
        assert api_exposure(netns_rig, rig_exec) == (False, "127.0.0.1"), "the netns rig is not back on its loopback"


# --- the netns rig's API behind its firewall -------------------------------------------------------------------


def _drops(rig, rig_exec) -> int:
    chain = rig_exec(rig, f"nft list chain inet {API_FIREWALL.table} {API_FIREWALL.chain}").stdout
    return int(re.search(r"counter packets (\d+) bytes \d+ drop", chain).group(1))


def _http_code_in_rig(rig, rig_exec, url: str) -> str:
    """curl from inside the rig's namespace; "000" when nothing answered within DROPPED_WITHIN_S."""
    result = rig_exec(rig, f"curl -s -o /dev/null -m {DROPPED_WITHIN_S} -w '%{{http_code}}' {url}", check=False)
    return result.stdout.strip()


def test_the_ruleset_allows_the_controller_seen_in_the_ssh_session(netns_rig, exposed, rig_exec):
    # no api_allowed_sources declared: the host end came from the deploy's own SSH_CONNECTION
    ruleset = rig_exec(netns_rig, f"cat {API_FIREWALL.ruleset_path}").stdout
    assert f"ip saddr {{ {netns_rig.host_address} }} accept" in ruleset, ruleset
    assert f"tcp dport {{ {netns_rig.serving_port} }} jump {API_FIREWALL.chain}" in ruleset
    assert rig_exec(netns_rig, f"systemctl is-enabled {API_FIREWALL.unit_name}").stdout.strip() == "enabled"
    assert api_exposure(netns_rig, rig_exec) == (True, "0.0.0.0")


def test_the_api_answers_the_host_end_directly(netns_rig, exposed, lab_host_data, serving_image):
    # bind 0.0.0.0: serving_url goes straight to the rig's address, from 10.213.N.1, the allowed source
    with serving_url(
        lab_host_data[netns_rig.name], bind="0.0.0.0", port=netns_rig.serving_port, inventory_name=netns_rig.name
    ) as url:
        assert url == worker_url(netns_rig)
        models_ = requests.get(f"{url}/v1/models", timeout=30)
    models_.raise_for_status()
    assert [entry["id"] for entry in models_.json()["data"]] == [serving_image["served_model_name"]]


def test_another_source_is_dropped_and_loopback_answers(netns_rig, exposed, rig_exec):
    port = netns_rig.serving_port
    before = _drops(netns_rig, rig_exec)
    # from inside the rig to its own address: source 10.213.N.2, not allowed
    assert _http_code_in_rig(netns_rig, rig_exec, f"http://{netns_rig.rig_address}:{port}/v1/models") == "000"
    assert _drops(netns_rig, rig_exec) > before  # the firewall dropped it, not a missing listener
    assert _http_code_in_rig(netns_rig, rig_exec, f"http://127.0.0.1:{port}/v1/models") == "200"


def test_ssh_still_works(netns_rig, exposed, ssh_run):
    status, out, _ = ssh_run(netns_rig, "echo reachable")
    assert (status, out.strip()) == (0, "reachable")


def test_a_second_run_changes_nothing(netns_rig, exposed, run_pyinfra):
    again = deploy(run_pyinfra, [netns_rig], exposed)
    total = parse_results(again.stdout + again.stderr)["Grand total"]  # pyinfra writes the table to stderr
    assert (total.success, total.error) == (0, 0), again.stdout[-4000:] + again.stderr[-3000:]


def test_this_machines_namespace_holds_no_rigkit_table(lab, netns_rig, exposed, rig_exec):
    # a host-network rig runs nft in this machine's own namespace: rigkit's table must not be there
    shared = host_network_pair(lab)
    if not shared:
        pytest.skip("no rig on host networking in this lab")
    tables = rig_exec(shared[0], "nft list tables").stdout
    assert API_FIREWALL.table not in tables, tables


# --- a rolling upgrade of the three rigs through the router ----------------------------------------------------


@pytest.fixture(scope="module")
def rigs(lab, exposed, netns_rig):
    """The two host-network rigs as `deployed` left them and the netns rig exposed, all on release 1."""
    shared = host_network_pair(lab)
    if len(shared) < 2:
        pytest.skip(f"needs 2 rigs on the host network, the lab has {len(shared)}")
    rigs = [*shared, netns_rig]
    release_1 = lab.serving_image["releases"]["1"]
    assert [serving_image_of(rig) for rig in rigs] == [release_1] * 3, "the three rigs start on release 1"
    return rigs


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


def rigkit_deploy_under_traffic(router: RouterProcess, rigs, inventory: Path, args, rollouts: Path):
    """`rigkit deploy INVENTORY *args` while Traffic runs through the router, requests served before it starts and
    after it ends, asserted to succeed and to lose no request; (traffic, the router's count per worker before it
    started, the command's result)."""
    rigkit = Path(rigkit_executable())
    with Traffic(router, models(rigs[0])[0]) as traffic:
        traffic.served(10)  # traffic on every rig before the command
        routed_before = router.processed()
        result = subprocess.run(
            [str(rigkit), "deploy", str(inventory), *args],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=3600,
            env={**os.environ, "RIGKIT_ROLLOUTS_DIR": str(rollouts)},
        )
        traffic.served(10)  # and after it
    output = result.stdout[-6000:] + result.stderr[-3000:]
    assert result.returncode == 0, output
    assert traffic.failed == [], (traffic.failed[:10], output)
    assert traffic.ok > 50, traffic.ok
    return traffic, routed_before, result


def summary_of(result_stdout: str, head: str) -> str:
    """The summary the command printed last (from its line starting ``head``), its white space folded."""
    return " ".join(result_stdout.rsplit(head, 1)[1].split())


def assert_out_in_turn(traffic: Traffic, rigs) -> None:
    """Each of ``rigs`` left the router exactly once, got no request while out (once its drain settled) and got
    requests after it came back; no two of them were out at once."""
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
        during = [traffic.watch[index][2].get(worker, 0.0) for index in window[window.index(settled) :]]
        assert all(count == before for count in during), f"{rig.name} got requests while out: {before} {during}"
        assert traffic.watch[-1][2].get(worker, 0.0) > before, f"{rig.name} got no request after it came back"
        windows[rig.name] = (traffic.watch[first][0], traffic.watch[last][0])
    spans = sorted(windows.values())
    assert all(end < start for (_, end), (start, _) in zip(spans, spans[1:])), (
        f"two rigs out of the router at once: {windows}"
    )


def test_a_rolling_upgrade_through_the_router_loses_no_request(lab, rigs, router, inventory, rig_exec, tmp_path):
    release_2 = lab.serving_image["releases"]["2"]
    traffic, routed_before, result = rigkit_deploy_under_traffic(
        router, rigs, inventory, ["--batch", "1", "--data", f"serving_image={release_2}"], tmp_path
    )
    summary = summary_of(result.stdout, "--> rigkit rollout:")
    assert f"router on @local: {len(rigs)} rigs routed" in summary, summary
    # round_robin reached each rig, rig3 through its firewall, before any rig left
    assert all(routed_before.get(worker_url(rig), 0.0) > 0 for rig in rigs), routed_before
    assert_out_in_turn(traffic, rigs)
    assert [serving_image_of(rig) for rig in rigs] == [release_2] * len(rigs)
    # the rollout's deploy kept the netns rig exposed as before (its firewall loaded, its API on 0.0.0.0)
    for rig in rigs:
        if rig.netns:
            assert api_exposure(rig, rig_exec) == (True, "0.0.0.0"), rig.name
    for rig in rigs:
        assert f"{rig.name}: back in the router ({worker_url(rig)})" in summary, summary


# --- a rolling rollback of two of them through the router (after the upgrade: file order) -------------------------


def test_a_rolling_rollback_through_the_router_loses_no_request(lab, rigs, router, inventory, tmp_path):
    """The upgrade above left the three rigs on release 2: rig1 and rig2 roll back (`rigkit deploy --deploy
    rollback.py --batch 1 --limit`) under the same request loop, each out of the router in turn; rig3 keeps
    serving release 2 and never leaves the router."""
    release_1, release_2 = lab.serving_image["releases"]["1"], lab.serving_image["releases"]["2"]
    assert [serving_image_of(rig) for rig in rigs] == [release_2] * len(rigs), (
        "runs after test_a_rolling_upgrade_through_the_router_loses_no_request, which leaves every rig on release 2"
    )
    back, kept = rigs[:2], rigs[2:]
    limits = [arg for rig in back for arg in ("--limit", rig.name)]
    traffic, routed_before, result = rigkit_deploy_under_traffic(
        router, rigs, inventory, ["--deploy", "rollback.py", "--batch", "1", *limits], tmp_path
    )
    summary = summary_of(result.stdout, "--> rigkit rollback:")
    assert f"router on @local: {len(rigs)} rigs routed, each drained before its rollback" in summary, summary
    assert f"rollback complete: {len(back)} rigs on a verified rollback" in summary, summary
    assert_out_in_turn(traffic, back)
    for rig in back:
        assert f"{rig.name}: back in the router ({worker_url(rig)})" in summary, summary
        assert serving_image_of(rig) == release_1, rig.name
        current = ledger(rig)[-1]
        assert (current["kind"], current["smoke"], current["image"]) == (ROLLBACK_KIND, SMOKE_PASS, release_1), current
    for rig in kept:  # never out of the router, served all along, still on release 2
        worker = worker_url(rig)
        assert traffic.windows(worker) == [], f"{rig.name} left the router"
        assert traffic.watch[-1][2].get(worker, 0.0) > routed_before.get(worker, 0.0), f"{rig.name} got no request"
        assert serving_image_of(rig) == release_2, rig.name
