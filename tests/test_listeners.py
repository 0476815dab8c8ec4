"""Two services of one machine on one port are refused naming both settings (rigkit.listeners, issue 43); services
of different machines, or on different addresses of one, are kept."""

from __future__ import annotations

import pytest

from rigkit.errors import ConfigError
from rigkit.listeners import Listener, host_listeners, refuse_shared_ports

IMAGE = "registry.local/vllm@sha256:" + "a" * 64
RIG = {"serving_profile": "cpu-lab", "serving_image": IMAGE, "gpus": 0, "ssh_hostname": "10.0.0.11"}


def rig(**data):
    return {**RIG, **data}


@pytest.mark.parametrize(
    "hosts, field, problem",
    [
        (
            [("rig1", ["rigs"], rig(node_exporter=True, node_exporter_port=8000))],
            "rig1.node_exporter_port",
            "is also rig1.serving_port: the node exporter and the serving stack",
        ),
        (
            [
                ("rig1", ["rigs"], rig(serving_port=6379, bind_address="0.0.0.0")),
                ("store", ["kv_stores"], {"ssh_hostname": "10.0.0.11", "kv_store_bind_addresses": ["10.0.0.11"]}),
            ],
            "store.kv_store_port",
            "is also rig1.serving_port: the KV store and the serving stack would both listen on port 6379 of 10.0.0.11",
        ),
        (
            [
                ("rig1", ["rigs"], rig(node_exporter=True)),
                ("prom", ["monitoring"], {"ssh_hostname": "10.0.0.11", "monitoring_port": 9100}),
            ],
            "prom.monitoring_port",
            "is also rig1.node_exporter_port",
        ),
        (
            [
                ("gw", ["routers"], {"ssh_hostname": "10.0.0.5", "router_port": 9090}),
                ("prom", ["monitoring"], {"ssh_hostname": "10.0.0.5", "monitoring_bind_address": "0.0.0.0"}),
            ],
            "prom.monitoring_port",
            "is also gw.router_port",
        ),
    ],
    ids=["exporter-on-serving-port", "store-on-a-rig-box", "prometheus-on-exporter-port", "prometheus-on-router-port"],
)
def test_two_services_of_one_machine_on_one_port_are_refused_naming_both(hosts, field, problem):
    with pytest.raises(ConfigError) as refused:
        refuse_shared_ports(hosts)
    assert refused.value.field == field and refused.value.problem.startswith(problem), str(refused.value)
    assert refused.value.fix.startswith(f"set {field.split('.')[1]} to another port, e.g. ")


@pytest.mark.parametrize(
    "hosts",
    [
        [("rig1", ["rigs"], rig(node_exporter=True))],  # 8000 and 9100
        [("rig1", ["rigs"], rig(node_exporter=False, node_exporter_port=8000))],  # no exporter: its port unused
        [("rig1", ["rigs"], rig()), ("rig2", ["rigs"], rig(ssh_hostname="10.0.0.12"))],  # two boxes, one port each
        [("rig1", ["rigs"], rig()), ("rig2", ["rigs"], rig(ssh_port=2222))],  # one address, two SSH ports: two boxes
        [
            ("gw", ["routers"], {"ssh_hostname": "10.0.0.5", "router_port": 9090, "router_bind_address": "127.0.0.1"}),
            ("prom", ["monitoring"], {"ssh_hostname": "10.0.0.5", "monitoring_bind_address": "10.0.0.5"}),
        ],  # one port, two addresses
        [("bare", ["rigs"], {"ssh_hostname": "10.0.0.11"})],  # no stack declared: nothing listens
    ],
    ids=["own-ports", "exporter-off", "two-boxes", "two-ssh-ports", "two-addresses", "no-stack"],
)
def test_services_that_do_not_meet_are_kept(hosts):
    refuse_shared_ports(hosts)


def test_a_deploy_of_one_host_checks_its_machine_only():
    clash = [("rig1", ["rigs"], rig(node_exporter=True, node_exporter_port=8000))]
    other = [("rig2", ["rigs"], rig(ssh_hostname="10.0.0.12"))]
    refuse_shared_ports(clash + other, only=["rig2"])
    with pytest.raises(ConfigError):
        refuse_shared_ports(clash + other, only=["rig1"])


@pytest.mark.parametrize(
    "one, two, overlap",
    [
        (("a", 1, ("10.0.0.1",)), ("b", 1, ("10.0.0.1",)), True),
        (("a", 1, ("0.0.0.0",)), ("b", 1, ("10.0.0.1",)), True),
        (("a", 1, ("::",)), ("b", 1, ("127.0.0.1",)), True),
        (("a", 1, ("10.0.0.1",)), ("b", 1, ("10.0.0.2",)), False),
        (("a", 1, ("0.0.0.0",)), ("b", 2, ("0.0.0.0",)), False),
        (("a", 1, ("0.0.0.0",)), ("a", 1, ("0.0.0.0",)), False),  # one service: its own check's business
    ],
)
def test_listeners_overlap_on_one_port_of_one_address_or_a_wildcard(one, two, overlap):
    first = Listener("h", one[0], "x", one[1], one[2])
    second = Listener("h", two[0], "y", two[1], two[2])
    assert first.overlaps(second) == second.overlaps(first) == overlap


def test_what_each_role_listens_on():
    assert [(item.setting, item.port) for item in host_listeners("rig1", ["rigs"], rig(node_exporter=True))] == [
        ("serving_port", 8000),
        ("node_exporter_port", 9100),
    ]
    assert [item.setting for item in host_listeners("gw", ["routers"], {})] == ["router_port", "router_metrics_port"]
    assert [item.port for item in host_listeners("s", ["kv_stores"], {})] == [6379]
    assert [item.port for item in host_listeners("p", ["monitoring"], {})] == [9090]
