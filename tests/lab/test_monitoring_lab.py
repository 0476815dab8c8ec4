"""The monitoring role on the lab (issue 27): Prometheus from Debian's package on rig1 (bookworm), scraping the
host-network rigs' vLLM and their node exporters (Debian's package, bookworm and trixie, with rigkit's textfile
collector), every target derived from the inventory. After requests on every rig, every dashboard panel's query
and every alert expression runs against that real Prometheus: a panel whose query returns no series fails naming
the panel and its metrics; a panel needing what a CPU lab cannot have (rigkit.monitoring.queries.LAB_LACKS) is
skipped with that reason. The rigs and rig1 are given back without Prometheus and node exporter at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
import requests

from rigkit.lab.pyinfra_output import parse_results
from rigkit.monitoring.queries import FLEET_PANELS, LAB_LACKS, PANELS, RULES, panel_query, rule_expr
from rigkit.settings.defaults import MONITORING_VARIABLES

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

INVENTORY = Path(__file__).resolve().parent / "inventories" / "monitoring_rig1.py"
PROMETHEUS = "http://127.0.0.1:9390"
ALL_RIGS = 'rig=~".+"'
# Not in LAB_LACKS (a lab can run a router: `rigkit lab up --router`), but this inventory has no gateway.
NOT_HERE = {"router": "this lab inventory has no gateway (the router lab tests run their own)"}
CLEANUP = (
    "systemctl disable --now rigkit-node-textfile.timer prometheus prometheus-node-exporter 2>/dev/null; "
    "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q prometheus prometheus-node-exporter >/dev/null 2>&1; "
    "rm -rf /etc/prometheus /var/lib/prometheus /etc/default/prometheus /etc/default/prometheus-node-exporter "
    "/etc/systemd/system/rigkit-node-textfile.service /etc/systemd/system/rigkit-node-textfile.timer "
    "/usr/local/lib/rigkit/node_textfile.py; systemctl daemon-reload; true"
)


def query(expr: str) -> list:
    answer = requests.get(f"{PROMETHEUS}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", f"{expr}: {answer}"
    return answer["data"]["result"]


def lacking(needs) -> str:
    reasons = [reason for need, reason in {**LAB_LACKS, **NOT_HERE}.items() if need in needs]
    return "; ".join(reasons)


@pytest.fixture(scope="module")
def monitored(lab, deployed, run_pyinfra, rig_exec):
    rigs = [rig for rig in lab.rigs if not rig.netns]
    try:
        result = run_pyinfra(inventory=INVENTORY, deploy="deploy.py", timeout=1200)
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
        again = run_pyinfra(inventory=INVENTORY, deploy="deploy.py", timeout=600)
        assert again.returncode == 0, again.stdout[-4000:]
        yield rigs, result, again
    finally:
        for rig in rigs:
            rig_exec(rig, CLEANUP, check=False)


def send_requests(rig) -> None:
    base = f"http://127.0.0.1:{rig.serving_port}"
    model = requests.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
    prompt = "The monitoring host scrapes every rig. " * 60
    for _ in range(2):  # the second is a prefix-cache hit
        response = requests.post(
            f"{base}/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 8}, timeout=300
        )
        assert response.status_code == 200, response.text[:500]


def test_every_panel_and_alert_runs_on_a_real_prometheus_over_the_lab(monitored):
    rigs, first, again = monitored
    total = parse_results(again.stdout + again.stderr)["Grand total"]
    assert (total.success, total.error) == (0, 0) and total.no_change > 0, again.stderr[-3000:]  # a re-run: no change
    for rig in rigs:
        send_requests(rig)
    deadline = time.monotonic() + 120
    while True:  # every target up and scraped a few times since the requests
        targets = requests.get(f"{PROMETHEUS}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        if len(targets) == 2 * len(rigs) and all(target["health"] == "up" for target in targets):
            break
        assert time.monotonic() < deadline, [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets]
        time.sleep(1)
    time.sleep(8)

    missing, skipped = [], []
    for panel in [*PANELS, *FLEET_PANELS]:
        reason = lacking(panel.needs)
        if reason:
            skipped.append(f"{panel.title}: {reason}")
            continue
        if not query(panel_query(panel, ALL_RIGS)):
            missing.append(f"panel {panel.title!r}: no series ({', '.join(panel.metrics)})")
    settings = {variable.name: variable.default for variable in MONITORING_VARIABLES}
    for rule in RULES:
        query(rule_expr(rule, settings))  # the expression evaluates (firing or not)
        reason = lacking(rule.needs)
        if reason:
            skipped.append(f"alert {rule.alert}: {reason}")
            continue
        for metric in rule.metrics:
            if not query(f'{{__name__="{metric}"}}'):
                missing.append(f"alert {rule.alert}: no series of {metric}")
    print("skipped:\n  " + "\n  ".join(skipped))
    assert missing == []
    rig_labels = {result["metric"]["rig"] for result in query('up{job="rigkit_vllm"}')}
    assert rig_labels == {rig.name for rig in rigs}
    labels = query('up{job="rigkit_vllm"}')[0]["metric"]
    assert labels["profile"] == "cpu-lab" and len(labels["release"]) == 12


CHROMIUM = shutil.which("chromium")
SCREENSHOT_QUERY = 'sum by (rig) (vllm:prompt_tokens_total{job="rigkit_vllm"})'


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (Debian's package) on the controller")
def test_prometheus_graph_page_shows_the_lab_series(monitored, tmp_path):
    """Prometheus' own graph page for one query, drawn by headless Chromium: the picture is kept for a person to look
    at (RIGKIT_SCREENSHOT_DIR, default the test's tmp_path); the test holds that it was drawn and is not blank."""
    url = f"{PROMETHEUS}/graph?" + urlencode({"g0.expr": SCREENSHOT_QUERY, "g0.tab": "0", "g0.range_input": "15m"})
    out = Path(os.environ.get("RIGKIT_SCREENSHOT_DIR", tmp_path)) / "prometheus-graph.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1400,900",
            "--virtual-time-budget=15000",
            f"--screenshot={out}",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    picture = out.read_bytes()
    assert picture.startswith(b"\x89PNG") and len(picture) > 20_000, len(picture)
    assert {result["metric"]["rig"] for result in query(SCREENSHOT_QUERY)}, "the graphed query has no series"
    print(f"screenshot: {out}")
