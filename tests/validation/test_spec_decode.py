"""Speculative decoding on the card: acceptance from vLLM's vllm:spec_decode_num_* counter deltas.

The captures (tests/fixtures/gpu-h200-vllm0.26) ran without a speculative config, so the counters in the
`*-synthetic-spec-decode.txt` files are made up (appended to the real /metrics texts, vLLM 0.26's names,
help texts and labels; values consistent with each capture's generated tokens). Nothing else in them is.
"""

from pathlib import Path

import pytest
from card_samples import make_card

from rigkit import metrics
from rigkit.remote.client import StreamResult
from rigkit.validation.card import SpecDecode, render_rig_markdown
from rigkit.validation.card.assemble import to_card
from rigkit.validation.decode_ab import spec_decode_over
from rigkit.validation.measure import Measured
from rigkit.validation.procedure import TierValidation, ValidationSettings
from rigkit.validation.tier_run import TierRun
from rigkit.validation.tiers import Tier

CAPTURES = Path(__file__).parents[1] / "fixtures" / "gpu-h200-vllm0.26" / "baseline-eager"
BEFORE_DECODE = CAPTURES / "04-after-warm-connector-synthetic-spec-decode.txt"
AFTER_DECODE = CAPTURES / "05-after-decode-synthetic-spec-decode.txt"


def decode_window() -> metrics.Delta:
    return metrics.delta(metrics.parse(BEFORE_DECODE.read_text()), metrics.parse(AFTER_DECODE.read_text()))


def test_the_spec_decode_counters_are_read_and_differenced():
    window = decode_window()
    assert (window.spec_decode_drafts, window.spec_decode_draft_tokens, window.spec_decode_accepted_tokens) == (
        220,
        660,
        548,
    )
    # every step emits its accepted drafts plus one token of its own: the capture's 768 generated tokens
    assert window.spec_decode_drafts + window.spec_decode_accepted_tokens == window.generation_tokens == 768


def test_a_real_capture_without_speculative_decoding_reads_zero():
    text = (
        Path(__file__).parents[1] / "fixtures" / "gpu-h200-vllm0.26" / "offload-eager" / "01-after-cold.txt"
    ).read_text()
    snapshot = metrics.parse(text)
    assert snapshot.spec_decode_draft_tokens == 0 and snapshot.generation_tokens > 0


def test_acceptance_is_accepted_over_draft_tokens_over_the_window():
    spec = spec_decode_over([decode_window()], "the decode runs")
    assert spec.acceptance_rate == pytest.approx(548 / 660)  # 83.0 %, the story's "MTP acceptance ~83%"
    assert spec.mean_acceptance_length == pytest.approx(1 + 548 / 220)


def test_windows_are_summed_not_averaged():
    idle = metrics.delta(metrics.parse(BEFORE_DECODE.read_text()), metrics.parse(BEFORE_DECODE.read_text()))
    spec = spec_decode_over([decode_window(), idle, decode_window()], "three windows")
    assert (spec.draft_tokens, spec.accepted_tokens) == (1320, 1096)
    assert spec_decode_over([idle], "an idle window") is None


def _validation_with(window: metrics.Delta) -> TierValidation:
    result = StreamResult(
        ttft_s=0.1,
        total_s=1.0,
        prompt_tokens=512,
        completion_tokens=256,
        cached_tokens=0,
        chunks=256,
        text="x",
        decode_tps=80.0,
    )
    run = TierRun(Tier.COLD, measured=[Measured(result, window, None)])
    return TierValidation([run], [], None, metrics.parse(BEFORE_DECODE.read_text()), 8192, [])


def test_the_card_carries_the_acceptance_of_the_measured_requests():
    card = to_card("rig", "run", _validation_with(decode_window()), ValidationSettings.from_data({}), speculative=True)
    assert card.spec_decode.draft_tokens == 660 and not card.failures
    markdown = render_rig_markdown(card)
    serving = markdown[markdown.index("## ① Serving") : markdown.index("## ②")]
    assert "| this run | 83.0 % (548 / 660) | 3.49 tokens per step | the 1 measured tier requests |" in serving


def test_speculative_decoding_configured_but_never_drafting_fails_the_card():
    idle = metrics.delta(metrics.parse(BEFORE_DECODE.read_text()), metrics.parse(BEFORE_DECODE.read_text()))
    card = to_card("rig", "run", _validation_with(idle), ValidationSettings.from_data({}), speculative=True)
    assert card.spec_decode is None and not card.passed
    assert any("vllm:spec_decode_num_draft_tokens_total" in failure for failure in card.failures)
    assert to_card("rig", "run", _validation_with(idle), ValidationSettings.from_data({})).spec_decode is None


def test_the_decode_ab_table_has_an_acceptance_row_per_arm():
    card = make_card()
    spec = spec_decode_over([decode_window()], "the 10 measured decode runs")
    card.decode_ab.spec_decode = {
        "on": spec,
        "off": SpecDecode(drafts=10, draft_tokens=30, accepted_tokens=24, window="the 10 measured decode runs"),
    }
    markdown = render_rig_markdown(card)
    assert "| spec-decode acceptance | 83.0 % (548 / 660) | 80.0 % (24 / 30) | |" in markdown
    reloaded = type(card).model_validate_json(card.model_dump_json())
    assert reloaded.decode_ab.spec_decode["on"].acceptance_rate == pytest.approx(548 / 660)


def test_a_card_without_speculative_decoding_shows_no_acceptance():
    assert "acceptance" not in render_rig_markdown(make_card())
