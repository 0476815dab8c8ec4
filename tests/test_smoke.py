import json

from rigkit.smoke import SmokeCheck, SmokeReport, check_container, parse_env_output

INSPECT = json.dumps([{"Config": {
    "Entrypoint": ["bash", "-c"],
    "Cmd": ["lmcache server --l1-size-gb $${LMCACHE_L1_GB} & exec vllm serve m "
            "--kv-transfer-config '{\"kv_connector\":\"LMCacheMPConnector\"}'"],
}}])


def test_env_output_parses_values_with_equals_signs():
    env = parse_env_output("A=1\nJSON={\"a\":\"b=c\"}\nNOEQUALS\n")
    assert env == {"A": "1", "JSON": '{"a":"b=c"}'}


def test_knob_missing_from_container_fails_with_both_values():
    checks = check_container("LMCACHE_L1_GB=30\n", INSPECT,
                             {"LMCACHE_L1_GB": "30", "LMCACHE_L2": "1"}, [])
    env_check = checks[0]
    assert not env_check.ok
    assert "LMCACHE_L2='1' got None" in env_check.detail


def test_matching_env_and_connector_pass():
    checks = check_container("LMCACHE_L1_GB=30\nLMCACHE_L2=1\n", INSPECT,
                             {"LMCACHE_L1_GB": "30", "LMCACHE_L2": "1"},
                             ["LMCacheMPConnector", "lmcache server"])
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
