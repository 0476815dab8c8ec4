"""monitoring: Prometheus from the distribution's packages on a host of the inventory group
rigkit.settings.defaults.MONITORING_GROUP (it gets this role only), scraping every rig of the inventory, with
rigkit's alert rules, and rigkit's Grafana dashboards where Grafana is installed.

Ensures
- /etc/default/prometheus (where it listens: monitoring_bind_address:monitoring_port, loopback by default, since
  its UI and API take no password; how long it keeps samples), /etc/prometheus/prometheus.yml (the scrape targets
  deploy.py derives from the inventory: rigkit.monitoring.prometheus.fleet_targets) and the rules file, all written
  before the package is installed, so dpkg keeps them (--force-confold) and Prometheus never starts with the
  package's defaults (every address, port 9090);
- Debian's ``prometheus`` installed (Debian 12: 2.42.0; 13: 2.53.3), the configuration and rules checked by the
  package's promtool before Prometheus is restarted for them, the service enabled and running;
- Grafana: not in Debian's archive, so never installed here. Where it is (Grafana's own packages, /etc/grafana),
  the Prometheus data source and rigkit's dashboards (monitoring/grafana/, rendered from
  rigkit.monitoring.queries) are provisioned and grafana-server restarted when they changed; elsewhere the deploy
  says it provisioned nothing.
"""

from __future__ import annotations

from io import StringIO
from typing import Sequence

from pyinfra import host
from pyinfra.api import StringCommand
from pyinfra.api.deploy import deploy
from pyinfra.facts.files import Directory
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

from rigkit.distro import target_os
from rigkit.firewall import wildcard_exposure_notice
from rigkit.monitoring.dashboards import dashboard_text, dashboards, datasource_text, provider_text
from rigkit.monitoring.prometheus import (
    GRAFANA_DASHBOARDS_DIR,
    GRAFANA_PROVISIONING,
    GRAFANA_SERVICE,
    PROMETHEUS_CONFIG,
    PROMETHEUS_DEFAULTS,
    PROMETHEUS_PACKAGES,
    PROMETHEUS_SERVICE,
    PROMTOOL,
    RULES_FILE,
    Target,
    config_text,
    prometheus_args,
    rules_text,
)
from rigkit.operations import say
from rigkit.operations.apt import packages_installed
from rigkit.remote.tunnel import rig_local_url
from rigkit.settings.hostdata import RigSettings
from roles import Run

MONITORING_SUPPORTED_OS = frozenset({("debian", "12"), ("debian", "13")})


@deploy("monitoring")
def monitoring(rig: RigSettings, run: Run, targets: Sequence[Target] = ()) -> None:
    settings = rig.monitoring
    target_os(host.get_fact(LinuxDistribution)["release_meta"], "monitoring", MONITORING_SUPPORTED_OS)
    notice = wildcard_exposure_notice(
        "monitoring", "monitoring_bind_address", [settings["monitoring_bind_address"]], settings["monitoring_port"]
    )
    if notice:
        say(host, notice)
    args = files.put(
        name="Prometheus' address and retention (before the package: dpkg keeps it)",
        src=StringIO(f"# rigkit: written by roles/monitoring.py; edits are overwritten\n{prometheus_args(settings)}\n"),
        dest=PROMETHEUS_DEFAULTS,
        mode="644",
    )
    rules = files.put(name="rigkit's alert rules", src=StringIO(rules_text(settings)), dest=RULES_FILE, mode="644")
    config = files.put(
        name=f"Prometheus scrapes {len(targets)} target(s) of the inventory",
        src=StringIO(config_text(settings, targets)),
        dest=PROMETHEUS_CONFIG,
        mode="644",
    )
    packages_installed(name="Install prometheus", packages=list(PROMETHEUS_PACKAGES), no_recommends=True)
    server.shell(
        name="promtool checks the configuration and the rules",
        commands=[StringCommand(PROMTOOL, "check", "config", PROMETHEUS_CONFIG)],
        _if=any_changed(rules, config),
    )
    systemd.service(name="Prometheus enabled and running", service=PROMETHEUS_SERVICE, running=True, enabled=True)
    server.shell(
        name="Restart Prometheus for its new configuration",
        commands=[StringCommand("systemctl", "restart", PROMETHEUS_SERVICE)],
        _if=any_changed(args, rules, config),
    )
    grafana(settings)


def grafana(settings) -> None:
    """rigkit's dashboards and data source, where Grafana is installed (its provisioning directory exists)."""
    if not host.get_fact(Directory, path=GRAFANA_PROVISIONING):
        say(
            host,
            f"monitoring: no Grafana here ({GRAFANA_PROVISIONING} is absent; it is not in Debian): "
            "dashboards not provisioned; they are in monitoring/grafana/ to import",
        )
        return
    url = rig_local_url(settings["monitoring_bind_address"], settings["monitoring_port"])
    changed = [
        files.put(
            name="Grafana: rigkit's Prometheus data source",
            src=StringIO(datasource_text(url)),
            dest=f"{GRAFANA_PROVISIONING}/datasources/rigkit.yaml",
            mode="644",
        ),
        files.put(
            name="Grafana: rigkit's dashboards provider",
            src=StringIO(provider_text()),
            dest=f"{GRAFANA_PROVISIONING}/dashboards/rigkit.yaml",
            mode="644",
        ),
    ]
    for name, board in dashboards().items():
        changed.append(
            files.put(
                name=f"Grafana dashboard {name}",
                src=StringIO(dashboard_text(board)),
                dest=f"{GRAFANA_DASHBOARDS_DIR}/{name}",
                mode="644",
            )
        )
    server.shell(
        name="Restart Grafana for rigkit's provisioning",
        commands=[StringCommand("systemctl", "restart", GRAFANA_SERVICE)],
        _if=any_changed(*changed),
    )
