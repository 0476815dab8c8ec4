"""rigkit.validation.greedy: the served-but-wrong oracle on its own. The verdict reads the shift (the largest move of a
top-k logprob where both runs saw the same text) against a tolerance measured in the run, never one token's margin:
a model unsure of the prompts (every difference a near tie) must not excuse wrong KV (issue 39)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigkit.remote.client import TokenChoice
from rigkit.validation.card import GreedyCheck
from rigkit.validation.greedy import (
    BAND_FACTOR,
    INCONCLUSIVE,
    NUMERICS,
    SAME,
    SERVED_BUT_WRONG,
    Completion,
    Tolerance,
    band,
    calibrated,
    compare_greedy,
    judge,
    position_shift,
    shift,
)

BAND = Tolerance(0.1, False, "test band")
EXACT = Tolerance(0.0, True, "bit-exact")


def tokens(*choices: tuple[str, float, dict]) -> list[TokenChoice]:
    return [TokenChoice(token, logprob, top) for token, logprob, top in choices]


# cold chose a, b, c; at position 1 its runner-up x was 0.05 nats behind, y 3 nats behind
COLD = tokens(
    ("token_id:1", -0.1, {"token_id:1": -0.1, "token_id:9": -4.0}),
    ("token_id:2", -0.60, {"token_id:2": -0.60, "token_id:7": -0.65, "token_id:8": -3.60}),
    ("token_id:3", -0.2, {"token_id:3": -0.2, "token_id:9": -5.0}),
)


def moved(choices: list[TokenChoice], by: float, at: int | None = None) -> list[TokenChoice]:
    """Every top-k logprob moved by `by` (at one position only, when given)."""
    return [
        TokenChoice(t.token, t.logprob + by, {k: v + by for k, v in t.top.items()}) if at in (None, i) else t
        for i, t in enumerate(choices)
    ]


def swap_top_two(choice: TokenChoice, by: float) -> TokenChoice:
    """The runner-up chosen: the two leading logprobs exchanged and moved by `by`."""
    (first, lp1), (second, lp2) = sorted(choice.top.items(), key=lambda kv: -kv[1])[:2]
    top = {**choice.top, first: lp2 + by, second: lp1 + by}
    return TokenChoice(second, lp1 + by, top)


@pytest.mark.parametrize("warm", ["", " w0 w1", " w0 w1 w2 w3", " w0"], ids=["empty", "shorter", "longer", "cut"])
def test_without_logprobs_a_reply_of_another_length_is_never_the_same_output(warm):
    """Issue 29: compare_greedy(" w0 w1 w2", "") must not be same; nor a reply cut short or running on."""
    check = compare_greedy("session-id", " w0 w1 w2", warm)
    assert not check.same and check.verdict == SERVED_BUT_WRONG
    assert check.first_difference == min(len(warm), len(" w0 w1 w2"))


def test_an_empty_reply_is_served_but_wrong_whatever_its_logprobs():
    assert compare_greedy("s", " a b c", "", reference_tokens=COLD, tokens=COLD[:1], tolerance=BAND).verdict == (
        SERVED_BUT_WRONG
    )


def test_a_reply_without_logprobs_where_the_reference_has_them_is_served_but_wrong():
    """NaN logits from damaged KV end the logprobs at the first token (rigkit.remote.client.token_choices): the text
    may even look like the reference's; the missing logprobs are the evidence."""
    check = compare_greedy("s", " a b c", " a b c", reference_tokens=COLD, tokens=[], tolerance=BAND)
    assert check.verdict == SERVED_BUT_WRONG and check.shift_nats is None


def test_identical_tokens_within_the_tolerance_are_the_same_with_the_shift_measured():
    check = compare_greedy("s", " a b c", " a b c", reference_tokens=COLD, tokens=moved(COLD, -0.0625), tolerance=BAND)
    assert check.same and check.verdict == SAME and check.first_difference is None
    assert check.shift_nats == pytest.approx(0.0625) and check.positions_compared == 3
    assert check.logprob_drift == pytest.approx(0.0625) and check.tolerance_nats == 0.1


def test_identical_tokens_whose_logprobs_moved_past_the_tolerance_are_served_but_wrong():
    """Damage that changes no token (256 bytes of one layer per block on an H100: 0.043-0.072 nats) is caught where
    the path is bit-exact: the tokens agreeing is no evidence."""
    check = compare_greedy(
        "s", " a b c", " a b c", reference_tokens=COLD, tokens=moved(COLD, 0.05, at=2), tolerance=EXACT
    )
    assert check.same and check.verdict == SERVED_BUT_WRONG and check.shift_nats == pytest.approx(0.05)
    assert compare_greedy("s", " a b c", " a b c", reference_tokens=COLD, tokens=COLD, tolerance=EXACT).verdict == SAME


