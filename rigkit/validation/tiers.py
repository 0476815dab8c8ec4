"""Label a measured request by the cache tier that served it, from metric deltas only.

vLLM's GPU prefix cache answers an immediate repeat before any KV connector is asked, so
TTFT alone cannot tell the tiers apart. The label comes from which counters moved during
the request: `vllm:prefix_cache_hits_total` (GPU pool) and
`vllm:external_prefix_cache_hits_total` (the KV connector: LMCache L1/L2, ExampleConnector
store). Timing is reported beside the label, never used to make it.

The warm-shared tier (label_shared) is judged on the rig that was ASKED: a salted prompt prefilled on rig A,
then sent to rig B, is proven shared only by B's own counters (B's GPU hits flat, B's external hits grown).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from rigkit.metrics import (
    LMCACHE_CHUNKS_LOADED,
    LMCACHE_L2_PREFETCH_LOADED,
    LMCACHE_LOOKUP_HITS,
    LMCACHE_LOOKUP_HITS_L1,
    LMCACHE_LOOKUP_HITS_L2,
    Delta,
)


class Tier(str, Enum):
    COLD = "cold"
    WARM_GPU = "warm-gpu"
    WARM_CONNECTOR = "warm-connector"
    WARM_PERSISTENT = "warm-persistent"
    # GPU pool and connector both served part of the prefix: the GPU eviction was incomplete
    MIXED = "mixed"
    # a connector tier was expected and configured, but vLLM took no external hit
    RETRIEVED_BUT_UNUSED = "retrieved-but-unused"
    # rig B served a prompt only rig A had prefilled, from the KV tier they share (label_shared)
    WARM_SHARED = "warm-shared"
    # rig B's own GPU pool served (part of) the prompt: B already had it, so the window proves nothing shared
    NOT_SHARED = "not-shared"
    # a warm tier whose counters prove it, but whose greedy output differs from the cold run's (LMCache#4492:
    # wrong output after a restart): fast and wrong. Judged from the outputs, not the counters (TierResult.label).
    SERVED_BUT_WRONG = "served-but-wrong"


CONNECTOR_TIERS = (Tier.WARM_CONNECTOR, Tier.WARM_PERSISTENT)
# How the store tier behind a connector hit was told: LMCache's own counters (per-tier hits, or the chunks it loaded
# and those its L2 prefetcher loaded), or the procedure (after a down/up L1 is empty, so a hit came from L2) where
# the running LMCache exports neither.
BY_COUNTERS, INFERRED = "counters", "inferred"


@dataclass(frozen=True)
class TierLabel:
    tier: Tier
    expected: Tier
    passed: bool
    # the numbers the label was read from, for the card ("each tier its metric proof")
    gpu_hits: float
    gpu_queries: float
    external_hits: float
    external_queries: float
    external_kv_transfer_tokens: float
    proof: str
    # tokens the LMCache server says it found (None when its metrics were not scraped)
    connector_retrieved_tokens: float | None = None
    # the LMCache tier that served a connector hit: "L1", "L2" or "L1+L2"; None when not LMCache or no hit
    store_tier: str | None = None
    # BY_COUNTERS (LMCache's hit_l1/hit_l2 counters) or INFERRED (from the restart); None with no store_tier
    store_tier_source: str | None = None


def _served(measured: Delta) -> tuple[float, float, str]:
    """(GPU-cache, connector) tokens the window's request used, and a note when the hit counters over-count.

    vllm:prompt_tokens_by_source counts each prompt token once; the prefix-cache hit counters were
    double-counted while a connector deferred a request (vllm#43736). Where the running vLLM exports the
    former, the label is read from the tokens served; elsewhere from the hit counters.
    """
    gpu, external = measured.prefix_cache_hits, measured.external_prefix_cache_hits
    if not measured.prompt_tokens_by_source:
        return gpu, external, ""
    served_gpu, served_external = measured.tokens_from("local_cache_hit"), measured.tokens_from("external_kv_transfer")
    if gpu <= served_gpu and external <= served_external:
        return gpu, external, ""
    note = (
        f" (hit counters over-count: GPU +{gpu:.0f}, external +{external:.0f} for +{served_gpu:.0f} and "
        f"+{served_external:.0f} tokens served (prompt_tokens_by_source), vllm#43736: labelled from the tokens served)"
    )
    return min(gpu, served_gpu), min(external, served_external), note


def _queried(queries: float, measured: Delta) -> str:
    """ "/N queried", or why no ratio is printed when the window's queries were re-counted."""
    if measured.recounted(queries):
        return (
            f" (queries re-counted: {queries:.0f} for {measured.window_prompt_tokens:.0f} prompt tokens, no hit ratio)"
        )
    return f"/{queries:.0f} queried"


def _lmcache_store_tier(measured: Delta, after_restart: bool) -> tuple[str, str, str]:
    """(tier, source, proof text) of an LMCache hit: its own L1/L2 hit counters where it exports them, else the
    chunks it loaded into vLLM against those its L2 prefetcher loaded (0.5.3), else inferred from the procedure."""
    l1, l2 = measured.lmcache_counter(LMCACHE_LOOKUP_HITS_L1), measured.lmcache_counter(LMCACHE_LOOKUP_HITS_L2)
    prefetched = measured.lmcache_counter(LMCACHE_L2_PREFETCH_LOADED)
    if l1 is None and l2 is None:
        return _lmcache_tier_by_chunks(measured, prefetched, after_restart)
    l1, l2 = l1 or 0.0, l2 or 0.0
    tier = "L1+L2" if l1 > 0 and l2 > 0 else "L2" if l2 > 0 else "L1"
    text = f"; LMCache L1 hits +{l1:.0f}, L2 hits +{l2:.0f}"
    if prefetched is not None:
        text += f", L2 prefetch loads +{prefetched:.0f} chunks"
    return tier, BY_COUNTERS, text + f": served from {tier}"


def _lmcache_tier_by_chunks(measured: Delta, prefetched: float | None, after_restart: bool) -> tuple[str, str, str]:
    """LMCache 0.5.3: chunks loaded into vLLM (lmcache_mp_num_chunks_loaded_total) and chunks its prefetcher
    brought up from L2 (lmcache_mp_l2_prefetch_load_completed_chunks_total; no series yet = none)."""
    loaded = measured.lmcache_counter(LMCACHE_CHUNKS_LOADED)
    if not loaded:
        tier = "L2" if after_restart else "L1"
        return (
            tier,
            INFERRED,
            (
                f"; LMCache {tier} inferred from the procedure (this LMCache exports no "
                f"{LMCACHE_LOOKUP_HITS_L1} / {LMCACHE_LOOKUP_HITS_L2}, and loaded no chunk by "
                f"{LMCACHE_CHUNKS_LOADED})"
            ),
        )
    from_l2 = min(prefetched or 0.0, loaded)
    tier = "L2" if from_l2 >= loaded else "L1+L2" if from_l2 > 0 else "L1"
    return (
        tier,
        BY_COUNTERS,
        (f"; LMCache chunks loaded +{loaded:.0f}, of them from L2 (prefetch loads) +{from_l2:.0f}: served from {tier}"),
    )


def _proof(measured: Delta, gpu_hits: float, ext_hits: float, over_counted: str) -> tuple[str, float | None]:
    """The metric proof of a window, in words, and the tokens the LMCache server found (None: not scraped)."""
    ext_tokens = measured.tokens_from("external_kv_transfer")
    proof = (
        f"GPU prefix hits +{gpu_hits:.0f}{_queried(measured.prefix_cache_queries, measured)}, "
        f"external hits +{ext_hits:.0f}{_queried(measured.external_prefix_cache_queries, measured)}, "
        f"external_kv_transfer tokens +{ext_tokens:.0f}{over_counted}"
    )
    cached = {source: tokens for source, tokens in measured.prompt_tokens_cached_by_source.items() if tokens > 0}
    if cached:  # where this vLLM exports it (0.32 does, 0.26 does not): which store served, disk for a disk tier
        proof += ", cached by source " + ", ".join(
            f"{source} +{tokens:.0f}" for source, tokens in sorted(cached.items())
        )
    retrieved = measured.lmcache_counter(LMCACHE_LOOKUP_HITS)
    if retrieved is not None:
        proof += f", LMCache lookup hits +{retrieved:.0f}"
        if retrieved > 0 and ext_hits == 0:
            proof += " (retrieved by the connector, used 0% by vLLM)"
    return proof, retrieved


def _tier_label(
    measured: Delta,
    tier: Tier,
    expected: Tier,
    gpu_hits: float,
    ext_hits: float,
    proof: str,
    retrieved: float | None,
    store_tier: str | None = None,
    store_source: str | None = None,
) -> TierLabel:
    if measured.reset:
        proof += " (counters reset: server restarted inside the window)"
    return TierLabel(
        tier=tier,
        expected=expected,
        passed=tier == expected,
        gpu_hits=gpu_hits,
        gpu_queries=measured.prefix_cache_queries,
        external_hits=ext_hits,
        external_queries=measured.external_prefix_cache_queries,
        external_kv_transfer_tokens=measured.tokens_from("external_kv_transfer"),
        proof=proof,
        connector_retrieved_tokens=retrieved,
        store_tier=store_tier,
        store_tier_source=store_source,
    )


def label(measured: Delta, expected: Tier, connector_configured: bool, after_restart: bool = False) -> TierLabel:
    """The tier `measured` proves, judged against the tier the procedure `expected`.

    after_restart: the scrape window follows a full down/up, so any external hit came from
    the persistent tier (L1 RAM is empty after a restart).
    """
    gpu_hits, ext_hits, over_counted = _served(measured)
    if gpu_hits > 0 and ext_hits > 0:
        tier = Tier.MIXED
    elif gpu_hits > 0:
        tier = Tier.WARM_GPU
    elif ext_hits > 0:
        tier = Tier.WARM_PERSISTENT if after_restart else Tier.WARM_CONNECTOR
    elif connector_configured and expected in CONNECTOR_TIERS:
        tier = Tier.RETRIEVED_BUT_UNUSED
    else:
        tier = Tier.COLD
    proof, retrieved = _proof(measured, gpu_hits, ext_hits, over_counted)
    store_tier = store_source = None
    if retrieved is not None and tier in CONNECTOR_TIERS:
        store_tier, store_source, text = _lmcache_store_tier(measured, after_restart)
        proof += text
    return _tier_label(measured, tier, expected, gpu_hits, ext_hits, proof, retrieved, store_tier, store_source)


def label_shared(measured: Delta, shared_configured: bool = True) -> TierLabel:
    """What rig B's window proves about a salted prompt that only rig A had prefilled (expected: warm-shared).

    A GPU prefix hit on B, whole or partial, means B already held (part of) the prompt in its own pool (a reused
    salt, a request routed to B before): not-shared, whatever the external counters say. With no GPU hit, B's
    external hits prove the shared tier served it; none at all, where B shares a tier, is retrieved-but-unused.
    """
    gpu_hits, ext_hits, over_counted = _served(measured)
    if gpu_hits > 0:
        tier = Tier.NOT_SHARED
    elif ext_hits > 0:
        tier = Tier.WARM_SHARED
    elif shared_configured:
        tier = Tier.RETRIEVED_BUT_UNUSED
    else:
        tier = Tier.COLD
    proof, retrieved = _proof(measured, gpu_hits, ext_hits, over_counted)
    if tier == Tier.NOT_SHARED:
        proof += f" (B's own GPU pool served {gpu_hits:.0f} tokens: B already had the prompt, no shared hit)"
    return _tier_label(measured, tier, Tier.WARM_SHARED, gpu_hits, ext_hits, proof, retrieved)
