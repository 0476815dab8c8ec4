"""/metrics parsing against texts recorded from a real vLLM 0.32 CPU server (tests/fixtures/metrics)."""

import json
import re
from pathlib import Path

import pytest

FIXTURES_DIR = Path(__file__).resolve().parents[1] / "fixtures"
from rigkit.metrics import MetricsError, delta, parse, parse_families, process_start, require_prefix_counters

METRICS = FIXTURES_DIR / "metrics"
STEPS = {s["file"]: s for s in json.loads((METRICS / "steps.json").read_text())}


def text(name: str) -> str:
    return (METRICS / f"{name}.txt").read_text()


def snap(name: str):
    return parse(text(name))


def test_counter_families_lose_total_but_samples_keep_it():
    families = parse_families(text("01-after-cold"))
    assert "vllm:prefix_cache_hits" in families and "vllm:prefix_cache_hits_total" not in families
    sample_names = {s.name for s in families["vllm:prefix_cache_hits"].samples}
    assert "vllm:prefix_cache_hits_total" in sample_names


def test_idle_server_reports_its_pool_and_zero_counters():
    idle = require_prefix_counters(snap("00-idle"))
    assert idle.num_gpu_blocks == 72 and idle.block_size == 128
    assert idle.gpu_pool_tokens == 72 * 128
    assert idle.prefix_cache_queries == 0 and idle.ttft_count == 0


def test_cold_window_counts_the_prompt_as_queried_and_computed():
    window = delta(snap("00-idle"), snap("01-after-cold"))
    prompt_tokens = STEPS["01-after-cold.txt"]["prompt_tokens"]
    assert not window.reset
    assert window.prefix_cache_queries == prompt_tokens
    assert window.prefix_cache_hits == 0 and window.external_prefix_cache_hits == 0
    assert window.tokens_from("local_compute") == prompt_tokens
    assert window.generation_tokens == 16
    assert window.ttft_count == 1
    assert window.ttft_buckets[float("inf")] == 1
    # the client-side TTFT recorded beside the fixture is close to the server's own
    assert window.server_ttft_mean == pytest.approx(STEPS["01-after-cold.txt"]["ttft_s"], abs=0.15, rel=0.25)


def test_repeat_window_shows_gpu_hits_equal_to_cached_tokens():
    window = delta(snap("01-after-cold"), snap("02-after-warm-gpu"))
    assert window.prefix_cache_hits == STEPS["02-after-warm-gpu.txt"]["cached_tokens"] > 0
    assert window.tokens_from("local_cache_hit") == window.prefix_cache_hits
    assert window.external_prefix_cache_hits == 0


def test_connector_window_shows_external_hits_only():
    window = delta(snap("03-after-fillers"), snap("04-after-warm-connector"))
    assert window.prefix_cache_hits == 0
    assert window.external_prefix_cache_hits > 0
    assert window.tokens_from("external_kv_transfer") == window.external_prefix_cache_hits


def test_restart_between_scrapes_is_detected_as_a_counter_reset():
    window = delta(snap("04-after-warm-connector"), snap("05-restarted-idle"))
    assert window.reset
    assert window.prefix_cache_queries == 0  # counts from zero, never negative


def test_counters_are_summed_over_engines_and_gauges_are_not():
    one = text("01-after-cold")
    lines = []
    for line in one.splitlines():
        lines.append(line)
        if not line.startswith("#") and 'engine="0"' in line:
            lines.append(line.replace('engine="0"', 'engine="1"'))
    two = parse("\n".join(lines) + "\n")
    single = parse(one)
    assert two.prefix_cache_queries == 2 * single.prefix_cache_queries > 0
    assert two.ttft_count == 2 * single.ttft_count
    assert two.prompt_tokens_by_source["local_compute"] == 2 * single.prompt_tokens_by_source["local_compute"]
    assert two.kv_cache_usage_perc == single.kv_cache_usage_perc
    assert two.num_gpu_blocks == single.num_gpu_blocks


def test_a_scrape_without_prefix_counters_is_refused():
    stripped = (
        "\n".join(
            line for line in text("00-idle").splitlines() if not re.search(r"vllm:prefix_cache_(queries|hits)", line)
        )
        + "\n"
    )
    with pytest.raises(MetricsError, match="prefix-cache counters are missing"):
        require_prefix_counters(parse(stripped))


def test_non_prometheus_text_is_refused():
    with pytest.raises(MetricsError, match="not Prometheus text format"):
        parse("<html>not metrics</html>\n{")


def test_server_decode_speed_of_a_one_request_window():
    # recorded from a real vLLM: one request of 16 generated tokens between the two scrapes
    window = delta(parse((METRICS / "00-idle.txt").read_text()), parse((METRICS / "01-after-cold.txt").read_text()))
    assert window.decode_time_count == 1 and window.generation_tokens == 16
    assert window.server_decode_tps(16) == pytest.approx(15 / window.decode_time_sum)
    # a window holding several requests cannot name one request's decode time
    idle = parse((METRICS / "00-idle.txt").read_text())
    assert delta(idle, parse((METRICS / "04-after-warm-connector.txt").read_text())).server_decode_tps(16) is None


def test_a_restart_is_a_new_process_start_time_and_lmcaches_own_does_not_count():
    before, after = ((METRICS / f"{step}.txt").read_text() for step in ("04-after-warm-connector", "05-restarted-idle"))
    assert process_start(before) < process_start(after)
    assert process_start(before + "process_start_time_seconds 1.0\n") == process_start(before)  # vLLM's comes first
    assert process_start("vllm:num_requests_running 0.0\n") is None