def test_the_shift_is_read_up_to_and_including_the_first_differing_token_only():
    """After the first difference the runs saw other text: moves there say nothing of the KV."""
    warm = COLD[:1] + [swap_top_two(COLD[1], 0.0)] + moved(COLD[2:], 9.0)
    moved_by, positions = shift(COLD, warm)
    assert positions == 2 and moved_by == pytest.approx(0.05)


def test_other_tokens_within_the_tolerance_are_numerics_and_past_it_served_but_wrong():
    """A model unsure of the prompt: the runner-up 0.05 nats behind. A near tie no longer excuses the move: a
    warm run whose distribution moved 0.3 nats there is served-but-wrong though its token was a near tie."""
    numerics = COLD[:1] + [swap_top_two(COLD[1], 0.02)] + tokens(("token_id:5", -0.3, {}))
    check = compare_greedy("s", " a b c", " a x e", reference_tokens=COLD, tokens=numerics, tolerance=BAND)
    assert not check.same and check.verdict == NUMERICS and check.first_difference_token == 1
    assert check.margin_nats == pytest.approx(0.05) and check.shift_nats <= 0.1
    wrong = COLD[:1] + [swap_top_two(COLD[1], 0.3)] + tokens(("token_id:5", -0.3, {}))
    check = compare_greedy("s", " a b c", " a x e", reference_tokens=COLD, tokens=wrong, tolerance=BAND)
    assert check.verdict == SERVED_BUT_WRONG and check.margin_nats == pytest.approx(0.05)


@pytest.mark.parametrize("tolerance, verdict", [(0.25, SAME), (0.2499999, SERVED_BUT_WRONG)])
def test_a_shift_at_the_tolerance_is_within_it(tolerance, verdict):
    assert (
        compare_greedy(
            "s", "a b c", "a b c", reference_tokens=COLD, tokens=moved(COLD, 0.25, at=0), tolerance=Tolerance(tolerance)
        ).verdict
        == verdict
    )


def test_a_token_outside_the_other_top_k_moves_at_least_to_its_k_th():
    a = TokenChoice("token_id:1", -0.1, {"token_id:1": -0.1, "token_id:2": -2.0})
    b = TokenChoice("token_id:1", -0.1, {"token_id:1": -0.1, "token_id:3": -3.0})
    # token 2 is at most -3.0 in b (below b's last): it moved >= 1.0; token 3 is at most -2.0 in a: >= 0 (no bound)
    assert position_shift(a, b) == pytest.approx(1.0)
    assert position_shift(TokenChoice("x", -1.0), TokenChoice("y", -1.0)) is None


def test_other_tokens_with_no_measured_band_are_inconclusive_never_a_pass():
    differs = COLD[:1] + [swap_top_two(COLD[1], 0.0)] + tokens(("token_id:5", -0.3, {}))
    unknown = Tolerance(None, False, "no band")
    assert compare_greedy(
        "s", " a b c", " a x e", reference_tokens=COLD, tokens=differs, tolerance=unknown
    ).verdict == (INCONCLUSIVE)
    same = compare_greedy("s", " a b c", " a b c", reference_tokens=COLD, tokens=COLD, tolerance=unknown)
    assert same.verdict == SAME
    drifted = compare_greedy(
        "s", " a b c", " a b c", reference_tokens=COLD, tokens=moved(COLD, 0.01), tolerance=unknown
    )
    assert drifted.verdict == INCONCLUSIVE


def test_without_logprobs_any_difference_is_served_but_wrong():
    assert compare_greedy("s", " a b c", " a x c", tolerance=BAND).verdict == SERVED_BUT_WRONG
    assert compare_greedy("s", " a b c", " a b c", tolerance=BAND).verdict == SAME


def test_the_tolerance_of_a_bit_exact_path_is_the_repeat_band_and_of_another_a_multiple_of_the_widest():
    assert calibrated(0.0, 0.0625, True, 0.5) == Tolerance(0.0, True, calibrated(0.0, 0.0625, True, 0.5).source)
    assert calibrated(None, 0.0625, True, 0.5).nats == 0.0
    assert calibrated(0.0, 0.0625, False, 0.5).nats == pytest.approx(BAND_FACTOR * 0.0625)
    assert calibrated(0.125, 0.0625, False, 0.5).nats == pytest.approx(BAND_FACTOR * 0.125)
    assert calibrated(0.0, None, False, 0.5).nats is None
    above = calibrated(0.0, 0.51, False, 0.5)
    assert above.nats is None and "above validate_numerics_ceiling_nats" in above.source
    assert calibrated(0.0, 0.5, False, 0.5).nats == pytest.approx(BAND_FACTOR * 0.5)


def test_a_band_is_the_widest_shift_over_its_pairs():
    pairs = [
        (Completion("a", COLD), Completion("a", moved(COLD, 0.03))),
        (Completion("a", COLD), Completion("a", COLD)),
    ]
    assert band(pairs) == pytest.approx(0.03)
    assert band([(Completion("a"), Completion("a"))]) is None


