"""rigkit's alert rules: the committed file is what the declarations render, promtool (Debian's prometheus package,
bin/setup) accepts it and passes its unit tests (rules_test.yml), and a rule broken on purpose fails them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rigkit.monitoring.prometheus import DEFAULT_RULES_PATH, default_rules_text, rules_text
from rigkit.monitoring.queries import RULES
from rigkit.settings.defaults import MONITORING_VARIABLES

PROMTOOL = shutil.which("promtool")
RULES_TEST = Path(__file__).with_name("rules_test.yml")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (bin/setup installs prometheus)")


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def test_the_committed_rules_are_the_declarations():
    assert DEFAULT_RULES_PATH.read_text() == default_rules_text(), "stale: run .venv/bin/python -m rigkit.monitoring"


def test_promtool_checks_the_rules():
    result = promtool("check", "rules", str(DEFAULT_RULES_PATH))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(RULES)} rules found" in result.stdout


def test_promtool_unit_tests_every_alert():
    tested = {line.split(":", 1)[1].strip() for line in RULES_TEST.read_text().splitlines() if "alertname:" in line}
    assert tested == {rule.alert for rule in RULES}
    result = promtool("test", "rules", str(RULES_TEST))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "broken, why",
    [
        ('reason!="sw_power_cap"', "a capped rig at its cap counted as throttled"),
        ("> 0.95 and", "any full pool, no queue needed"),
    ],
)
def test_a_broken_rule_fails_its_unit_test(tmp_path, broken, why):
    text = default_rules_text()
    assert broken in text
    (tmp_path / "monitoring").mkdir()
    (tmp_path / "monitoring" / "rigkit-rules.yml").write_text(
        text.replace(broken, "" if broken.startswith("reason") else "> 0.95 or")
    )
    (tmp_path / "tests" / "monitoring").mkdir(parents=True)
    (tmp_path / "tests" / "monitoring" / RULES_TEST.name).write_text(RULES_TEST.read_text())
    result = promtool("test", "rules", str(tmp_path / "tests" / "monitoring" / RULES_TEST.name))
    assert result.returncode != 0, why


def test_thresholds_come_from_the_monitoring_settings():
    settings = {variable.name: variable.default for variable in MONITORING_VARIABLES}
    text = rules_text({**settings, "monitoring_l2_budget_fraction": 0.75, "monitoring_ttft_regression_factor": 3.5})
    assert "rigkit_l2_store_bytes > 0.75 * rigkit_l2_budget_bytes" in text
    assert "> 3.5 * histogram_quantile" in text
