"""Prometheus on the monitoring host (roles/monitoring.py): its scrape targets, derived from the inventory, its
configuration and rules files, and where Debian's ``prometheus`` package keeps them. Pure: values in, text out.

Targets: every rig's vLLM /metrics at the address the fleet knows it by (rigkit.router.rig_address) and its
serving_port; LMCache MP's /metrics at lmcache_http_port where the rig's profile runs it; the rig's node exporter
where ``node_exporter`` is on; each gateway's vllm-router exporter (router_metrics_port). Each target labelled
rig, profile and release (the serving image's short digest, as the inventory declares it at the monitoring
host's deploy). The fleet's KV store is not scraped: valkey serves no Prometheus metrics (Debian's
prometheus-redis-exporter would; not installed).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

import yaml

from rigkit.errors import ConfigError
from rigkit.fleet.inventory import rigs_among
from rigkit.kv_store import resolve_address
from rigkit.monitoring.queries import (
    JOB_LMCACHE,
    JOB_NODE,
    JOB_ROUTER,
    JOB_VLLM,
    RULES,
    rule_expr,
    rule_summary,
)
from rigkit.paths import REPO_ROOT
from rigkit.remote.tunnel import WILDCARD_ADDRESSES, is_loopback_bind, ssh_address, url_host
from rigkit.router import is_gateway, rig_address
from rigkit.serving.ledger import short_digest
from rigkit.settings.defaults import MONITORING_GROUP, MONITORING_VARIABLES
from rigkit.settings.hostdata import rig_settings

PROMETHEUS_PACKAGES = ("prometheus",)
PROMETHEUS_SERVICE = "prometheus.service"
PROMETHEUS_CONFIG = "/etc/prometheus/prometheus.yml"
RULES_FILE = "/etc/prometheus/rigkit-rules.yml"
# Debian's unit runs `prometheus $ARGS` with ARGS from this file (the package's conffile, ARGS="" by default)
PROMETHEUS_DEFAULTS = "/etc/default/prometheus"
PROMTOOL = "/usr/bin/promtool"

NODE_EXPORTER_PACKAGES = ("prometheus-node-exporter",)
NODE_EXPORTER_SERVICE = "prometheus-node-exporter.service"
NODE_EXPORTER_DEFAULTS = "/etc/default/prometheus-node-exporter"
# Debian's node exporter reads textfiles here by default (prometheus-node-exporter 1.5.0, --help)
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
TEXTFILE = f"{TEXTFILE_DIR}/rigkit.prom"
TEXTFILE_INTERVAL_S = 15

# Grafana (not in Debian: provisioned only where it is already installed, from Grafana's own packages)
GRAFANA_PROVISIONING = "/etc/grafana/provisioning"
GRAFANA_DASHBOARDS_DIR = "/var/lib/rigkit/grafana-dashboards"
GRAFANA_SERVICE = "grafana-server.service"
GRAFANA_DATASOURCE_UID = "rigkit-prometheus"


@dataclass(frozen=True)
class Target:
    job: str
    address: str  # host:port as Prometheus dials it
    labels: Mapping[str, str]

    @classmethod
    def of(cls, value: "Target | Mapping") -> "Target":
        return value if isinstance(value, Target) else cls(**value)


def _host_port(address: str, port: int) -> str:
    return f"{url_host(address)}:{port}"


def scrape_address(name: str, data: Mapping, bind_address: str, monitoring_ssh_address: str) -> str:
    """Where the monitoring host reaches a process of host ``name`` bound to ``bind_address``: rig_address, which
    is loopback only when the process listens on loopback and the host's SSH address is loopback too (the
    monitoring host then shares it, as in the lab); a loopback-bound process elsewhere is refused."""
    address = rig_address(name, data, bind_address)
    if not is_loopback_bind(bind_address) or data.get("router_worker_address"):
        return address
    if is_loopback_bind(address) and is_loopback_bind(monitoring_ssh_address):
        return address
    raise ConfigError(
        f"{name}.bind_address",
        bind_address,
        f"{name} listens on its own loopback, which the monitoring host cannot scrape",
        f"set bind_address to an address the monitoring host reaches (0.0.0.0 behind the API firewall), or "
        f"leave {name} out of the monitoring host's inventory",
    )


def rig_targets(name: str, data: Mapping, rig, monitoring_ssh_address: str) -> list[Target]:
    """One rig's targets (``rig``: its rigkit.settings.hostdata.RigSettings)."""
    knobs = rig.stack.knobs
    address = scrape_address(name, data, knobs["bind_address"], monitoring_ssh_address)
    labels = {"rig": name, "profile": knobs["serving_profile"], "release": short_digest(knobs["serving_image"])}
    targets = [Target(JOB_VLLM, _host_port(address, knobs["serving_port"]), labels)]
    lmcache_port = rig.stack.listen_ports.get("lmcache_http_port")
    if lmcache_port:
        targets.append(Target(JOB_LMCACHE, _host_port(address, lmcache_port), labels))
    if rig.node_exporter["node_exporter"]:
        targets.append(Target(JOB_NODE, _host_port(address, rig.node_exporter["node_exporter_port"]), labels))
    return targets


