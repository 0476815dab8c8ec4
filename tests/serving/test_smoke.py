"""Smoke checks: the container's env and command line from recorded `docker` output, the HTTP checks against
a fake OpenAI-compatible server on loopback (tests/fake_openai.py) answering with vLLM's recorded /metrics."""

import json
import re
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI

from rigkit.metrics import parse_families
from rigkit.serving.smoke import (
    MIN_STREAM_CHUNKS,
    PREFIX_CACHE_COUNTERS,
    SmokeCheck,
    SmokeReport,
    check_container,
    check_http,
    parse_env_output,
)

INSPECT = json.dumps(
    [
        {
            "Config": {
                "Entrypoint": ["bash", "-c"],
                "Cmd": [
                    "lmcache server --l1-size-gb $${LMCACHE_L1_GB} & exec vllm serve m "
                    '--kv-transfer-config \'{"kv_connector":"LMCacheMPConnector"}\''
                ],
            }
        }
    ]
)


def test_env_output_parses_values_with_equals_signs():
    env = parse_env_output('A=1\nJSON={"a":"b=c"}\nNOEQUALS\n')
    assert env == {"A": "1", "JSON": '{"a":"b=c"}'}


def test_knob_missing_from_container_fails_with_both_values():
    checks = check_container("LMCACHE_L1_GB=30\n", INSPECT, {"LMCACHE_L1_GB": "30", "LMCACHE_L2": "1"}, [])
    env_check = checks[0]
    assert not env_check.ok
    assert "LMCACHE_L2='1' got None" in env_check.detail


def test_matching_env_and_connector_pass():
    checks = check_container(
        "LMCACHE_L1_GB=30\nLMCACHE_L2=1\n",
        INSPECT,
        {"LMCACHE_L1_GB": "30", "LMCACHE_L2": "1"},
        ["LMCacheMPConnector", "lmcache server"],
    )
    assert all(c.ok for c in checks), checks


def test_connector_missing_from_command_line_fails():
    checks = check_container("", INSPECT, {}, ["OffloadingConnector"])
    assert not checks[1].ok and "OffloadingConnector" in checks[1].detail


def test_report_passes_only_when_every_check_does():
    assert not SmokeReport().passed
    report = SmokeReport([SmokeCheck("a", True), SmokeCheck("b", False, "boom")])
    assert not report.passed
    assert report.summary() == "smoke FAIL: b: boom"


def test_a_secret_that_did_not_reach_the_container_is_named_never_shown():
    checks = check_container("HF_TOKEN=hf_planted_wrong\n", INSPECT, {"HF_TOKEN": "hf_planted_declared"}, [])
    (env,) = [check for check in checks if check.name == "env"]
    assert not env.ok and "HF_TOKEN" in env.detail
    assert "hf_planted" not in env.detail


# --- the HTTP checks, against the fake server ----------------------------------------------------------

# vLLM's own /metrics, recorded from the lab's CPU build
RECORDED_METRICS = (Path(__file__).parents[1] / "fixtures" / "metrics" / "00-idle.txt").read_text()


@pytest.fixture
def api():
    with FakeOpenAI() as server:
        server.metrics_text = RECORDED_METRICS
        yield server


def verdicts(api, served_name: str = "tiny") -> dict[str, SmokeCheck]:
    return {check.name: check for check in check_http(api.url, served_name, timeout=10)}


def failed(checks: dict[str, SmokeCheck]) -> dict[str, str]:
    return {name: check.detail for name, check in checks.items() if not check.ok}


def test_a_server_that_answers_as_vllm_passes_every_http_check(api):
    checks = verdicts(api)
    assert list(checks) == ["health", "models", "chat", "stream", "metrics"] and failed(checks) == {}


def test_a_missing_served_name_fails_the_models_check(api):
    api.served_names = ["some-other-model"]
    problems = failed(verdicts(api, "tiny"))
    assert "models" in problems and "'tiny' not in /v1/models ['some-other-model']" in problems["models"]


@pytest.mark.parametrize("chunks", [0, MIN_STREAM_CHUNKS - 1])
def test_a_short_or_empty_stream_fails_the_stream_check(api, chunks):
    api.stream_chunks = chunks
    problems = failed(verdicts(api))
    assert list(problems) == ["stream"], problems
    assert f"gave {chunks} chunks, expected >= {MIN_STREAM_CHUNKS}" in problems["stream"]


def test_a_stream_of_exactly_the_minimum_passes(api):
    api.stream_chunks = MIN_STREAM_CHUNKS
    assert failed(verdicts(api)) == {}


@pytest.mark.parametrize("counter", PREFIX_CACHE_COUNTERS)
def test_metrics_without_a_prefix_cache_counter_fail_the_metrics_check(api, counter):
    family = re.compile(rf"^(# (HELP|TYPE) )?{re.escape(counter)}(_total|_created)?[ {{]")
    api.metrics_text = "".join(line for line in RECORDED_METRICS.splitlines(keepends=True) if not family.match(line))
    assert counter not in parse_families(api.metrics_text) and len(parse_families(api.metrics_text)) > 10
    problems = failed(verdicts(api))
    assert list(problems) == ["metrics"], problems
    assert problems["metrics"] == f"ValueError: /metrics lacks {[counter]}"


def test_a_smoke_report_with_a_failed_http_check_fails(api):
    api.served_names = []
    assert not SmokeReport(check_http(api.url, "tiny", timeout=10)).passed


def test_env_output_splits_at_newlines_only():
    output = "RIGKIT_MODEL=a\u2028b\x0cc\x85d\nHF_TOKEN=x\n"
    assert parse_env_output(output) == {"RIGKIT_MODEL": "a\u2028b\x0cc\x85d", "HF_TOKEN": "x"}
