"""Label a measured request by the cache tier that served it, from metric deltas only.

vLLM's GPU prefix cache answers an immediate repeat before any KV connector is asked, so
TTFT alone cannot tell the tiers apart. The label comes from which counters moved during
the request: `vllm:prefix_cache_hits_total` (GPU pool) and
`vllm:external_prefix_cache_hits_total` (the KV connector: LMCache L1/L2, ExampleConnector
store). Timing is reported beside the label, never used to make it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from rigkit.metrics import Delta


class Tier(str, Enum):
    COLD = "cold"
    WARM_GPU = "warm-gpu"
    WARM_CONNECTOR = "warm-connector"
    WARM_PERSISTENT = "warm-persistent"
    # GPU pool and connector both served part of the prefix: the GPU eviction was incomplete
    MIXED = "mixed"
    # a connector tier was expected and configured, but vLLM took no external hit
    RETRIEVED_BUT_UNUSED = "retrieved-but-unused"


CONNECTOR_TIERS = (Tier.WARM_CONNECTOR, Tier.WARM_PERSISTENT)
# LMCache MP server counter of tokens its lookups found (scraped from its own HTTP port)
LMCACHE_LOOKUP_HITS = "lmcache_mp_lookup_hit_tokens_total"


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


def label(measured: Delta, expected: Tier, connector_configured: bool, after_restart: bool = False) -> TierLabel:
    """The tier `measured` proves, judged against the tier the procedure `expected`.

    after_restart: the scrape window follows a full down/up, so any external hit came from
    the persistent tier (L1 RAM is empty after a restart).
    """
    gpu_hits = measured.prefix_cache_hits
    ext_hits = measured.external_prefix_cache_hits
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
    ext_tokens = measured.tokens_from("external_kv_transfer")
    proof = (f"GPU prefix hits +{gpu_hits:.0f}/{measured.prefix_cache_queries:.0f} queried, "
             f"external hits +{ext_hits:.0f}/{measured.external_prefix_cache_queries:.0f} queried, "
             f"external_kv_transfer tokens +{ext_tokens:.0f}")
    retrieved = measured.lmcache.get(LMCACHE_LOOKUP_HITS)
    if retrieved is not None:
        proof += f", LMCache lookup hits +{retrieved:.0f}"
        if retrieved > 0 and ext_hits == 0:
            proof += " (retrieved by the connector, used 0% by vLLM)"
    if measured.reset:
        proof += " (counters reset: server restarted inside the window)"
    return TierLabel(tier=tier, expected=expected, passed=tier == expected, gpu_hits=gpu_hits,
                     gpu_queries=measured.prefix_cache_queries, external_hits=ext_hits,
                     external_queries=measured.external_prefix_cache_queries,
                     external_kv_transfer_tokens=ext_tokens, proof=proof, connector_retrieved_tokens=retrieved)
