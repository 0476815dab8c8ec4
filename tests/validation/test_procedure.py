"""rigkit.validation.procedure: validate_tiers driven by recorded /metrics: a real ServingClient against the fake
OpenAI-compatible server of tests/fake_openai.py, whose /metrics answers, request by request, with the texts a
real vLLM CPU server printed at each step of the tier procedure (tests/fixtures/metrics/steps.json), so each tier
is judged as on a real rig.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI

# --- validate_tiers on recorded /metrics ------------------------------------------------------------
from recorded_run import RecordedRun

from rigkit.errors import ConfigError
from rigkit.remote.client import ServingClient
from rigkit.settings.defaults import REPLAY
from rigkit.settings.defaults import VALIDATION_VARIABLES as VARIABLES
from rigkit.settings.eviction import LMCACHE_L1, VLLM_LRU
from rigkit.validation.card.assemble import to_card
from rigkit.validation.card.rig import render_rig_markdown
from rigkit.validation.greedy import compare_greedy
from rigkit.validation.procedure import (
    LOGPROBS_WARMUP_PROMPT,
    ValidationSettings,
    capacity_from,
    check_prompt_fits,
    validate_tiers,
)
from rigkit.validation.tiers import Tier


@pytest.fixture
def recorded():
    with FakeOpenAI() as server:
        yield RecordedRun(server)


def run(recorded: RecordedRun, restart: bool = True):
    client = ServingClient(recorded.server.url, model="tiny")
    settings = ValidationSettings.from_data({"validate_sessions": 1, "validate_seed": 1234})
    return validate_tiers(client, recorded.restart if restart else None, settings, connector_configured=True)


GPU_CAPTURES = Path(__file__).parents[1] / "fixtures" / "gpu-h200-vllm0.26"


def test_lmcache_0_5_3_on_an_h200_card_says_the_l1_tier_by_its_counters():
    """The real LMCache 0.5.3 MP capture (vLLM's /metrics followed by LMCache's): its labelled lookup counter is
    read, and with no per-tier hit counters in 0.5.3 the card tells the tier from the chunks it loaded."""
    with FakeOpenAI() as server:
        recorded = RecordedRun(server, GPU_CAPTURES / "lmcache-mp-eager")
        validation = run(recorded, restart=False)
    connector = validation.tier(Tier.WARM_CONNECTOR)
    assert [t.result().passed for t in validation.tiers] == [True, True, True]
    assert connector.labels[0].connector_retrieved_tokens == 2816
    card = to_card("rig1", "run", validation, ValidationSettings.from_data({}))
    assert "warm-connector (LMCache L1, by LMCache's counters) ✓" in render_rig_markdown(card)


def test_recorded_counters_label_each_tier_and_the_one_after_a_restart_warm_persistent(recorded):
    validation = run(recorded)
    assert [(t.expected, [label.tier for label in t.labels]) for t in validation.tiers] == [
        (Tier.COLD, [Tier.COLD]),
        (Tier.WARM_GPU, [Tier.WARM_GPU]),
        (Tier.WARM_CONNECTOR, [Tier.WARM_CONNECTOR]),
        (Tier.WARM_PERSISTENT, [Tier.WARM_PERSISTENT]),
    ]
    assert all(t.result().passed for t in validation.tiers) and validation.failures == []
    assert recorded.step == "06-after-warm-persistent"  # every recorded step was walked
    assert validation.fillers_sent > 0
    persistent = validation.tier(Tier.WARM_PERSISTENT).labels[0]
    assert persistent.gpu_hits == 0 and persistent.external_hits > 0, persistent.proof


def test_a_tier_with_an_aborted_run_fails_even_when_its_counters_prove_the_tier(recorded):
    def abort_after_the_restart(body: dict) -> None:
        RecordedRun.completion(recorded, body)
        if recorded.step == "06-after-warm-persistent":  # the engine served the prefix, then the stream broke
            recorded.server.drop_stream_after = 1

    recorded.server.on_completion = abort_after_the_restart
    validation = run(recorded)
    persistent = validation.tier(Tier.WARM_PERSISTENT)
    assert [label.tier for label in persistent.labels] == [Tier.WARM_PERSISTENT] and persistent.labels[0].passed
    result = persistent.result()
    assert not result.passed and result.aborted == ["decode"]
    assert [t.result().passed for t in validation.tiers[:3]] == [True, True, True]


# --- validate.py's settings: counts positive, kinds named, None only where declared -----------------------


@pytest.mark.parametrize(
    "name, value",
    [
        ("validate_output_tokens", 0),
        ("validate_decode_tokens", 0),
        ("validate_decode_prompt_tokens", 0),
        ("validate_sessions", 0),
        ("validate_prompt_kind", "poetry"),
        ("validate_soak_memory_growth_mib", -1),
        ("validate_soak_memory_growth_mib", math.nan),
        ("validate_sessions", None),
        ("validate_sessions", 2.5),
        ("validate_restart", "maybe"),
    ],
)
def test_bad_validation_settings_refused_naming_the_field(name, value):
    with pytest.raises(ConfigError) as refused:
        ValidationSettings.from_data({name: value})
    assert refused.value.field == name


def test_unset_seed_and_replay_are_declared():
    assert ValidationSettings.from_data({"validate_seed": None}).seed is None
    assert REPLAY.coerce(None) is None
    assert all(v.optional is not None for v in [*VARIABLES, REPLAY] if v.default is None)


def test_good_values_pass():
    settings = ValidationSettings.from_data(
        {"validate_prompt_kind": "code", "validate_sessions": "5", "validate_seed": 7.0}
    )
    assert (settings.prompt_kind, settings.sessions, settings.seed) == ("code", 5, 7)


@pytest.mark.parametrize(
    "seed,label,passed", [("fixed", Tier.WARM_PERSISTENT, True), ("random", Tier.RETRIEVED_BUT_UNUSED, False)]
)
def test_native_tiered_disk_tier_after_a_restart_hits_only_with_a_fixed_hash_seed(seed, label, passed):
    """The H200 native-tiered captures: after a full restart with PYTHONHASHSEED=0 the disk tier serves (external
    hits +3,024 of 3,030); with a random seed its file names differ and nothing hits."""
    with FakeOpenAI() as server:
        recorded = RecordedRun(
            server,
            GPU_CAPTURES / "native-tiered-eager",
            f"06-seed-{seed}-restarted-idle",
            f"07-seed-{seed}-after-warm-persistent",
        )
        validation = run(recorded)
    assert [t.result().passed for t in validation.tiers[:3]] == [True, True, True]
    persistent = validation.tier(Tier.WARM_PERSISTENT)
    assert persistent.labels[0].tier == label and persistent.result().passed is passed
    if passed:
        assert persistent.labels[0].external_hits == 3024
        assert "queries re-counted: 48480 for 3030 prompt tokens" in persistent.labels[0].proof


# --- served-but-wrong: each warm tier's greedy output against the cold run's ----------------------------


def test_the_restarted_engine_is_warmed_up_before_the_persistent_tier_is_timed(recorded):
    # vLLM CPU compiles its logprobs path at a new engine's first such request: 13 s landed in one persistent
    # session's TTFT in a lab demo (4.54 s mean of 3, CV 172 %) before this warm-up
    bodies, restarts = [], []
    replay = recorded.completion
    recorded.server.on_completion = lambda body: (bodies.append(body), replay(body))
    restart = recorded.restart
    recorded.restart = lambda: (restarts.append(len(bodies)), restart())
    run(recorded)
    (at,) = restarts
    first = bodies[at]
    assert first["prompt"] == LOGPROBS_WARMUP_PROMPT and first["max_tokens"] == 1 and first["logprobs"]
    assert bodies[at + 1]["prompt"] == recorded.session_prompt  # then the persistent tier's measured request


def test_every_tier_request_is_greedy_with_its_sessions_seed(recorded):
    run(recorded)
    session = [body for body in recorded.server.completions if body["prompt"] == recorded.session_prompt]
    assert len(session) == 5  # cold, warm-gpu, its unmeasured repeat, warm-connector, warm-persistent
    assert {(body["temperature"], body["seed"]) for body in session} == {(0.0, 1234)}


def test_a_warm_tier_proven_by_its_counters_but_answering_otherwise_is_served_but_wrong(recorded):
    """LMCache#4492: after a restart the prefix came from the store (its counters prove warm-persistent) but the
    answer changed. The fake serves other words once restarted, as a store holding wrong KV would."""

    def restart_with_wrong_kv() -> None:
        RecordedRun.restart(recorded)
        recorded.server.token_word = lambda body: "garbled"

    recorded.restart = restart_with_wrong_kv
    validation = run(recorded)
    persistent = validation.tier(Tier.WARM_PERSISTENT)
    assert persistent.labels[0].tier == Tier.WARM_PERSISTENT and persistent.labels[0].passed  # counters: fine
    result = persistent.result()
    assert not result.passed and result.label == "served-but-wrong" and result.counters_label == "warm-persistent"
    (check,) = result.greedy
    assert check.cold_text.startswith(" w0 w1") and check.text.startswith(" garbled0") and check.first_difference == 1
    assert [t.result().passed for t in validation.tiers[:3]] == [True, True, True]
    assert [len(t.result().greedy) for t in validation.tiers] == [0, 1, 1, 1]  # cold is the reference
    card = to_card("rig1", "run", validation, ValidationSettings.from_data({}))
    md = render_rig_markdown(card)
    assert not card.passed and "**Verdict: FAIL**" in md
    assert (
        "tier warm-persistent: served-but-wrong: its counters prove warm-persistent, but the logprobs of "
        "1 of 1 sessions moved from the warm-gpu run's further than this path's tolerance"
    ) in md
    assert "warm-gpu 1/1 same, warm-connector 1/1 same, warm-persistent 0/1 same" in md
    assert (
        "- ✗ served-but-wrong: warm-persistent, session " in md
        and "against warm-gpu: parts at character 1, "
        "token 0; logprobs moved 12.0000 nats over 1 positions > tolerance 0.0000: warm-gpu ' w0 w1 w2"
    ) in md
    assert "warm-persistent ' garbled0 garbled1" in md


def test_every_tier_request_asks_for_its_top_logprobs_as_token_ids(recorded):
    run(recorded)
    session = [body for body in recorded.server.completions if body["prompt"] == recorded.session_prompt]
    assert {(body["logprobs"], body["return_tokens_as_token_ids"]) for body in session} == {(5, True)}
    client = ServingClient(recorded.server.url, model="tiny")
    settings = ValidationSettings.from_data({"validate_sessions": 1, "validate_seed": 1, "validate_top_logprobs": 0})
    recorded.server.completions.clear()
    RecordedRun.__init__(recorded, recorded.server)
    validate_tiers(client, recorded.restart, settings)
    assert not any("logprobs" in body for body in recorded.server.completions)


def parting_at(recorded: RecordedRun, step: str, index: int, margin: float) -> None:
    """From the completion that moves the counters to `step` on, token `index` onwards is the runner-up's word; the
    runner-up is `margin` nats behind the chosen token at `index` in every run (so in the reference's too)."""
    recorded.server.word_at = lambda body, i: "r" if recorded.step == step and i >= index else "w"
    recorded.server.margin_at = lambda body, i: margin if i == index else 6.0


def margins_by_step(recorded: RecordedRun, margins: dict[str, float]) -> None:
    """The runner-up's distance behind the chosen token at every position, by the step the counters are at when the
    request is answered (cold answers at 01-after-cold, warm-gpu and its repeat at 02, the connector at 04): a warm
    run's logprobs move by the difference, its tokens do not change."""
    recorded.server.margin_at = lambda body, i: margins.get(recorded.step, 6.0)


def test_a_connector_tier_whose_logprobs_moved_within_the_runs_own_band_passes(recorded):
    """Cached KV rounds differently from a fresh prefill: warm-gpu moved 0.05 nats from cold (the band), the connector
    0.1 from cold, 0.05 from warm-gpu: within BAND_FACTOR x the band. The card gives the bands and tolerances."""
    margins_by_step(recorded, {"02-after-warm-gpu": 6.05, "04-after-warm-connector": 6.1})
    validation = run(recorded)
    connector = validation.tier(Tier.WARM_CONNECTOR).result()
    (check,) = connector.greedy
    assert check.verdict == "same" and check.reference == "warm-gpu" and check.shift_nats == pytest.approx(0.05)
    assert check.tolerance_nats == pytest.approx(0.15) and not check.tolerance_exact
    assert validation.numerics.cached_vs_fresh_nats == pytest.approx(0.05) and validation.numerics.repeat_nats == 0
    card = to_card("rig1", "run", validation, ValidationSettings.from_data({}))
    assert card.passed, card.failures
    md = render_rig_markdown(card)
    assert (
        "the GPU prefix cache asked twice moved logprobs by 0.0000 nats, against the fresh prefill by 0.0500 nats" in md
    )
    assert "warm-connector 0.1500 nats" in md


def test_a_connector_tier_whose_logprobs_moved_past_its_tolerance_is_served_but_wrong_with_the_same_tokens(recorded):
    """The damage a model unsure of the prompts hides: no token changed, the distribution did."""
    margins_by_step(recorded, {"02-after-warm-gpu": 6.05, "04-after-warm-connector": 6.5})
    validation = run(recorded)
    connector = validation.tier(Tier.WARM_CONNECTOR).result()
    (check,) = connector.greedy
    assert check.same and check.verdict == "served-but-wrong" and check.shift_nats == pytest.approx(0.45)
    assert not connector.passed and connector.label == "served-but-wrong"
    md = render_rig_markdown(to_card("rig1", "run", validation, ValidationSettings.from_data({})))
    assert "the same tokens; logprobs moved 0.4500 nats over 16 positions > tolerance 0.1500" in md


def test_a_bit_exact_tier_is_held_to_the_repeat_band(recorded):
    """A path declared bit-exact (the native tiers) may not move at all where the GPU prefix cache repeats itself;
    the same move passes a path that is not."""
    margins_by_step(recorded, {"02-after-warm-gpu": 6.05, "04-after-warm-connector": 6.1})
    client = ServingClient(recorded.server.url, model="tiny")
    settings = ValidationSettings.from_data({"validate_sessions": 1, "validate_seed": 1234})
    validation = validate_tiers(client, recorded.restart, settings, bit_exact_tiers=["warm-connector"])
    (check,) = validation.tier(Tier.WARM_CONNECTOR).result().greedy
    assert check.verdict == "served-but-wrong" and check.tolerance_exact and check.tolerance_nats == 0.0
    assert validation.tier(Tier.WARM_PERSISTENT).result().passed  # not declared exact: within 0.15


def test_other_tokens_where_the_run_measured_no_band_are_served_but_wrong(recorded):
    """The lab's CPU engine: warm-gpu repeated cold bit for bit, so no numerics explains a near-tie flip."""
    parting_at(recorded, "04-after-warm-connector", 3, 0.05)
    validation = run(recorded)
    connector = validation.tier(Tier.WARM_CONNECTOR).result()
    assert connector.greedy[0].verdict == "served-but-wrong" and connector.greedy[0].margin_nats == pytest.approx(0.05)
    assert [t.result().passed for t in validation.tiers] == [True, True, False, True]


def test_without_logprobs_a_near_tie_cannot_be_told_and_fails(recorded):
    parting_at(recorded, "04-after-warm-connector", 3, 0.05)
    client = ServingClient(recorded.server.url, model="tiny")
    settings = ValidationSettings.from_data({"validate_sessions": 1, "validate_seed": 1, "validate_top_logprobs": 0})
    connector = validate_tiers(client, recorded.restart, settings).tier(Tier.WARM_CONNECTOR).result()
    assert connector.greedy[0].verdict == "served-but-wrong" and connector.greedy[0].margin_nats is None
    assert not connector.passed


def test_an_engine_that_dies_on_logprobs_is_refused_before_anything_is_measured(recorded):
    """The lab's first run with logprobs: vLLM CPU compiled the sampler's logprobs path, failed (no Python.h) and
    the engine died. validate_tiers asks once, before the calibration, and says which setting and what fix."""

    def die_on_logprobs(body: dict) -> None:
        if body.get("logprobs"):
            recorded.server.drop_stream_after = 0

    recorded.server.on_completion = die_on_logprobs
    with pytest.raises(ConfigError) as refused:
        run(recorded)
    assert refused.value.field == "validate_top_logprobs" and "Python" in refused.value.fix
    assert len(recorded.server.completions) == 1  # nothing measured after it


@pytest.mark.parametrize(
    "name, value",
    [
        ("validate_top_logprobs", -1),
        ("validate_top_logprobs", 21),
        ("validate_numerics_ceiling_nats", 0),
        ("validate_numerics_ceiling_nats", -0.5),
    ],
)
def test_bad_oracle_settings_refused_naming_the_field(name, value):
    with pytest.raises(ConfigError) as refused:
        ValidationSettings.from_data({name: value})
    assert refused.value.field == name


@pytest.mark.parametrize("warm_text", [" w0 w1", " w0 w1 w2 w3", ""], ids=["shorter", "longer", "empty"])
def test_a_warm_reply_of_another_length_is_not_the_same_greedy_output(warm_text):
    # issue 29: a truncated, longer or empty warm reply is served-but-wrong, never "same output"
    assert not compare_greedy("0123456789abcdef", " w0 w1 w2", warm_text).same
    assert compare_greedy("0123456789abcdef", " w0 w1 w2", " w0 w1 w2").same


def test_the_card_names_where_the_client_ttft_was_measured(recorded):
    validation = run(recorded)
    card = to_card("rig1", "run", validation, ValidationSettings.from_data({}))
    assert card.ttft_client.transport == f"the controller, through {recorded.server.url}"
    assert (card.ttft_client.tolerance_rel, card.ttft_client.tolerance_abs_s) == (0.05, 0.005)
    assert all(len(t.ttft_pairs) == 1 for t in card.tiers)
    assert (
        f"Client TTFT measured on the controller, through {recorded.server.url}; within max(5 %, 5 ms)"
        in render_rig_markdown(card)
    )


@pytest.mark.parametrize(
    "data, field",
    [
        ({"validate_prompt_tokens": 4090, "validate_output_tokens": 16}, "validate_prompt_tokens"),
        (
            {"validate_decode_ab": True, "validate_decode_prompt_tokens": 3000, "validate_decode_tokens": 1500},
            "validate_decode_tokens",
        ),
    ],
)
def test_prompts_that_cannot_fit_the_declared_context_are_refused_before_any_rig(data, field):
    # validate.py calls this with the max_model_len knob before any rig is asked (the server's is checked again)
    with pytest.raises(ConfigError) as caught:
        check_prompt_fits(ValidationSettings.from_data(data), 4096)
    assert caught.value.field == field and "4096" in caught.value.problem and "<=" in caught.value.fix
    check_prompt_fits(ValidationSettings.from_data(data), 8192)


def test_capacity_from_measured_growth_and_sessions_per_tier():
    # the user's card: 36,721 tokens -> 4.6 GB on disk; an L1 of 30 GB and an L2 of 1 TB
    capacity = capacity_from(
        4_600_000_000, 36_721, "L2 dir growth", {"L1 30 GB": 30 * 10**9, "L2 1 TB": 10**12}, [50_000, 262_144]
    )
    assert capacity.kb_per_token == pytest.approx(125.3, abs=0.1)
    l1, l2 = capacity.tiers
    assert l1.sessions["50000"] == pytest.approx(30e9 / (4.6e9 / 36_721 * 50_000))
    assert 4 < l1.sessions["50000"] < 5 and 150 < l2.sessions["50000"] < 165
    empty = capacity_from(0, 36_721, "L2 dir growth", {}, [50_000])
    assert empty.kb_per_token is None and "no growth" in empty.source


# --- capacity by each cache's eviction rule (issue 42) ---------------------------------------------------------------

L1_BYTES = 10 * 2**30


def test_a_session_that_exactly_fills_lmcaches_watermark_is_held_and_one_byte_more_is_not():
    watermark_bytes = LMCACHE_L1.held_bytes(L1_BYTES)  # 80 % of the L1
    assert watermark_bytes == int(0.8 * L1_BYTES)
    exact = capacity_from(watermark_bytes, 1, "growth", {"L1": L1_BYTES}, [1], {"L1": LMCACHE_L1})
    one_more = capacity_from(watermark_bytes + 1, 1, "growth", {"L1": L1_BYTES}, [1], {"L1": LMCACHE_L1})
    assert exact.tiers[0].sessions["1"] == 1 and one_more.tiers[0].sessions["1"] == 0
    # half the watermark exactly: two sessions; a byte more each: one
    half = capacity_from(watermark_bytes // 2, 1, "growth", {"L1": L1_BYTES}, [1], {"L1": LMCACHE_L1})
    half_more = capacity_from(watermark_bytes // 2 + 1, 1, "growth", {"L1": L1_BYTES}, [1], {"L1": LMCACHE_L1})
    assert (half.tiers[0].sessions["1"], half_more.tiers[0].sessions["1"]) == (2, 1)
    assert exact.tiers[0].rule == LMCACHE_L1.text


def test_issue_42s_32k_session_at_the_default_l1_and_vllms_lru_counting_the_whole_tier():
    session = 32_000 * 147_456  # a 32K session of the 8B shape: 4.7 GB
    lmcache = capacity_from(session, 32_000, "growth", {"L1": 30 * 2**30}, [32_000], {"L1": LMCACHE_L1})
    native = capacity_from(session, 32_000, "growth", {"L1": 30 * 2**30}, [32_000], {"L1": VLLM_LRU})
    whole = capacity_from(session, 32_000, "growth", {"L1": 30 * 2**30}, [32_000])
    assert lmcache.tiers[0].sessions["32000"] == 5  # 25.8 GB under the watermark: 5 whole sessions
    assert native.tiers[0].sessions["32000"] == 6  # the whole 32.2 GB: 6 whole sessions
    assert whole.tiers[0].sessions["32000"] == pytest.approx(30 * 2**30 / session)  # 6.8: as before, no rule
    assert whole.tiers[0].rule is None


def test_the_card_says_each_capacity_tiers_rule(recorded):
    client = ServingClient(recorded.server.url, model="tiny")
    settings = ValidationSettings.from_data({"validate_sessions": 1, "validate_seed": 1234})
    grown = iter([0, 500_000_000])
    validation = validate_tiers(
        client,
        recorded.restart,
        settings,
        store_bytes=lambda: next(grown),
        capacity_tiers={"L1 RAM 30 GiB": 30 * 2**30, "L2 disk 1000 GB": 10**12},
        capacity_rules={"L1 RAM 30 GiB": LMCACHE_L1},
    )
    l1, l2 = validation.capacity.tiers
    assert l1.rule == LMCACHE_L1.text and l2.rule is None
    assert all(float(n).is_integer() for n in l1.sessions.values())
    md = render_rig_markdown(to_card("rig1", "run", validation, settings))
    section = md[md.index("## ③ Capacity") : md.index("## ④")]
    assert f"L1 RAM 30 GiB: {LMCACHE_L1.text}; whole sessions held before an eviction fires." in section
    assert "L2 disk 1000 GB: counted on the whole tier." in section
