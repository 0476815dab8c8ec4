"""rigkit's Grafana dashboards: the committed JSON is what the panel declarations render, each panel's query is the
declared one (per rig: filtered by the rig variable), and the provisioning files name the data source they use."""

from __future__ import annotations

import json

import yaml

from rigkit.monitoring.dashboards import DASHBOARDS_DIR, dashboard_text, dashboards, datasource_text, provider_text
from rigkit.monitoring.prometheus import GRAFANA_DASHBOARDS_DIR, GRAFANA_DATASOURCE_UID
from rigkit.monitoring.queries import FLEET_PANELS, PANELS


def test_the_committed_dashboards_are_the_declarations():
    for name, board in dashboards().items():
        assert (DASHBOARDS_DIR / name).read_text() == dashboard_text(board), (
            f"{name} stale: run .venv/bin/python -m rigkit.monitoring"
        )
    assert sorted(path.name for path in DASHBOARDS_DIR.glob("*.json")) == sorted(dashboards())


def test_fleet_and_rig_panels():
    fleet = json.loads((DASHBOARDS_DIR / "rigkit-fleet.json").read_text())
    rig = json.loads((DASHBOARDS_DIR / "rigkit-rig.json").read_text())
    assert [panel["title"] for panel in fleet["panels"]] == [panel.title for panel in [*PANELS, *FLEET_PANELS]]
    assert [panel["title"] for panel in rig["panels"]] == [panel.title for panel in PANELS]
    for panel in rig["panels"]:
        assert '{rig=~"$rig"' in panel["targets"][0]["expr"] or ',rig=~"$rig"}' in panel["targets"][0]["expr"]
    for panel in fleet["panels"]:
        assert "$rig" not in panel["targets"][0]["expr"]
        assert panel["datasource"]["uid"] == GRAFANA_DATASOURCE_UID
    assert len({(p["gridPos"]["x"], p["gridPos"]["y"]) for p in fleet["panels"]}) == len(fleet["panels"])


def test_provisioning_names_the_data_source_and_the_folder():
    source = yaml.safe_load(datasource_text("http://127.0.0.1:9090"))["datasources"][0]
    assert (source["uid"], source["url"], source["type"]) == (
        GRAFANA_DATASOURCE_UID,
        "http://127.0.0.1:9090",
        "prometheus",
    )
    assert yaml.safe_load(provider_text())["providers"][0]["options"]["path"] == GRAFANA_DASHBOARDS_DIR
