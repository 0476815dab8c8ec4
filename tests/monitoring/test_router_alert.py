"""RigOutOfRouter and the router's panels against the real programs: Debian's Prometheus (bin/setup) with rigkit's
configuration and rules, scraping the real vllm-router (the test extra's release) and its two workers, stand-ins
that serve a captured vLLM 0.32 /metrics (tests/fixtures/metrics). A worker taken out with /remove_worker, as a
halted rollout leaves one, makes the alert's expression return the count of rigs serving; before, it returns none."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests
from fake_openai import FakeOpenAI
from router_process import RouterProcess, free_port

from rigkit.monitoring.prometheus import Target, config_text, rules_text
from rigkit.monitoring.queries import FLEET_PANELS, JOB_ROUTER, JOB_VLLM, RULES, panel_query, rule_expr
from rigkit.settings.defaults import MONITORING_VARIABLES

PROMETHEUS = shutil.which("prometheus")
CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "metrics" / "05-restarted-idle.txt"
SETTINGS = {**{variable.name: variable.default for variable in MONITORING_VARIABLES}, "monitoring_scrape_interval_s": 1}
OUT_OF_ROUTER = next(rule for rule in RULES if rule.alert == "RigOutOfRouter")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (bin/setup installs it)")


class Prometheus:
    def __init__(self, folder: Path, targets: list[Target]):
        rules = folder / "rules.yml"
        rules.write_text(rules_text(SETTINGS))
        config = folder / "prometheus.yml"
        config.write_text(config_text(SETTINGS, targets).replace("/etc/prometheus/rigkit-rules.yml", str(rules)))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.argv = [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address={self.url.removeprefix('http://')}",
        ]
        self.log = folder / "prometheus.log"

    def __enter__(self) -> "Prometheus":
        self.process = subprocess.Popen(self.argv, stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        return self

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)

    def query(self, expr: str) -> list:
        answer = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5).json()
        assert answer["status"] == "success", (expr, answer)
        return answer["data"]["result"]

    def wait_for(self, expr: str, check, timeout_s: float = 30) -> list:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                result = self.query(expr)
                if check(result):
                    return result
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, (
                f"{expr}: not as wanted in {timeout_s} s:\n{self.log.read_text()[-2000:]}"
            )
            time.sleep(0.5)


def test_a_rig_taken_out_of_the_router_fires_and_the_router_panels_have_series(tmp_path):
    with FakeOpenAI() as rig1, FakeOpenAI() as rig2:
        for worker in (rig1, rig2):
            worker.metrics_text = CAPTURE.read_text()
        with RouterProcess([rig1.url, rig2.url]) as router:
            requests.post(f"{router.url}/v1/completions", json={"model": "tiny", "prompt": "hi"}, timeout=10)
            targets = [
                Target(
                    JOB_VLLM, worker.url.removeprefix("http://"), {"rig": name, "profile": "cpu-lab", "release": "r"}
                )
                for name, worker in (("rig1", rig1), ("rig2", rig2))
            ] + [Target(JOB_ROUTER, f"127.0.0.1:{router.prometheus_port}", {"gateway": "gw"})]
            with Prometheus(tmp_path, targets) as prometheus:
                prometheus.wait_for("up == 1", lambda result: len(result) == 3)
                rules = requests.get(f"{prometheus.url}/api/v1/rules", timeout=5).json()["data"]["groups"][0]["rules"]
                assert [(rule["name"], rule["health"]) for rule in rules] == [(r.alert, "ok") for r in RULES]
                prometheus.wait_for("vllm_router_active_workers", lambda result: result)
                assert prometheus.query(rule_expr(OUT_OF_ROUTER, SETTINGS)) == []
                for panel in FLEET_PANELS:
                    prometheus.wait_for(panel_query(panel), lambda result: result)

                removed = requests.post(f"{router.url}/remove_worker", params={"url": rig2.url}, timeout=10)
                assert removed.status_code == 200, removed.text
                fired = prometheus.wait_for(rule_expr(OUT_OF_ROUTER, SETTINGS), lambda result: result)
                assert [float(sample["value"][1]) for sample in fired] == [2.0]  # two rigs serve, one routed
