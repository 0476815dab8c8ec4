"""Prometheus' scrape targets from an inventory (a real pyinfra Inventory), its configuration checked by the real
promtool (Debian's prometheus package, bin/setup), and the firewall sources of the monitoring hosts."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from pyinfra.api import Inventory

from rigkit.errors import ConfigError
from rigkit.monitoring.prometheus import (
    Target,
    config_text,
    fleet_targets,
    prometheus_args,
    rules_text,
    scraper_addresses,
)
from rigkit.settings.defaults import MONITORING_VARIABLES

IMAGE = "registry.example/vllm@sha256:" + "ab" * 32
DEFAULTS = {variable.name: variable.default for variable in MONITORING_VARIABLES}
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (bin/setup installs prometheus)")


def rig(address: str, **data) -> dict:
    return {
        "ssh_hostname": address,
        "serving_image": IMAGE,
        "bind_address": "0.0.0.0",
        "allow_incubating": True,
        "model": "Qwen/Qwen3-0.6B",
        "serving_profile": "cpu-lab",
        **data,
    }


def inventory(**groups) -> Inventory:
    hosts = [name for members in groups.values() for name, _ in members]
    data = {name: values for members in groups.values() for name, values in members}
    return Inventory(
        ([(name, data[name]) for name in hosts], {}),
        **{group: ([name for name, _ in members], {}) for group, members in groups.items()},
    )


FLEET = dict(
    rigs=[
        ("rig1", rig("10.0.0.11", serving_profile="lmcache-mp", node_exporter=True)),
        ("rig2", rig("10.0.0.12", serving_profile="native-offload", serving_port=8100, gpus=2)),
    ],
    routers=[("gw1", {"ssh_hostname": "10.0.0.2", "router_bind_address": "0.0.0.0"})],
    monitoring=[("mon1", {"ssh_hostname": "10.0.0.3"})],
)


def test_every_rig_its_lmcache_and_node_exporter_and_the_router():
    targets = fleet_targets(inventory(**FLEET), "10.0.0.3")
    labels = {"rig": "rig1", "profile": "lmcache-mp", "release": "ab" * 6}
    assert targets == [
        Target("rigkit_vllm", "10.0.0.11:8000", labels),
        Target("rigkit_lmcache", "10.0.0.11:8080", labels),
        Target("rigkit_node", "10.0.0.11:9100", labels),
        Target("rigkit_vllm", "10.0.0.12:8100", {"rig": "rig2", "profile": "native-offload", "release": "ab" * 6}),
        Target("rigkit_router", "10.0.0.2:8301", {"gateway": "gw1"}),
    ]


def test_a_rig_on_its_own_loopback_elsewhere_is_refused_naming_it():
    fleet = {**FLEET, "rigs": [("rig1", rig("10.0.0.11", bind_address="127.0.0.1"))]}
    with pytest.raises(ConfigError) as refused:
        fleet_targets(inventory(**fleet), "10.0.0.3")
    assert "rig1.bind_address" in str(refused.value) and "monitoring host cannot scrape" in str(refused.value)


def test_a_router_on_loopback_elsewhere_is_left_out_and_the_lab_shape_scrapes_loopback():
    fleet = {**FLEET, "routers": [("gw1", {"ssh_hostname": "10.0.0.2"})]}
    assert all(target.job != "rigkit_router" for target in fleet_targets(inventory(**fleet), "10.0.0.3"))
    lab = dict(
        rigs=[("rig1", rig("127.0.0.1", bind_address="127.0.0.1", ssh_port=2201))],
        routers=[("gw", {"ssh_hostname": "127.0.0.1"})],
    )
    assert [t.address for t in fleet_targets(inventory(**lab), "127.0.0.1")] == ["127.0.0.1:8000", "127.0.0.1:8301"]


def test_the_monitoring_hosts_addresses_for_the_rigs_firewall():
    resolved = {"10.0.0.3": ["10.0.0.3"], "mon.lan": ["10.0.0.4", "fd00::4"], "127.0.0.1": ["127.0.0.1"]}
    fleet = {**FLEET, "monitoring": [(n, {"ssh_hostname": n}) for n in resolved]}
    assert scraper_addresses(inventory(**fleet), resolved.__getitem__) == ["10.0.0.3", "10.0.0.4", "fd00::4"]

    def unknown(name):
        raise OSError("Name or service not known")

    with pytest.raises(ConfigError, match="does not resolve"):
        scraper_addresses(inventory(**FLEET), unknown)


def test_prometheus_listens_where_declared():
    assert prometheus_args({**DEFAULTS, "monitoring_bind_address": "::1", "monitoring_retention_days": 30}) == (
        'ARGS="--web.listen-address=[::1]:9090 --storage.tsdb.retention.time=30d"'
    )


@needs_promtool
def test_promtool_accepts_the_configuration_and_its_rules(tmp_path):
    rules = tmp_path / "rigkit-rules.yml"
    rules.write_text(rules_text(DEFAULTS))
    config = tmp_path / "prometheus.yml"
    text = config_text(DEFAULTS, fleet_targets(inventory(**FLEET), "10.0.0.3"))
    config.write_text(text.replace("/etc/prometheus/rigkit-rules.yml", str(rules)))
    result = subprocess.run([PROMTOOL, "check", "config", str(config)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 8 rules found" in result.stdout + result.stderr
