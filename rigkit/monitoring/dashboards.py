"""rigkit's Grafana dashboards, rendered from the panel declarations (rigkit.monitoring.queries): one for the fleet
(every rig a series, the router's panels), one per rig (a ``rig`` variable). ``python -m rigkit.monitoring``
writes them to monitoring/grafana/ (committed; tests/monitoring/test_dashboards.py fails when they are stale), and
roles/monitoring.py provisions them, with the Prometheus data source, where Grafana is installed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

import yaml

from rigkit.monitoring.prometheus import GRAFANA_DASHBOARDS_DIR, GRAFANA_DATASOURCE_UID
from rigkit.monitoring.queries import FLEET_PANELS, JOB_VLLM, PANELS, UP, Panel, panel_query
from rigkit.paths import REPO_ROOT

DASHBOARDS_DIR = REPO_ROOT / "monitoring" / "grafana"
RIG_SELECTOR = 'rig=~"$rig"'
DATASOURCE = {"type": "prometheus", "uid": GRAFANA_DATASOURCE_UID}
PANEL_WIDTH, PANEL_HEIGHT, COLUMNS = 12, 8, 2


def _panel(index: int, panel: Panel, selector: str) -> dict:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": panel.title,
        "datasource": DATASOURCE,
        "gridPos": {
            "x": (index % COLUMNS) * PANEL_WIDTH,
            "y": (index // COLUMNS) * PANEL_HEIGHT,
            "w": PANEL_WIDTH,
            "h": PANEL_HEIGHT,
        },
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "targets": [
            {"refId": "A", "datasource": DATASOURCE, "expr": panel_query(panel, selector), "legendFormat": panel.legend}
        ],
    }


def dashboard(uid: str, title: str, panels: Sequence[Panel], selector: str = "", variables: Sequence = ()) -> dict:
    return {
        "uid": uid,
        "title": title,
        "tags": ["rigkit"],
        "schemaVersion": 39,
        "editable": False,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": list(variables)},
        "panels": [_panel(index, panel, selector) for index, panel in enumerate(panels)],
    }


RIG_VARIABLE = {
    "name": "rig",
    "label": "rig",
    "type": "query",
    "datasource": DATASOURCE,
    "query": f'label_values({UP}{{job="{JOB_VLLM}"}}, rig)',
    "refresh": 2,
    "multi": False,
    "includeAll": False,
}


def dashboards() -> dict[str, dict]:
    """File name -> dashboard JSON."""
    return {
        "rigkit-fleet.json": dashboard("rigkit-fleet", "rigkit: fleet", [*PANELS, *FLEET_PANELS]),
        "rigkit-rig.json": dashboard("rigkit-rig", "rigkit: one rig", PANELS, RIG_SELECTOR, [RIG_VARIABLE]),
    }


def dashboard_text(board: Mapping) -> str:
    return json.dumps(board, indent=1) + "\n"


def datasource_text(prometheus_url: str) -> str:
    """Grafana's provisioning of the Prometheus data source the dashboards name (its uid)."""
    source = {"name": "rigkit Prometheus", "type": "prometheus", "uid": GRAFANA_DATASOURCE_UID, "access": "proxy"}
    return yaml.safe_dump({"apiVersion": 1, "datasources": [{**source, "url": prometheus_url}]}, sort_keys=False)


def provider_text() -> str:
    """Grafana's provisioning of rigkit's dashboards from their directory on the monitoring host."""
    provider = {"name": "rigkit", "type": "file", "disableDeletion": True, "options": {"path": GRAFANA_DASHBOARDS_DIR}}
    return yaml.safe_dump({"apiVersion": 1, "providers": [provider]}, sort_keys=False)


def write(folder: Path = DASHBOARDS_DIR) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, board in dashboards().items():
        path = folder / name
        path.write_text(dashboard_text(board))
        written.append(path)
    return written
