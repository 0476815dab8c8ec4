"""The router role on the lab (issue 15): vllm-router installed from a loopback wheelhouse into a venv on a
gateway, run under systemd, its workers the rigs of the inventory.

The gateway is rig1's machine under a second name (`gw`, group `routers`): it shares this machine's network,
as rig1 and rig2 do, so it reaches their APIs on their loopback binds; rig3 (its own namespace, API on its own
loopback) is left out of the router's inventory (the role refuses it there). One deploy of the gateway
(`--limit gw`: the rigs keep serving release 1 from the `deployed` fixture), then: requests through the router
are answered by both rigs (round_robin), /list_workers is exactly them, a re-run changes nothing, a bad policy is
refused before any host is touched. The router is stopped and disabled at the end.
"""

from __future__ import annotations

import json
import runpy
import urllib.request
from pathlib import Path

import pytest

from rigkit import metrics
from rigkit.lab.pyinfra_output import parse_results
from rigkit.lab.router_wheels import ensure_router_wheels
from rigkit.lab.serving_image import serve_directory
from rigkit.paths import REPO_ROOT
from rigkit.router import ROUTER_UNIT, ROUTER_UNIT_PATH
from rigkit.settings.defaults import ROUTER_VARIABLES

pytestmark = [pytest.mark.lab]

LAB_INVENTORY = REPO_ROOT / "inventory" / "lab.py"
ROUTER_PORT = next(v.default for v in ROUTER_VARIABLES if v.name == "router_port")
ROUTER = f"http://127.0.0.1:{ROUTER_PORT}"
SSH_KEYS = (
    "ssh_hostname",
    "ssh_port",
    "ssh_user",
    "ssh_key",
    "ssh_known_hosts_file",
    "ssh_strict_host_key_checking",
    "ssh_allow_agent",
    "ssh_look_for_keys",
)
DEPLOY_TIMEOUT_S = 900


def host_network_rigs(lab):
    rigs = [rig for rig in lab.rigs if not rig.netns][:2]
    if len(rigs) < 2:
        pytest.fail("the router test needs two rigs on host networking")
    return rigs


def write_inventory(path: Path, rigs, wheelhouse_url: str) -> Path:
    """The lab's own host data for the two rigs, plus `gw`: the first rig's SSH data, in group routers."""
    lab = dict(runpy.run_path(str(LAB_INVENTORY))["lab"])
    gateway = {key: lab[rigs[0].name][key] for key in SSH_KEYS if key in lab[rigs[0].name]}
    gateway.update(router_pip_find_links=wheelhouse_url, router_policy="round_robin")
    path.write_text(f"lab = {[(rig.name, lab[rig.name]) for rig in rigs]!r}\nrouters = {[('gw', gateway)]!r}\n")
    return path


def grand_total(result):
    return parse_results(result.stdout + result.stderr)["Grand total"]


def get(path: str) -> str:
    with urllib.request.urlopen(ROUTER + path, timeout=30) as response:
        return response.read().decode()


def chat(prompt: str) -> dict:
    body = json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": prompt}], "max_tokens": 4, "temperature": 0}
    ).encode()
    request = urllib.request.Request(
        ROUTER + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def answered(rig) -> float:
    """Requests the rig's engine gave a first token (its TTFT histogram's count, its own /metrics on this
    machine's loopback)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{rig.serving_port}/metrics", timeout=30) as response:
        return metrics.parse(response.read().decode()).ttft_count


@pytest.fixture(scope="module")
def gateway(lab, deployed, run_pyinfra, rig_exec, tmp_path_factory):
    rigs = host_network_rigs(lab)
    wheels = ensure_router_wheels(next(v.default for v in ROUTER_VARIABLES if v.name == "router_version"))
    with serve_directory(wheels) as url:
        inventory = write_inventory(tmp_path_factory.mktemp("router") / "router_lab.py", rigs, url)
        first = run_pyinfra(["--limit", "gw"], inventory=inventory, deploy="deploy.py", timeout=DEPLOY_TIMEOUT_S)
        assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-4000:]
        again = run_pyinfra(["--limit", "gw"], inventory=inventory, deploy="deploy.py", timeout=DEPLOY_TIMEOUT_S)
        yield rigs, inventory, first, again, url
    rig_exec(rigs[0], f"systemctl disable --now {ROUTER_UNIT}", check=False)


def test_the_router_lists_exactly_the_rigs_and_both_answer_through_it(gateway):
    rigs, _, first, _, _ = gateway
    assert grand_total(first).success > 0
    listed = json.loads(get("/list_workers"))["urls"]
    assert sorted(listed) == sorted(f"http://127.0.0.1:{rig.serving_port}" for rig in rigs)
    before = {rig.name: answered(rig) for rig in rigs}
    replies = [chat(f"router lab request {i}") for i in range(4)]
    assert all(reply["choices"][0]["message"]["content"] is not None for reply in replies)
    grew = {rig.name: answered(rig) - before[rig.name] for rig in rigs}
    assert all(count >= 1 for count in grew.values()), grew  # round_robin: both rigs served
    assert sum(grew.values()) >= 4


def test_a_rerun_changes_nothing(gateway):
    _, _, _, again, _ = gateway
    assert again.returncode == 0, again.stdout[-4000:]
    assert grand_total(again).success == 0, again.stdout[-4000:] + again.stderr[-2000:]


def test_a_bad_policy_is_refused_before_any_host_is_touched(gateway, run_pyinfra, rig_exec):
    rigs, inventory, _, _, url = gateway
    unit = rig_exec(rigs[0], f"cat {ROUTER_UNIT_PATH}").stdout
    refused = run_pyinfra(
        ["--limit", "gw", "--data", "router_policy=fastest"],
        inventory=inventory,
        deploy="deploy.py",
        timeout=DEPLOY_TIMEOUT_S,
    )
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "router_policy" in output and "fastest" in output, output[-3000:]
    assert rig_exec(rigs[0], f"cat {ROUTER_UNIT_PATH}").stdout == unit
    assert json.loads(get("/list_workers"))["urls"]  # still routing
