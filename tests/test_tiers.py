"""Tier labels from metric deltas: recorded real windows (tests/fixtures/metrics) and edge cases."""

from pathlib import Path

import pytest

FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"
from rigkit.metrics import Delta, delta, parse
from rigkit.tiers import Tier, label

METRICS = FIXTURES_DIR / "metrics"


def window(before: str, after: str) -> Delta:
    return delta(parse((METRICS / f"{before}.txt").read_text()), parse((METRICS / f"{after}.txt").read_text()))


@pytest.mark.parametrize("before,after,expected,after_restart", [
    ("00-idle", "01-after-cold", Tier.COLD, False),
    ("01-after-cold", "02-after-warm-gpu", Tier.WARM_GPU, False),
    ("03-after-fillers", "04-after-warm-connector", Tier.WARM_CONNECTOR, False),
    ("05-restarted-idle", "06-after-warm-persistent", Tier.WARM_PERSISTENT, True),
])
def test_recorded_windows_get_the_tier_that_served_them(before, after, expected, after_restart):
    verdict = label(window(before, after), expected, connector_configured=True, after_restart=after_restart)
    assert verdict.tier == expected and verdict.passed, verdict.proof


def test_immediate_repeat_is_not_a_connector_hit():
    """The lesson of the user's thread: a naive warm test measures the GPU cache."""
    verdict = label(window("01-after-cold", "02-after-warm-gpu"), Tier.WARM_CONNECTOR, connector_configured=True)
    assert verdict.tier == Tier.WARM_GPU and not verdict.passed


def test_connector_expected_but_no_external_hit_is_retrieved_but_unused():
    # a window in which the connector served nothing (the cold one), judged as a connector tier
    cold = window("00-idle", "01-after-cold")
    verdict = label(cold, Tier.WARM_PERSISTENT, connector_configured=True, after_restart=True)
    assert verdict.tier == Tier.RETRIEVED_BUT_UNUSED and not verdict.passed
    assert "external hits +0" in verdict.proof


def test_without_a_connector_a_miss_is_just_cold():
    cold = window("00-idle", "01-after-cold")
    assert label(cold, Tier.WARM_CONNECTOR, connector_configured=False).tier == Tier.COLD


def test_a_cold_request_that_hit_a_cache_fails_cold():
    """An unsalted or reused prompt: the cold figure would be a lie."""
    verdict = label(window("01-after-cold", "02-after-warm-gpu"), Tier.COLD, connector_configured=True)
    assert verdict.tier == Tier.WARM_GPU and not verdict.passed


def test_both_caches_serving_part_is_mixed_and_fails():
    partial = Delta(prefix_cache_hits=1024, prefix_cache_queries=3500, external_prefix_cache_hits=2048,
                    external_prefix_cache_queries=2476)
    verdict = label(partial, Tier.WARM_CONNECTOR, connector_configured=True)
    assert verdict.tier == Tier.MIXED and not verdict.passed


def test_the_proof_carries_the_numbers():
    verdict = label(window("03-after-fillers", "04-after-warm-connector"), Tier.WARM_CONNECTOR, True)
    assert f"external hits +{verdict.external_hits:.0f}/" in verdict.proof
    assert verdict.external_kv_transfer_tokens == verdict.external_hits > 0


def test_fillers_push_more_than_the_pool_through_it():
    from rigkit.validation import FILLER_OVERSHOOT, filler_plan

    # the lab pool: 72 blocks x 128 tokens, 3,500-token sessions, 8,192 max-model-len
    size, count = filler_plan(72 * 128, 8192, 3500, 16)
    assert size == 3500 and size * count >= 72 * 128 * FILLER_OVERSHOOT
    # a 279K-token GPU pool with 37K sessions
    size, count = filler_plan(279_000, 262_144, 37_000, 16)
    assert size == 37_000 and count == 10
    # fillers never exceed what one request may hold
    size, _ = filler_plan(9216, 4096, 37_000, 16)
    assert size + 16 <= 4096


# LMCache's MP server needs CUDA, so it cannot run here: these lines are CONSTRUCTED in the format
# of its /metrics (names from its HTTP port, as lab.md lists them), appended to real vLLM texts.
def _lmcache_text(requested: float, hits: float) -> str:
    return ("# TYPE lmcache_mp_lookup_requested_tokens_total counter\n"
            f"lmcache_mp_lookup_requested_tokens_total {requested}\n"
            "# TYPE lmcache_mp_lookup_hit_tokens_total counter\n"
            f"lmcache_mp_lookup_hit_tokens_total {hits}\n"
            "# TYPE lmcache_mp_l1_memory_usage_bytes gauge\n"
            f"lmcache_mp_l1_memory_usage_bytes {hits * 131_000}\n")


def test_connector_retrieved_but_vllm_used_none_is_the_users_case():
    """The user's rig: LMCache retrieved the KV, vLLM took 0 external hits, TTFT no better."""
    vllm_before = (METRICS / "03-after-fillers.txt").read_text()
    vllm_after_cold_like = (METRICS / "03-after-fillers.txt").read_text().replace(
        'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 21088.0',
        'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 24604.0')
    before = parse(vllm_before + _lmcache_text(0, 0))
    after = parse(vllm_after_cold_like + _lmcache_text(3516, 3456))
    verdict = label(delta(before, after), Tier.WARM_CONNECTOR, connector_configured=True)
    assert verdict.tier == Tier.RETRIEVED_BUT_UNUSED and not verdict.passed
    assert verdict.connector_retrieved_tokens == 3456
    assert "retrieved by the connector, used 0% by vLLM" in verdict.proof


def test_lmcache_samples_ride_along_without_disturbing_vllm_counters():
    text = (METRICS / "04-after-warm-connector.txt").read_text()
    both = parse(text + _lmcache_text(3516, 3456))
    alone = parse(text)
    assert both.lmcache["lmcache_mp_lookup_hit_tokens_total"] == 3456
    assert both.external_prefix_cache_hits == alone.external_prefix_cache_hits
    assert alone.lmcache == {}
