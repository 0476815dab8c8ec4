"""Tier labels from metric deltas: recorded real windows (tests/fixtures/metrics) and edge cases."""

from pathlib import Path

import pytest

FIXTURES_DIR = Path(__file__).resolve().parents[1] / "fixtures"
from dataclasses import replace

from rigkit.metrics import (
    LMCACHE_CHUNKS_LOADED,
    LMCACHE_L2_PREFETCH_LOADED,
    LMCACHE_LOOKUP_HITS,
    LMCACHE_LOOKUP_HITS_L1,
    LMCACHE_LOOKUP_HITS_L2,
    LMCACHE_LOOKUP_REQUESTED,
    Delta,
    delta,
    parse,
)
from rigkit.validation.tiers import BY_COUNTERS, INFERRED, Tier, TierLabel, label, label_shared

METRICS = FIXTURES_DIR / "metrics"


def window(before: str, after: str) -> Delta:
    return delta(parse((METRICS / f"{before}.txt").read_text()), parse((METRICS / f"{after}.txt").read_text()))


@pytest.mark.parametrize(
    "before,after,expected,after_restart",
    [
        ("00-idle", "01-after-cold", Tier.COLD, False),
        ("01-after-cold", "02-after-warm-gpu", Tier.WARM_GPU, False),
        ("03-after-fillers", "04-after-warm-connector", Tier.WARM_CONNECTOR, False),
        ("05-restarted-idle", "06-after-warm-persistent", Tier.WARM_PERSISTENT, True),
    ],
)
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
    partial = Delta(
        prefix_cache_hits=1024,
        prefix_cache_queries=3500,
        external_prefix_cache_hits=2048,
        external_prefix_cache_queries=2476,
    )
    verdict = label(partial, Tier.WARM_CONNECTOR, connector_configured=True)
    assert verdict.tier == Tier.MIXED and not verdict.passed


def test_the_proof_carries_the_numbers():
    verdict = label(window("03-after-fillers", "04-after-warm-connector"), Tier.WARM_CONNECTOR, True)
    assert f"external hits +{verdict.external_hits:.0f}/" in verdict.proof
    assert verdict.external_kv_transfer_tokens == verdict.external_hits > 0


def test_fillers_push_more_than_the_pool_through_it():
    from rigkit.validation.procedure import FILLER_OVERSHOOT, filler_plan

    # the lab pool: 72 blocks x 128 tokens, 3,500-token sessions, 8,192 max-model-len
    size, count = filler_plan(72 * 128, 8192, 3500, 16)
    assert size == 3500 and size * count >= 72 * 128 * FILLER_OVERSHOOT
    # a 279K-token GPU pool with 37K sessions
    size, count = filler_plan(279_000, 262_144, 37_000, 16)
    assert size == 37_000 and count == 10
    # fillers never exceed what one request may hold
    size, _ = filler_plan(9216, 4096, 37_000, 16)
    assert size + 16 <= 4096


# LMCache 0.5.3 MP on an H200 (tests/fixtures/gpu-h200-vllm0.26/lmcache-mp-eager, its README): each file is
# vLLM's /metrics followed by LMCache's (HTTP port 8080). 0.5.3 labels its lookup counters cache_salt="" and
# model_name, and exports no per-tier (hit_l1 / hit_l2) counters.
GPU_CAPTURES = FIXTURES_DIR / "gpu-h200-vllm0.26"
LMCACHE_053 = GPU_CAPTURES / "lmcache-mp-eager"


def lmcache_window(before: str, after: str) -> Delta:
    return delta(parse((LMCACHE_053 / f"{before}.txt").read_text()), parse((LMCACHE_053 / f"{after}.txt").read_text()))


def test_lmcache_counters_are_found_through_their_labels():
    snapshot = parse((LMCACHE_053 / "04-after-warm-connector.txt").read_text())
    assert (
        'lmcache_mp_lookup_hit_tokens_total{cache_salt="",model_name="/models/tiny-qwen3"} 5632.0'
        in (LMCACHE_053 / "04-after-warm-connector.txt").read_text()
    )
    assert snapshot.lmcache_counter(LMCACHE_LOOKUP_HITS) == 5632
    assert snapshot.lmcache_counter(LMCACHE_LOOKUP_REQUESTED) == 22528
    # 0.5.3 has no per-tier counters: None, not 0 (the card then says the tier was inferred)
    assert snapshot.lmcache_counter(LMCACHE_LOOKUP_HITS_L1) is None
    assert snapshot.lmcache_counter(LMCACHE_LOOKUP_HITS_L2) is None


