"""Every metric a dashboard panel or an alert rule queries is one a real exporter served: vLLM 0.26 (the H200
captures) or 0.32 (the lab's CPU build), LMCache 0.5.3, vllm-router 0.1.17, Debian's node exporter 1.5.0, or
rigkit's textfile collector. A name vLLM has since removed (production-stack's dashboards still query
vllm:gpu_prefix_cache_hits_total) fails here, before any lab run."""

from __future__ import annotations

import re
from pathlib import Path

from rigkit.files import node_textfile
from rigkit.monitoring.queries import FLEET_PANELS, LAB_LACKS, NEEDS, PANELS, RULES, UP, Panel

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CAPTURES = {
    "vLLM 0.26 + LMCache 0.5.3 (H200)": sorted((FIXTURES / "gpu-h200-vllm0.26").glob("*/*.txt")),
    "vLLM 0.32 (lab CPU build)": sorted((FIXTURES / "metrics").glob("*.txt")),
    "vllm-router 0.1.17": [FIXTURES / "router" / "vllm-router-0.1.17-metrics.txt"],
}
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]")
METRIC_TOKEN = re.compile(r"\b(?:vllm:|vllm_router_|lmcache_mp_|rigkit_|node_)[a-zA-Z0-9_:]+")


def served_names() -> dict[str, set]:
    served = {
        source: {m.group(1) for path in paths for m in map(SAMPLE.match, path.read_text().splitlines()) if m}
        for source, paths in CAPTURES.items()
    }
    served["node exporter 1.5.0"] = set((FIXTURES / "node-exporter" / "metric-names-1.5.0.txt").read_text().split())
    served["rigkit textfile"] = {
        value for name, value in vars(node_textfile).items() if name.isupper() and str(value).startswith("rigkit_")
    }
    served["Prometheus"] = {UP}
    return served


def unserved(queries) -> list[str]:
    everything = set().union(*served_names().values())
    return [
        f"{query.title if isinstance(query, Panel) else query.alert}: {metric}"
        for query in queries
        for metric in query.metrics
        if metric not in everything
    ]


def test_every_queried_metric_was_served_by_a_real_exporter():
    assert served_names()["vLLM 0.26 + LMCache 0.5.3 (H200)"], "no capture read"
    assert unserved([*PANELS, *FLEET_PANELS, *RULES]) == []


def test_a_removed_vllm_name_is_caught():
    stale = Panel(
        "Prefix hits (production-stack's)",
        "rate(vllm:gpu_prefix_cache_hits_total[5m])",
        ("vllm:gpu_prefix_cache_hits_total",),
    )
    assert unserved([stale]) == ["Prefix hits (production-stack's): vllm:gpu_prefix_cache_hits_total"]


def test_each_query_names_exactly_the_metrics_it_declares():
    for query in [*PANELS, *FLEET_PANELS, *RULES]:
        text = re.sub(r'"[^"]*"', '""', query.query if isinstance(query, Panel) else query.expr)  # not labels
        in_text = set(METRIC_TOKEN.findall(text)) | ({UP} if re.search(r"\bup\{", text) else set())
        assert in_text == set(query.metrics), query


def test_cached_by_source_is_the_one_vllm_026_lacks():
    names = served_names()
    vllm = {m for q in [*PANELS, *RULES] for m in q.metrics if m.startswith("vllm:")}
    missing_026 = {m for m in vllm if m not in names["vLLM 0.26 + LMCache 0.5.3 (H200)"]}
    assert missing_026 == {"vllm:prompt_tokens_cached_by_source_total"}
    assert set(LAB_LACKS) <= set(NEEDS)
