"""The API firewall on the lab's netns rig: its API bound to 0.0.0.0, reachable from the host end of its veth
(10.213.N.1: the controller, and the router's stand-in) and from its own loopback, dropped from anywhere else.

Only the netns rig: rigs on host networking share this machine's network namespace, where nft rules would be
this machine's firewall (rigkit.firewall.refuse_on_shared_network refuses them; a test below checks this
machine's namespace holds no rigkit table). "Anywhere else" is the rig's own address seen from inside the
rig (source 10.213.N.2, not allowed): the lab has no third host on the veth's /30.

One deploy with the firewall on (deploy.py, this rig only: vLLM restarts for the new bind), a re-run that
changes nothing, and at the end a deploy with the usual data, which removes the firewall and binds loopback
again, so later tests see the usual netns rig.
"""

from __future__ import annotations

import re

import pytest
import requests

from rigkit.firewall import API_FIREWALL

RULESET_PATH, TABLE, UNIT_NAME = API_FIREWALL.ruleset_path, API_FIREWALL.table, API_FIREWALL.unit_name
from rigkit.lab.pyinfra_output import parse_results
from rigkit.tunnel import serving_url

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

DEPLOY_TIMEOUT_S = 1800
FIREWALL_DATA = ["--data", "api_firewall=true", "--data", "bind_address=0.0.0.0"]
DROPPED_WITHIN_S = 3  # a dropped SYN never answers: curl gives up after this


def _deploy(run_pyinfra, rig, data=()):
    result = run_pyinfra(args=["--limit", rig.name, *data], deploy="deploy.py", timeout=DEPLOY_TIMEOUT_S)
    assert result.returncode == 0, f"pyinfra failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    return result


def _drops(rig, rig_exec) -> int:
    chain = rig_exec(rig, f"nft list chain inet {TABLE} api").stdout
    return int(re.search(r"counter packets (\d+) bytes \d+ drop", chain).group(1))


def _http_code_in_rig(rig, rig_exec, url: str) -> str:
    """curl from inside the rig's namespace; "000" when nothing answered within DROPPED_WITHIN_S."""
    result = rig_exec(rig, f"curl -s -o /dev/null -m {DROPPED_WITHIN_S} -w '%{{http_code}}' {url}", check=False)
    return result.stdout.strip()


@pytest.fixture(scope="module")
def firewalled(netns_rig, deployed, run_pyinfra, rig_exec):
    """The netns rig deployed with api_firewall on and bind_address 0.0.0.0; the usual rig again afterwards."""
    first = _deploy(run_pyinfra, netns_rig, FIREWALL_DATA)
    try:
        yield first
    finally:
        _deploy(run_pyinfra, netns_rig)  # the usual data: api_firewall off removes it, loopback bind
        left = rig_exec(netns_rig, f"nft list tables; ls {RULESET_PATH} 2>&1; systemctl is-enabled {UNIT_NAME} 2>&1",
                        check=False).stdout
        assert TABLE not in left and "No such file" in left, left


def test_the_ruleset_allows_the_controller_seen_in_the_ssh_session(netns_rig, firewalled, rig_exec):
    # no api_allowed_sources declared: the host end came from the deploy's own SSH_CONNECTION
    ruleset = rig_exec(netns_rig, f"cat {RULESET_PATH}").stdout
    assert f"ip saddr {{ {netns_rig.host_address} }} accept" in ruleset, ruleset
    assert f"tcp dport {{ {netns_rig.serving_port} }} jump api" in ruleset
    assert rig_exec(netns_rig, f"systemctl is-enabled {UNIT_NAME}").stdout.strip() == "enabled"
    listening = rig_exec(netns_rig, f"ss -ltnH 'sport = :{netns_rig.serving_port}'").stdout
    assert f"0.0.0.0:{netns_rig.serving_port} " in listening, listening


def test_the_api_answers_the_host_end_directly(netns_rig, firewalled, lab_host_data, serving_image):
    # bind 0.0.0.0: serving_url goes straight to the rig's address, from 10.213.N.1, the allowed source
    with serving_url(lab_host_data[netns_rig.name], bind="0.0.0.0", port=netns_rig.serving_port,
                     inventory_name=netns_rig.name) as url:
        assert url == f"http://{netns_rig.rig_address}:{netns_rig.serving_port}"
        models = requests.get(f"{url}/v1/models", timeout=30)
    models.raise_for_status()
    assert [entry["id"] for entry in models.json()["data"]] == [serving_image["served_model_name"]]


def test_another_source_is_dropped_and_loopback_answers(netns_rig, firewalled, rig_exec):
    port = netns_rig.serving_port
    before = _drops(netns_rig, rig_exec)
    # from inside the rig to its own address: source 10.213.N.2, not allowed
    assert _http_code_in_rig(netns_rig, rig_exec, f"http://{netns_rig.rig_address}:{port}/v1/models") == "000"
    assert _drops(netns_rig, rig_exec) > before  # the firewall dropped it, not a missing listener
    assert _http_code_in_rig(netns_rig, rig_exec, f"http://127.0.0.1:{port}/v1/models") == "200"


def test_ssh_still_works(netns_rig, firewalled, ssh_run):
    status, out, _ = ssh_run(netns_rig, "echo reachable")
    assert (status, out.strip()) == (0, "reachable")


def test_a_second_run_changes_nothing(netns_rig, firewalled, run_pyinfra):
    again = _deploy(run_pyinfra, netns_rig, FIREWALL_DATA)
    total = parse_results(again.stdout + again.stderr)["Grand total"]  # pyinfra writes the table to stderr
    assert (total.success, total.error) == (0, 0), again.stdout[-4000:] + again.stderr[-3000:]


def test_this_machines_namespace_holds_no_rigkit_table(lab, netns_rig, firewalled, rig_exec):
    # a host-network rig runs nft in this machine's own namespace: rigkit's table must not be there
    shared = [rig for rig in lab.rigs if not rig.netns]
    if not shared:
        pytest.skip("no rig on host networking in this lab")
    tables = rig_exec(shared[0], "nft list tables").stdout
    assert TABLE not in tables, tables