def test_lmcache_0_5_3_warm_connector_hit_is_l1_by_its_chunk_counters():
    """0.5.3 has no per-tier hit counters, but counts the chunks it loaded into vLLM (+11 here) and none came up
    from L2 (this capture has no L2 adapter: no prefetch series at all)."""
    verdict = label(lmcache_window("03-after-fillers", "04-after-warm-connector"), Tier.WARM_CONNECTOR, True)
    assert verdict.tier == Tier.WARM_CONNECTOR and verdict.passed
    assert verdict.external_hits == 2816 and verdict.connector_retrieved_tokens == 2816
    assert (verdict.store_tier, verdict.store_tier_source) == ("L1", BY_COUNTERS)
    assert "LMCache lookup hits +2816" in verdict.proof
    assert "LMCache chunks loaded +11, of them from L2 (prefetch loads) +0: served from L1" in verdict.proof


def test_lmcache_without_any_tier_counter_is_inferred_from_the_procedure():
    """MADE UP from the real window: the chunk counter removed, as an LMCache that exports only its lookups."""
    real = lmcache_window("03-after-fillers", "04-after-warm-connector")
    made_up = replace(real, lmcache={k: v for k, v in real.lmcache.items() if "num_chunks_loaded" not in k})
    verdict = label(made_up, Tier.WARM_PERSISTENT, True, after_restart=True)
    assert (verdict.store_tier, verdict.store_tier_source) == ("L2", INFERRED)
    assert "L2 inferred from the procedure" in verdict.proof


def test_lmcache_retrieves_during_a_gpu_hit_and_vllm_uses_none_of_it():
    # the H200 capture: during the warm-gpu request LMCache looked up and read 11 chunks vLLM did not use
    verdict = label(lmcache_window("01-after-cold", "02-after-warm-gpu"), Tier.WARM_GPU, True)
    assert verdict.tier == Tier.WARM_GPU and verdict.passed
    assert verdict.connector_retrieved_tokens == 2816 and verdict.external_hits == 0
    assert "retrieved by the connector, used 0% by vLLM" in verdict.proof and verdict.store_tier is None


def test_connector_retrieved_but_vllm_used_none_is_the_users_case():
    """The user's rig: LMCache retrieved the KV, vLLM took 0 external hits, TTFT no better. MADE UP from the
    real warm-connector window: vLLM's external hits and external_kv_transfer tokens set to 0."""
    real = lmcache_window("03-after-fillers", "04-after-warm-connector")
    made_up = replace(
        real,
        external_prefix_cache_hits=0.0,
        prompt_tokens_by_source={**real.prompt_tokens_by_source, "external_kv_transfer": 0.0},
    )
    verdict = label(made_up, Tier.WARM_CONNECTOR, connector_configured=True)
    assert verdict.tier == Tier.RETRIEVED_BUT_UNUSED and not verdict.passed
    assert verdict.connector_retrieved_tokens == 2816
    assert "retrieved by the connector, used 0% by vLLM" in verdict.proof


def _made_up_per_tier_lines(l1: int, l2: int, prefetched: int) -> str:
    """MADE UP in the shape of a newer LMCache's per-tier counters (0.5.3, captured, has none)."""
    return (
        "# TYPE lmcache_mp_lookup_hit_l1_tokens_total counter\n"
        f'lmcache_mp_lookup_hit_l1_tokens_total{{cache_salt="",model_name="/models/tiny-qwen3"}} {l1}\n'
        "# TYPE lmcache_mp_lookup_hit_l2_tokens_total counter\n"
        f'lmcache_mp_lookup_hit_l2_tokens_total{{cache_salt="",model_name="/models/tiny-qwen3"}} {l2}\n'
        "# TYPE lmcache_mp_l2_prefetch_load_completed_chunks_total counter\n"
        f'lmcache_mp_l2_prefetch_load_completed_chunks_total{{l2_name="fs"}} {prefetched}\n'
    )


