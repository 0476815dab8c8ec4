"""A rig in its own network namespace, after the real deploy: its serving API binds the rig's own
loopback, so the controller reaches it only through the SSH tunnel (rigkit.remote.tunnel.serving_url) made
from the inventory's host data, and the deploy's smoke (which goes through that tunnel) passed.

The rig has its own address (10.213.N.2, sshd on port 22) and shares nothing with the host's
loopback: a controller that skipped the tunnel would fail here, unlike on a host-network rig.
tests/lab/test_tunnel_lab.py checks the tunnel itself against a throwaway server on that loopback;
this module checks the deployed stack (vLLM, the deploy's smoke, the pull by the lab reference).
"""

from __future__ import annotations

import json
import uuid

import pytest
import requests

from rigkit.remote.tunnel import port_is_open, serving_url
from rigkit.serving.ledger import LEDGER_PATH
from rigkit.settings.knobs import KNOBS_BY_NAME

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

BIND_ADDRESS = KNOBS_BY_NAME["bind_address"].default
COMPLETION_TOKENS = 8


def test_the_rig_has_its_own_address_and_the_inventory_uses_it(netns_rig, lab_host_data, rig_exec):
    data = lab_host_data[netns_rig.name]
    assert (data["ssh_hostname"], data["ssh_port"]) == (netns_rig.rig_address, 22)
    assert netns_rig.rig_address != "127.0.0.1" and netns_rig.host_address
    # its loopback is its own: the host's sshd ports are not there
    listening = rig_exec(netns_rig, "ss -ltnH").stdout
    assert f"{netns_rig.rig_address}:22 " in listening


def test_the_api_is_not_reachable_without_the_tunnel(netns_rig, deployed, rig_exec):
    port = netns_rig.serving_port
    # the API does listen, on the rig's loopback (else the checks below would prove nothing)
    listening = rig_exec(netns_rig, f"ss -ltnH 'sport = :{port}'").stdout
    assert f"127.0.0.1:{port} " in listening, listening
    # the rig's address answers (sshd), its serving port there does not; nor does the host's loopback
    assert port_is_open(netns_rig.rig_address, 22)
    assert not port_is_open(netns_rig.rig_address, port)
    assert not port_is_open("127.0.0.1", port)


def test_the_api_answers_through_the_tunnel(netns_rig, deployed, lab_host_data, serving_image):
    model = serving_image["served_model_name"]
    with serving_url(
        lab_host_data[netns_rig.name], bind=BIND_ADDRESS, port=netns_rig.serving_port, inventory_name=netns_rig.name
    ) as url:
        models = requests.get(f"{url}/v1/models", timeout=30)
        models.raise_for_status()
        assert [entry["id"] for entry in models.json()["data"]] == [model] == ["tiny"]
        completion = requests.post(
            f"{url}/v1/completions",
            timeout=120,
            json={
                "model": model,
                "prompt": f"session {uuid.uuid4()}: hello",
                "max_tokens": COMPLETION_TOKENS,
                "ignore_eos": True,
            },
        )
        completion.raise_for_status()
        body = completion.json()
    assert body["usage"]["completion_tokens"] == COMPLETION_TOKENS
    assert body["choices"][0]["text"]


def test_the_deploy_smoke_passed_through_the_tunnel(lab, netns_rig, deployed, rig_exec):
    # the direct path does not exist (test above), so a passing smoke went through the tunnel
    entries = json.loads(rig_exec(netns_rig, f"cat {LEDGER_PATH}").stdout)["releases"]
    assert entries[-1]["smoke"] == "pass", entries[-1]
    # pulled by the same reference as every rig (127.0.0.1:5000 inside the rig is the lab registry)
    assert entries[-1]["image"] == lab.serving_image["releases"]["1"]
