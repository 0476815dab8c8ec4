"""Issue 41 on an H100: `rigkit validate --url` against three GPU-check stacks known by URL alone (bench/gpu/url.py,
vLLM 0.26.0, LMCache 0.5.3; the model trained on the prompts' text). Each command was given the URL, the profile, a
restart command and the validation data, nothing of the machine; its card and output are kept as they came back
(tests/fixtures/gpu-h100-vllm0.26/validate-url-2026-12-06). These tests hold what the run showed and re-render each
card with today's code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigkit.validation.card import render_run, write_card
from rigkit.validation.card.schema import RigCard

RUN = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-h100-vllm0.26" / "validate-url-2026-12-06"
TIERS = ["cold", "warm-gpu", "warm-connector", "warm-persistent"]


def card(case: str) -> RigCard:
    return RigCard.model_validate_json((RUN / case / f"{case}.card.json").read_text())


@pytest.mark.parametrize("case", ["native-tiered", "lmcache-mp-l2", "native-tiered-corrupt"])
def test_each_command_was_given_the_url_and_nothing_of_the_machine(case):
    command = json.loads((RUN / case / "command.json").read_text())
    options = {word for word in command if word.startswith("--")}
    assert options <= {
        "--url",
        "--profile",
        "--name",
        "--restart-command",
        "--run-dir",
        "--data",
        "--lmcache-metrics-url",
    }
    data = [command[i + 1] for i, word in enumerate(command) if word == "--data"]
    assert all(item.startswith("validate_") or item == "l2_enabled=true" for item in data), data


@pytest.mark.parametrize("case", ["native-tiered", "lmcache-mp-l2"])
def test_a_clean_stack_by_url_passes_every_tier_the_persistent_one_through_its_restart_command(case, tmp_path):
    result = card(case)
    assert result.passed and json.loads((RUN / "summary.json").read_text())[case]["exit"] == 0
    assert [str(t.expected) for t in result.tiers] == TIERS and result.not_applicable == {}
    for tier in result.tiers:
        assert tier.labels == [str(tier.expected)] * 3 and tier.passed
    assert result.ttft_client.transport.startswith("the controller, through http://127.0.0.1:")
    write_card(tmp_path, result)
    render_run(tmp_path)
    assert "**Verdict: PASS**" in (tmp_path / f"{case}.md").read_text()


def test_the_bit_exact_tiers_moved_no_logprob_and_lmcache_stayed_within_its_measured_tolerance():
    native = card("native-tiered").numerics
    assert native.tolerances["warm-persistent"] == 0.0 and native.repeat_nats == 0.0
    assert {check.shift_nats for tier in card("native-tiered").tiers[2:] for check in tier.greedy} == {0.0}
    lmcache = card("lmcache-mp-l2")
    for tier in lmcache.tiers[2:]:
        assert all(check.shift_nats <= check.tolerance_nats for check in tier.greedy)


def test_the_store_damaged_behind_the_url_fails_the_card_served_but_wrong_in_every_session(tmp_path):
    result = card("native-tiered-corrupt")
    assert json.loads((RUN / "summary.json").read_text())["native-tiered-corrupt"]["exit"] == 1
    assert not result.passed
    persistent = result.tiers[-1]
    assert persistent.labels == ["warm-persistent"] * 3  # the counters alone would have passed it
    assert [check.verdict for check in persistent.greedy] == ["served-but-wrong"] * 3
    assert all(check.shift_nats > check.tolerance_nats for check in persistent.greedy)
    write_card(tmp_path, result)
    render_run(tmp_path)
    assert "**Verdict: FAIL**" in (tmp_path / "native-tiered-corrupt.md").read_text()