@pytest.mark.parametrize(
    "l1,l2,after_restart,tier", [(2816, 0, False, "L1"), (0, 2816, False, "L2"), (256, 2560, True, "L1+L2")]
)
def test_lmcache_per_tier_counters_tell_l1_from_l2_where_exported(l1, l2, after_restart, tier):
    before = parse((LMCACHE_053 / "03-after-fillers.txt").read_text() + _made_up_per_tier_lines(0, 0, 0))
    after = parse(
        (LMCACHE_053 / "04-after-warm-connector.txt").read_text() + _made_up_per_tier_lines(l1, l2, l2 // 256)
    )
    verdict = label(
        delta(before, after),
        Tier.WARM_PERSISTENT if after_restart else Tier.WARM_CONNECTOR,
        True,
        after_restart=after_restart,
    )
    assert (verdict.store_tier, verdict.store_tier_source) == (tier, BY_COUNTERS)
    assert f"LMCache L1 hits +{l1}, L2 hits +{l2}, L2 prefetch loads +{l2 // 256} chunks" in verdict.proof


def test_lmcache_samples_ride_along_without_disturbing_vllm_counters():
    both = parse((LMCACHE_053 / "04-after-warm-connector.txt").read_text())
    vllm_only = (LMCACHE_053 / "04-after-warm-connector.txt").read_text().split("# HELP lmcache_mp_")[0]
    alone = parse(vllm_only)
    assert both.lmcache_counter(LMCACHE_LOOKUP_HITS) == 5632
    assert both.external_prefix_cache_hits == alone.external_prefix_cache_hits
    assert alone.lmcache == {}


# --- vLLM's own counters cross-checked (vLLM 0.26 + OffloadingConnector, native tiered, on the H200) ------
NATIVE_TIERED = GPU_CAPTURES / "native-tiered-eager"


def tiered_window(before: str, after: str) -> Delta:
    return delta(
        parse((NATIVE_TIERED / f"{before}.txt").read_text()), parse((NATIVE_TIERED / f"{after}.txt").read_text())
    )


def test_no_hit_ratio_across_a_window_whose_queries_were_re_counted():
    # after the restart vLLM counted 48,480 prefix-cache queries for one 3,030-token prompt while the blocks
    # came back from the disk tier: the tier is proven by the external hits, "+0/48480 queried" would mislead
    window = tiered_window("06-seed-fixed-restarted-idle", "07-seed-fixed-after-warm-persistent")
    verdict = label(window, Tier.WARM_PERSISTENT, True, after_restart=True)
    assert verdict.tier == Tier.WARM_PERSISTENT and verdict.passed and verdict.external_hits == 3024
    assert "/48480" not in verdict.proof
    assert "GPU prefix hits +0 (queries re-counted: 48480 for 3030 prompt tokens, no hit ratio)" in verdict.proof
    assert "external hits +3024/3030 queried" in verdict.proof


def test_vllm_0_26_exports_no_cached_by_source_and_the_proof_does_without_it():
    window = tiered_window("03-after-fillers", "04-after-warm-connector")
    assert window.prompt_tokens_cached_by_source == {} and window.tokens_from("external_kv_transfer") == 3024
    verdict = label(window, Tier.WARM_CONNECTOR, True)
    assert verdict.passed and "cached by source" not in verdict.proof


def test_vllm_0_32_cached_by_source_names_the_store_that_served():
    verdict = label(window("03-after-fillers", "04-after-warm-connector"), Tier.WARM_CONNECTOR, True)
    assert "cached by source external_unspecified +3456" in verdict.proof


def test_over_counted_gpu_hits_are_checked_against_the_tokens_served():
    """vllm#43736: hits double-counted while a connector deferred the request. MADE UP from the real native-tiered
    warm-connector window: its GPU hit counter set to +3,024 where prompt_tokens_by_source says 0 came from it."""
    real = tiered_window("03-after-fillers", "04-after-warm-connector")
    made_up = replace(real, prefix_cache_hits=3024.0)
    verdict = label(made_up, Tier.WARM_CONNECTOR, True)
    assert verdict.tier == Tier.WARM_CONNECTOR and verdict.passed and verdict.gpu_hits == 0
    assert "hit counters over-count: GPU +3024, external +3024 for +0 and +3024 tokens served" in verdict.proof
    # where a vLLM exports no prompt_tokens_by_source, the counters are all there is
    bare = replace(made_up, prompt_tokens_by_source={})
    assert label(bare, Tier.WARM_CONNECTOR, True).tier == Tier.MIXED


def test_a_disk_tier_names_its_source_where_vllm_exports_cached_by_source():
    """MADE UP in the shape of vLLM 0.32's prompt_tokens_cached_by_source (0.26, captured, has none): the real
    native-tiered restart window with source="disk" lines added, as a newer vLLM would count the disk tier."""

    def with_disk(name: str, disk: int) -> str:
        return (
            (NATIVE_TIERED / f"{name}.txt").read_text() + "# TYPE vllm:prompt_tokens_cached_by_source counter\n"
            f'vllm:prompt_tokens_cached_by_source_total{{engine="0",model_name="tiny",source="disk"}} {disk}\n'
            f'vllm:prompt_tokens_cached_by_source_total{{engine="0",model_name="tiny",source="host"}} 0\n'
        )

    window = delta(
        parse(with_disk("06-seed-fixed-restarted-idle", 0)),
        parse(with_disk("07-seed-fixed-after-warm-persistent", 3024)),
    )
    verdict = label(window, Tier.WARM_PERSISTENT, True, after_restart=True)
    assert verdict.passed and "cached by source disk +3024" in verdict.proof


# --- what the mutation check (bench/mutation.py) found no test holding ---------------------------------------


def test_the_proof_of_a_real_connector_window_word_for_word():
    # counters equal to the tokens served (the usual case): no over-count note, the transfer tokens as served
    verdict = label(tiered_window("03-after-fillers", "04-after-warm-connector"), Tier.WARM_CONNECTOR, True)
    assert verdict.proof == (
        "GPU prefix hits +0/3030 queried, external hits +3024/3030 queried, external_kv_transfer tokens +3024"
    )


def test_an_lmcache_tier_after_a_restart_is_l2_inferred_and_one_exported_counter_is_enough():
    # LMCache 0.5.3 exports its chunk counters: they, not the procedure, say which tier served (none from L2 here)
    counted = label(
        lmcache_window("03-after-fillers", "04-after-warm-connector"), Tier.WARM_PERSISTENT, True, after_restart=True
    )
    assert (counted.store_tier, counted.store_tier_source) == ("L1", BY_COUNTERS)
    assert "LMCache chunks loaded +11, of them from L2 (prefetch loads) +0: served from L1" in counted.proof
    only_l2 = "".join(line + "\n" for line in _made_up_per_tier_lines(0, 2816, 11).splitlines() if "_l1_" not in line)
    before = parse(
        (LMCACHE_053 / "03-after-fillers.txt").read_text() + only_l2.replace(" 2816", " 0").replace(" 11\n", " 0\n")
    )
    after = parse((LMCACHE_053 / "04-after-warm-connector.txt").read_text() + only_l2)
    verdict = label(delta(before, after), Tier.WARM_CONNECTOR, True)
    assert (verdict.store_tier, verdict.store_tier_source) == ("L2", BY_COUNTERS)
    assert "LMCache L1 hits +0, L2 hits +2816, L2 prefetch loads +11 chunks: served from L2" in verdict.proof


def made_up(**fields) -> Delta:
    """MADE UP: a window's counters set by hand (field names as vLLM's and LMCache's metrics are parsed)."""
    return Delta(**fields)


def test_every_field_of_a_label_and_the_counter_reset_note():
    measured = made_up(
        prefix_cache_hits=0.0,
        prefix_cache_queries=3030.0,
        external_prefix_cache_hits=3024.0,
        external_prefix_cache_queries=3030.0,
        prompt_tokens_by_source={"external_kv_transfer": 3024.0, "local_compute": 6.0},
        reset=True,
    )
    verdict = label(measured, Tier.WARM_CONNECTOR, connector_configured=True)
    assert verdict == TierLabel(
        tier=Tier.WARM_CONNECTOR,
        expected=Tier.WARM_CONNECTOR,
        passed=True,
        gpu_hits=0.0,
        gpu_queries=3030.0,
        external_hits=3024.0,
        external_queries=3030.0,
        external_kv_transfer_tokens=3024.0,
        proof="GPU prefix hits +0/3030 queried, external hits +3024/3030 queried, external_kv_transfer tokens +3024"
        " (counters reset: server restarted inside the window)",
    )
    assert label(replace(measured, reset=False), Tier.COLD, True).expected == Tier.COLD


def test_the_over_count_note_word_for_word():
    measured = made_up(
        prefix_cache_hits=3024.0,
        prefix_cache_queries=3030.0,
        external_prefix_cache_hits=3024.0,
        external_prefix_cache_queries=3030.0,
        prompt_tokens_by_source={"external_kv_transfer": 3024.0, "local_compute": 6.0},
    )
    assert label(measured, Tier.WARM_CONNECTOR, True).proof == (
        "GPU prefix hits +0/3030 queried, external hits +3024/3030 queried, external_kv_transfer tokens +3024"
        " (hit counters over-count: GPU +3024, external +3024 for +0 and +3024 tokens served "
        "(prompt_tokens_by_source), vllm#43736: labelled from the tokens served)"
    )
    # counters at or below the tokens served: no note, the counters as they are
    under = replace(measured, prefix_cache_hits=0.0, external_prefix_cache_hits=3000.0)
    verdict = label(under, Tier.WARM_CONNECTOR, True)
    assert (verdict.gpu_hits, verdict.external_hits) == (0.0, 3000.0) and "over-count" not in verdict.proof


def test_cached_by_source_sorted_and_lmcache_lookups_in_the_proof():
    measured = made_up(
        prefix_cache_queries=3030.0,
        external_prefix_cache_queries=3030.0,
        prompt_tokens_cached_by_source={"disk": 2048.0, "cpu": 976.0, "gpu": 0.0},
        lmcache={LMCACHE_LOOKUP_HITS + '{cache_salt=""}': 2816.0},
    )
    verdict = label(measured, Tier.WARM_CONNECTOR, True)
    assert verdict.tier == Tier.RETRIEVED_BUT_UNUSED and verdict.connector_retrieved_tokens == 2816.0
    assert verdict.proof == (
        "GPU prefix hits +0/3030 queried, external hits +0/3030 queried, external_kv_transfer tokens +0"
        ", cached by source cpu +976, disk +2048, LMCache lookup hits +2816 (retrieved by the connector, used 0% by"
        " vLLM)"
    )
    nothing_found = label(replace(measured, lmcache={LMCACHE_LOOKUP_HITS: 0.0}), Tier.WARM_CONNECTOR, True)
    assert nothing_found.proof.endswith(", LMCache lookup hits +0") and nothing_found.connector_retrieved_tokens == 0
    used = replace(measured, external_prefix_cache_hits=2816.0)
    assert label(used, Tier.WARM_CONNECTOR, True).proof.count("used 0% by vLLM") == 0


def test_a_shared_window_in_words_and_fields():
    own_pool = made_up(prefix_cache_hits=1024.0, prefix_cache_queries=3030.0, external_prefix_cache_queries=3030.0)
    verdict = label_shared(own_pool)
    assert (verdict.tier, verdict.expected, verdict.passed) == (Tier.NOT_SHARED, Tier.WARM_SHARED, False)
    assert (verdict.gpu_hits, verdict.gpu_queries) == (1024.0, 3030.0)
    assert verdict.proof == (
        "GPU prefix hits +1024/3030 queried, external hits +0/3030 queried, external_kv_transfer tokens +0"
        " (B's own GPU pool served 1024 tokens: B already had the prompt, no shared hit)"
    )
    shared = label_shared(replace(own_pool, prefix_cache_hits=0.0, external_prefix_cache_hits=3024.0))
    assert (shared.tier, shared.passed, shared.external_hits) == (Tier.WARM_SHARED, True, 3024.0)
    assert "B's own" not in shared.proof
    nothing = replace(own_pool, prefix_cache_hits=0.0)
    assert label_shared(nothing).tier == Tier.RETRIEVED_BUT_UNUSED
    assert label_shared(nothing, shared_configured=False).tier == Tier.COLD
    assert label_shared(replace(nothing, reset=True)).proof.endswith(
        " (counters reset: server restarted inside the window)"
    )


# LMCache 0.5.3's chunk counters -> the store tier that served a connector hit (MADE UP windows: 11 chunks of 256
# tokens found, as in the H200 capture). Prefetch loads are the chunks its L2 prefetcher brought up.
CONNECTOR_HIT = made_up(
    prefix_cache_queries=3030.0,
    external_prefix_cache_hits=2816.0,
    external_prefix_cache_queries=3030.0,
    prompt_tokens_by_source={"external_kv_transfer": 2816.0, "local_compute": 214.0},
)
CONNECTOR_HIT_PROOF = (
    "GPU prefix hits +0/3030 queried, external hits +2816/3030 queried, external_kv_transfer tokens +2816"
    ", LMCache lookup hits +2816; "
)
NOTHING_LOADED = (
    "LMCache {} inferred from the procedure (this LMCache exports no "
    f"{LMCACHE_LOOKUP_HITS_L1} / {LMCACHE_LOOKUP_HITS_L2}, and loaded no chunk by {LMCACHE_CHUNKS_LOADED})"
)
CHUNKS = "LMCache chunks loaded +11, of them from L2 (prefetch loads) +{}: served from {}"


@pytest.mark.parametrize(
    "loaded,prefetched,after_restart,store_tier,source,proof",
    [
        (None, None, False, "L1", INFERRED, NOTHING_LOADED.format("L1")),
        (None, None, True, "L2", INFERRED, NOTHING_LOADED.format("L2")),
        (0, 0, False, "L1", INFERRED, NOTHING_LOADED.format("L1")),
        (0, 3, True, "L2", INFERRED, NOTHING_LOADED.format("L2")),
        (11, None, False, "L1", BY_COUNTERS, CHUNKS.format(0, "L1")),
        (11, 1, False, "L1+L2", BY_COUNTERS, CHUNKS.format(1, "L1+L2")),  # one chunk of 256 tokens from L2
        (11, 10, True, "L1+L2", BY_COUNTERS, CHUNKS.format(10, "L1+L2")),
        (11, 11, True, "L2", BY_COUNTERS, CHUNKS.format(11, "L2")),
        (11, 15, False, "L2", BY_COUNTERS, CHUNKS.format(11, "L2")),  # prefetched beyond this request's chunks
    ],
    ids=[
        "no-series",
        "no-series-restart",
        "none-loaded",
        "none-loaded-restart",
        "l1",
        "one-from-l2",
        "ten-from-l2",
        "all-from-l2",
        "more-prefetched",
    ],
)
def test_the_lmcache_tier_by_its_chunk_counters_or_the_procedure(
    loaded, prefetched, after_restart, store_tier, source, proof
):
    counters = {LMCACHE_LOOKUP_HITS + '{cache_salt=""}': 2816.0}
    if loaded is not None:
        counters[LMCACHE_CHUNKS_LOADED + '{cache_salt=""}'] = float(loaded)
    if prefetched is not None:
        counters[LMCACHE_L2_PREFETCH_LOADED + '{l2_name="fs"}'] = float(prefetched)
    expected = Tier.WARM_PERSISTENT if after_restart else Tier.WARM_CONNECTOR
    verdict = label(replace(CONNECTOR_HIT, lmcache=counters), expected, True, after_restart=after_restart)
    assert (verdict.tier, verdict.store_tier, verdict.store_tier_source) == (expected, store_tier, source)
    assert verdict.proof == CONNECTOR_HIT_PROOF + proof


def test_a_shared_window_carries_what_the_lmcache_server_retrieved():
    shared = replace(CONNECTOR_HIT, lmcache={LMCACHE_LOOKUP_HITS + '{cache_salt=""}': 2816.0})
    assert label_shared(shared).connector_retrieved_tokens == 2816.0
    assert label_shared(replace(shared, lmcache={})).connector_retrieved_tokens is None