def router_target(name: str, data: Mapping, router: Mapping, monitoring_ssh_address: str) -> Optional[Target]:
    """A gateway's vllm-router exporter; None when it listens on a loopback the monitoring host does not share."""
    bind = router["router_bind_address"]
    if bind in WILDCARD_ADDRESSES or not is_loopback_bind(bind):
        address = ssh_address(name, data) if bind in WILDCARD_ADDRESSES else bind
    elif is_loopback_bind(ssh_address(name, data)) and is_loopback_bind(monitoring_ssh_address):
        address = bind
    else:
        return None
    return Target(JOB_ROUTER, _host_port(address, router["router_metrics_port"]), {"gateway": name})


def config_text(settings: Mapping, targets: Sequence[Target]) -> str:
    """prometheus.yml: one scrape job per kind of target, each target with its labels; the rules file."""
    jobs: dict[str, list] = {}
    for target in map(Target.of, targets):
        jobs.setdefault(target.job, []).append({"targets": [target.address], "labels": dict(target.labels)})
    interval = f"{settings['monitoring_scrape_interval_s']}s"
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [RULES_FILE],
        "scrape_configs": [
            {"job_name": job, "metrics_path": "/metrics", "static_configs": groups} for job, groups in jobs.items()
        ],
    }
    header = "# rigkit: written by roles/monitoring.py from the inventory (rigkit/monitoring/prometheus.py)\n"
    return header + yaml.safe_dump(config, sort_keys=False, width=120)


def rules_text(settings: Mapping) -> str:
    """The alert rules file (promtool check rules), thresholds from the monitoring host's settings."""
    rules = [
        {
            "alert": rule.alert,
            "expr": rule_expr(rule, settings),
            "for": rule.for_,
            "labels": {"severity": rule.severity},
            "annotations": {"summary": rule_summary(rule, settings)},
        }
        for rule in RULES
    ]
    header = "# rigkit: alert rules rendered by rigkit/monitoring/prometheus.py (rigkit.monitoring.queries.RULES)\n"
    return header + yaml.safe_dump({"groups": [{"name": "rigkit", "rules": rules}]}, sort_keys=False, width=120)


# The rules with the default thresholds, committed for reading and for promtool's unit tests
# (tests/monitoring/rules_test.yml); `python -m rigkit.monitoring` rewrites it.
DEFAULT_RULES_PATH = REPO_ROOT / "monitoring" / "rigkit-rules.yml"


def default_rules_text() -> str:
    return rules_text({variable.name: variable.default for variable in MONITORING_VARIABLES})


def prometheus_args(settings: Mapping) -> str:
    """The ARGS line of /etc/default/prometheus: where it listens and how long it keeps samples."""
    listen = _host_port(settings["monitoring_bind_address"], settings["monitoring_port"])
    return (
        f'ARGS="--web.listen-address={listen} --storage.tsdb.retention.time={settings["monitoring_retention_days"]}d"'
    )


def node_exporter_args(bind_address: str, port: int) -> str:
    """The ARGS line of /etc/default/prometheus-node-exporter: the rig's bind address and the exporter's port."""
    return f'ARGS="--web.listen-address={_host_port(bind_address, port)}"'


def scraper_sources(addresses: Iterable[str]) -> list[str]:
    """The monitoring hosts' addresses a rig's API firewall lets in (loopback passes it already)."""
    out = []
    for address in addresses:
        try:
            if ipaddress.ip_address(address).is_loopback:
                continue
        except ValueError:
            pass
        out.append(address)
    return sorted(set(out))


def fleet_targets(hosts: Iterable, monitoring_ssh_address: str) -> list[Target]:
    """Every target of a pyinfra inventory's hosts (the rigs, also those a --limit leaves out, and the gateways),
    each rig's data validated as its own deploy validates it (a bad value: ConfigError before any host)."""
    found = {other.name: {"groups": list(other.groups), "data": other.data.dict()} for other in hosts}
    targets: list[Target] = []
    for name in rigs_among(found, list(found)):
        data = found[name]["data"]
        targets += rig_targets(name, data, rig_settings(data), monitoring_ssh_address)
    for name, host in found.items():
        if is_gateway(host["groups"]):
            router = rig_settings(host["data"], needs_stack=False).router
            target = router_target(name, host["data"], router, monitoring_ssh_address)
            if target is not None:
                targets.append(target)
    return targets


def scraper_addresses(hosts: Iterable, resolve=resolve_address) -> list[str]:
    """The addresses the inventory's monitoring hosts scrape from, resolved on the controller (a rig's API firewall
    lets them reach serving_port, the LMCache ports and the node exporter)."""
    addresses = []
    for other in hosts:
        if MONITORING_GROUP in other.groups:
            data = other.data.dict()
            try:
                addresses += resolve(ssh_address(other.name, data))
            except OSError as exc:
                raise ConfigError(
                    "ssh_hostname",
                    ssh_address(other.name, data),
                    f"the monitoring host {other.name}'s address does not resolve on the controller ({exc})",
                    "give the monitoring host an IP ssh_hostname (the rigs' API firewall allows it by address)",
                ) from None
    return scraper_sources(addresses)
