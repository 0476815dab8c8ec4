"""``python -m rigkit.monitoring``: write the committed files (monitoring/grafana/*.json, monitoring/rigkit-rules.yml
with the default thresholds) from the declarations; tests/monitoring fails while they are stale."""

from rigkit.monitoring.dashboards import write
from rigkit.monitoring.prometheus import DEFAULT_RULES_PATH, default_rules_text

if __name__ == "__main__":
    for path in write():
        print(path)
    DEFAULT_RULES_PATH.write_text(default_rules_text())
    print(DEFAULT_RULES_PATH)