def test_a_bit_exact_tier_is_judged_against_the_same_path_alone():
    """Identical to cold is no alibi for a path that must repeat warm-gpu bit for bit."""
    gpu = Completion(" a b c", moved(COLD, 0.0625))
    check = judge("s", [("cold", Completion(" a b c", COLD)), ("warm-gpu", gpu)], Completion(" a b c", COLD), EXACT)
    assert check.reference == "warm-gpu" and check.verdict == SERVED_BUT_WRONG
    assert check.compared_with == ["cold", "warm-gpu"]
    assert judge("s", [("cold", Completion(" a b c", COLD)), ("warm-gpu", gpu)], gpu, EXACT).verdict == SAME


def test_another_tier_takes_the_reference_it_is_closest_to():
    gpu = Completion(" a b c", moved(COLD, 0.5))
    refs = [("cold", Completion(" a b c", COLD)), ("warm-gpu", gpu)]
    check = judge("s", refs, Completion(" a b c", moved(COLD, 0.45)), BAND)
    assert check.reference == "warm-gpu" and check.verdict == SAME
    assert judge("s", refs, Completion(" a b c", COLD), BAND).reference == "cold"


def test_a_card_written_before_the_oracle_reads_back_with_a_verdict():
    old = {"session": "abcd1234", "same": False, "cold_text": " w0", "text": " x0", "first_difference": 1}
    check = GreedyCheck.model_validate(old)
    assert check.verdict == SERVED_BUT_WRONG and check.reference_text == " w0" == check.cold_text
    assert check.reference == "cold"
    assert GreedyCheck.model_validate({**old, "same": True, "text": " w0"}).verdict == SAME


# --- real captures: the H200 runs (vLLM 0.26, the trained test model, top-5 logprobs by token id) -----------------

GPU_CHECKS = Path(__file__).parents[1] / "fixtures" / "gpu-h200-vllm0.26"


def recorded_completions(run: str, case: str) -> list[list[Completion]]:
    """Per session, every completion of more than one token in order (cold, warm-gpu, connector, persistent)."""
    import gzip

    sessions: dict[str, list[Completion]] = {}
    with gzip.open(GPU_CHECKS / run / case / "record.jsonl.gz", "rt") as f:
        for line in f:
            item = json.loads(line)
            if item["kind"] != "request" or item["max_tokens"] <= 1:
                continue
            result = item["result"]
            choices = [TokenChoice(t["token"], t["logprob"], t.get("top") or {}) for t in result.get("tokens", [])]
            sessions.setdefault(item["prompt_sha"], []).append(Completion(result["text"], choices))
    return [runs for runs in sessions.values() if len(runs) > 1]


@pytest.mark.parametrize("run", ["gpu-check-2026-12-03-off-block-edges", "gpu-check-2026-12-03-model-source"])
def test_on_the_h200_the_native_tiers_repeat_warm_gpu_bit_for_bit_and_the_damaged_store_moves_by_nats(run):
    """The premise of a bit-exact path: native-offload's CPU tier and native-tiered's CPU and fs tiers moved no
    logprob from warm-gpu (shift 0.000 in every session); the store damaged in every block moved them 1.5-4.4 nats."""
    for case in ("native-offload", "native-tiered"):
        for cold, gpu, *tiers in recorded_completions(run, case):
            assert [shift(gpu.tokens, tier.tokens)[0] for tier in tiers] == [0.0] * len(tiers)
    for cold, gpu, connector, damaged in recorded_completions(run, "native-tiered-corrupt"):
        assert shift(gpu.tokens, connector.tokens)[0] == 0.0 and shift(gpu.tokens, damaged.tokens)[0] > 1.0


@pytest.mark.parametrize("run", ["gpu-check-2026-12-03-off-block-edges", "gpu-check-2026-12-03-model-source"])
def test_on_the_h200_lmcache_moves_within_its_tolerance_from_the_band_of_the_same_run(run):
    """LMCache recomputes the tail past its last whole chunk: not bit-exact (up to 0.125 nats from warm-gpu, two bf16
    steps where the run's cached-vs-fresh band was one, 0.062): within BAND_FACTOR x the band, every session."""
    for case in ("lmcache-mp-l1", "lmcache-mp-l2"):
        sessions = recorded_completions(run, case)
        fresh = band((cold, gpu) for cold, gpu, *_ in sessions)
        tolerance = calibrated(0.0, fresh, False, 0.5)
        for cold, gpu, *tiers in sessions:
            for tier in tiers:
                check = judge("s", [("cold", cold), ("warm-gpu", gpu)], tier, tolerance)
                assert check.verdict in (SAME, NUMERICS), (case, check.shift_nats, tolerance)
