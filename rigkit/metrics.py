"""vLLM (and LMCache MP) /metrics: parse once, keep the counters that prove a cache tier.

The text is parsed with prometheus_client's reference parser. That parser strips `_total`
from counter *family* names but keeps the full *sample* names, so everything here is keyed
by sample name (`vllm:prefix_cache_hits_total`), never by family name. Counters are summed
over engines (data-parallel engines each report their own series).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Mapping, Optional

from rigkit.errors import RigkitError

PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
PROMPT_TOKENS_CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
TTFT = "vllm:time_to_first_token_seconds"
DECODE_TIME = "vllm:request_decode_time_seconds"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
# gauges: requests the engine is running / holding in its queue (a drained rig is idle when both read 0)
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
# prometheus_client's process collector in vLLM's API server: a new value is a new engine process (a restart)
PROCESS_START = "process_start_time_seconds"
# Watched on the fleet's dashboards and alerts (rigkit.monitoring), not by the tier proof. Each is in the captured
# /metrics of vLLM 0.26 (tests/fixtures/gpu-h200-vllm0.26) and 0.32 (tests/fixtures/metrics) unless said otherwise;
# tests/monitoring/test_queries.py holds every name a dashboard or a rule queries against those captures.
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
E2E_REQUEST_LATENCY = "vllm:e2e_request_latency_seconds"
REQUEST_SUCCESS = "vllm:request_success_total"
PREEMPTIONS = "vllm:num_preemptions_total"
# vLLM's native CPU offload (the OffloadingConnector: native-offload, native-tiered; 0.26 captures only): KV
# bytes stored to and loaded from its tiers, and how full its CPU tier is.
KV_OFFLOAD_STORE_BYTES = "vllm:kv_offload_store_bytes_total"
KV_OFFLOAD_LOAD_BYTES = "vllm:kv_offload_load_bytes_total"
KV_OFFLOAD_CPU_USAGE = "vllm:kv_offload_cpu_cache_usage_perc"
LMCACHE_PREFIX = "lmcache_mp_"
# Speculative decoding (vLLM 0.26 vllm/v1/spec_decode/metrics.py SpecDecodingProm; only served with a speculative
# config): acceptance rate = accepted / draft tokens, mean acceptance length = 1 + accepted / drafts.
SPEC_DECODE_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DECODE_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_DECODE_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
# LMCache MP server counters (its HTTP port's /metrics). Newer releases split the lookup hits by tier
# (hit_l1 + hit_l2 = hit). 0.5.3 does not, but counts what it moved, in chunks (captured on an H200,
# tests/fixtures/gpu-h200-vllm0.26/h200-2026-12-03-round1/lmcache-mp-l2): chunks it loaded into vLLM, and, with an
# L2 adapter, chunks its prefetcher loaded from L2 (label l2_name in newer releases; +13 per warm-persistent request
# of 13 chunks there, +0 in every warm-connector window). A series appears with its first event.
LMCACHE_LOOKUP_REQUESTED = "lmcache_mp_lookup_requested_tokens_total"
LMCACHE_LOOKUP_HITS = "lmcache_mp_lookup_hit_tokens_total"
LMCACHE_LOOKUP_HITS_L1 = "lmcache_mp_lookup_hit_l1_tokens_total"
LMCACHE_LOOKUP_HITS_L2 = "lmcache_mp_lookup_hit_l2_tokens_total"
LMCACHE_L2_PREFETCH_LOADED = "lmcache_mp_l2_prefetch_load_completed_chunks_total"
LMCACHE_CHUNKS_LOADED = "lmcache_mp_num_chunks_loaded_total"
# LMCache MP's L1 (CPU memory) tier, 0.5.3: how full it is, and chunks read from and written to it.
LMCACHE_L1_USAGE = "lmcache_mp_l1_usage_ratio"
LMCACHE_L1_READ_CHUNKS = "lmcache_mp_l1_read_chunks_total"
LMCACHE_L1_WRITE_CHUNKS = "lmcache_mp_l1_write_chunks_total"

# Labels that only say which engine or model reported a series: summed over.
ENGINE_LABELS = ("engine", "model_name")
# The LMCache labels that split a series into things that mean different things; every other label
# (cache_salt="" on every lookup sample of 0.5.3, model_name, engine_id, instance_id, device, worker_id)
# only says where a sample came from and is summed over.
LMCACHE_MEANING_LABELS = ("l2_name", "state", "le")


class MetricsError(RigkitError):
    """/metrics cannot prove anything: unparsable, or the vLLM prefix-cache counters are missing."""


@dataclass(frozen=True)
class Snapshot:
    """The counters and gauges of one /metrics scrape that matter for cache validation."""

    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0
    external_prefix_cache_queries: float = 0.0
    external_prefix_cache_hits: float = 0.0
    # every prompt token once (vllm:prompt_tokens_total)
    prompt_tokens: float = 0.0
    # source label -> tokens (local_compute, local_cache_hit, external_kv_transfer); each prompt token counted
    # once, where the prefix-cache counters can count a token twice (vllm#43736) or re-count queries.
    # Empty when the running vLLM does not export it; parse what each version exports:
    prompt_tokens_by_source: Mapping[str, float] = field(default_factory=dict)
    # source label -> tokens (device, host, p2p, disk, external_unspecified): vLLM 0.32 exports it (the lab's
    # CPU build), 0.26 does not (the H200 captures)
    prompt_tokens_cached_by_source: Mapping[str, float] = field(default_factory=dict)
    generation_tokens: float = 0.0
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    # upper bound "le" -> cumulative count
    ttft_buckets: Mapping[float, float] = field(default_factory=dict)
    # time from a request's first to its last token, server side (decode speed without the network)
    decode_time_sum: float = 0.0
    decode_time_count: float = 0.0
    # gauge: the largest over engines (a sum of fractions would mean nothing)
    kv_cache_usage_perc: float = 0.0
    # labels of vllm:cache_config_info (first engine); strings as vLLM reports them
    cache_config: Mapping[str, str] = field(default_factory=dict)
    # every lmcache_mp_* sample, keyed by sample name (+ non-engine labels), summed
    lmcache: Mapping[str, float] = field(default_factory=dict)
    # speculative decoding: steps that drafted, tokens drafted, drafted tokens the target model accepted
    spec_decode_drafts: float = 0.0
    spec_decode_draft_tokens: float = 0.0
    spec_decode_accepted_tokens: float = 0.0
    # True when the scrape carried the vLLM prefix-cache counters at all
    has_prefix_counters: bool = False

    def lmcache_counter(self, name: str) -> Optional[float]:
        """An LMCache counter summed over its series (every l2_name); None when the scrape has none of it."""
        values = [value for key, value in self.lmcache.items() if key.partition("{")[0] == name]
        return sum(values) if values else None

    @property
    def num_gpu_blocks(self) -> Optional[int]:
        return _int_or_none(self.cache_config.get("num_gpu_blocks")) or _int_or_none(
            self.cache_config.get("num_gpu_blocks_override")
        )

    @property
    def block_size(self) -> Optional[int]:
        return _int_or_none(self.cache_config.get("block_size"))

    @property
    def gpu_pool_tokens(self) -> Optional[int]:
        """Tokens the GPU KV pool holds: what filler requests must push through to evict a prefix."""
        if self.num_gpu_blocks is None or self.block_size is None:
            return None
        return self.num_gpu_blocks * self.block_size


def _int_or_none(value: Optional[str]) -> Optional[int]:
    if value in (None, "", "None"):
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def _label_key(name: str, labels: Mapping[str, str]) -> str:
    """An LMCache sample's key: its name, with only the labels that change its meaning."""
    rest = {k: v for k, v in labels.items() if k in LMCACHE_MEANING_LABELS}
    if not rest:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(rest.items())) + "}"


def _families(text: str) -> list:
    """Every family in the text, in order. Two can share a name: vLLM's /metrics followed by LMCache's both carry
    python_gc_* and process_*, and a counter without a HELP line comes out as one family per sample."""
    # prometheus_client loads here, when metrics are read: a deploy imports this module through its roles and
    # reads none in a no-op (~14 ms of each run's start)
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise MetricsError(
            "/metrics",
            text[:80],
            f"not Prometheus text format ({exc})",
            "point the client at the serving API's /metrics",
        ) from None


def parse_families(text: str) -> dict:
    """Family name -> prometheus_client Metric. Counter families are named without `_total`."""
    return {family.name: family for family in _families(text)}


def parse(text: str) -> Snapshot:
    """Parse a /metrics text (vLLM's, LMCache MP's, or both concatenated) into a Snapshot."""
    families = _families(text)
    sums: dict[str, float] = {}
    by_source: dict[str, float] = {}
    cached_by_source: dict[str, float] = {}
    buckets: dict[float, float] = {}
    lmcache: dict[str, float] = {}
    usage = 0.0
    cache_config: dict[str, str] = {}
    for family in families:
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if math.isnan(value):
                continue
            if name == PROMPT_TOKENS_BY_SOURCE:
                source = labels.get("source", "")
                by_source[source] = by_source.get(source, 0.0) + value
            elif name == PROMPT_TOKENS_CACHED_BY_SOURCE:
                source = labels.get("source", "")
                cached_by_source[source] = cached_by_source.get(source, 0.0) + value
            elif name == TTFT + "_bucket":
                bound = float(labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + value
            elif name == KV_CACHE_USAGE:
                usage = max(usage, value)
            elif name == CACHE_CONFIG_INFO:
                if not cache_config:
                    cache_config = {k: v for k, v in labels.items() if k not in ENGINE_LABELS}
            elif name.startswith(LMCACHE_PREFIX):
                key = _label_key(name, labels)
                lmcache[key] = lmcache.get(key, 0.0) + value
            else:
                sums[name] = sums.get(name, 0.0) + value
    return Snapshot(
        prefix_cache_queries=sums.get(PREFIX_QUERIES, 0.0),
        prefix_cache_hits=sums.get(PREFIX_HITS, 0.0),
        external_prefix_cache_queries=sums.get(EXTERNAL_QUERIES, 0.0),
        external_prefix_cache_hits=sums.get(EXTERNAL_HITS, 0.0),
        prompt_tokens=sums.get(PROMPT_TOKENS, 0.0),
        prompt_tokens_by_source=by_source,
        prompt_tokens_cached_by_source=cached_by_source,
        generation_tokens=sums.get(GENERATION_TOKENS, 0.0),
        ttft_sum=sums.get(TTFT + "_sum", 0.0),
        ttft_count=sums.get(TTFT + "_count", 0.0),
        ttft_buckets=dict(sorted(buckets.items())),
        decode_time_sum=sums.get(DECODE_TIME + "_sum", 0.0),
        decode_time_count=sums.get(DECODE_TIME + "_count", 0.0),
        kv_cache_usage_perc=usage,
        cache_config=cache_config,
        lmcache=lmcache,
        spec_decode_drafts=sums.get(SPEC_DECODE_DRAFTS, 0.0),
        spec_decode_draft_tokens=sums.get(SPEC_DECODE_DRAFT_TOKENS, 0.0),
        spec_decode_accepted_tokens=sums.get(SPEC_DECODE_ACCEPTED_TOKENS, 0.0),
        has_prefix_counters=PREFIX_QUERIES in sums and PREFIX_HITS in sums,
    )


def require_prefix_counters(snapshot: Snapshot) -> Snapshot:
    """Refuse a scrape that cannot prove a tier (what the smoke check asserts after every deploy)."""
    if not snapshot.has_prefix_counters:
        raise MetricsError(
            PREFIX_HITS,
            None,
            "the vLLM prefix-cache counters are missing from /metrics",
            "serve with --enable-prefix-caching on a vLLM that exports vllm:prefix_cache_* (v1 engine)",
        )
    return snapshot


def requests_in_flight(text: str) -> float:
    """Requests a vLLM /metrics text says are running or waiting, summed over engines; MetricsError when it
    carries neither gauge (then nothing can say the engine is idle)."""
    seen = [
        sample.value
        for family in _families(text)
        for sample in family.samples
        if sample.name in (REQUESTS_RUNNING, REQUESTS_WAITING) and not math.isnan(sample.value)
    ]
    if not seen:
        raise MetricsError(
            REQUESTS_RUNNING,
            None,
            "the vLLM request gauges are missing from /metrics",
            "point the client at a vLLM serving API's /metrics",
        )
    return sum(seen)


def process_start(text: str) -> Optional[float]:
    """The first process_start_time_seconds of a /metrics text (vLLM's API server's), None when it has none."""
    for family in _families(text):
        for sample in family.samples:
            if sample.name == PROCESS_START:
                return sample.value
    return None


_COUNTER_FIELDS = (
    "prefix_cache_queries",
    "prefix_cache_hits",
    "external_prefix_cache_queries",
    "external_prefix_cache_hits",
    "prompt_tokens",
    "generation_tokens",
    "ttft_sum",
    "ttft_count",
    "decode_time_sum",
    "decode_time_count",
    "spec_decode_drafts",
    "spec_decode_draft_tokens",
    "spec_decode_accepted_tokens",
)


@dataclass(frozen=True)
class Delta(Snapshot):
    """after - before for counters; gauges and info as of `after`.

    `reset` is True when a counter went backwards (the server restarted between the two
    scrapes); the delta then counts from zero, as Prometheus' rate() does.
    """

    reset: bool = False

    @property
    def server_ttft_mean(self) -> Optional[float]:
        return self.ttft_sum / self.ttft_count if self.ttft_count > 0 else None

    def server_decode_tps(self, completion_tokens: int) -> Optional[float]:
        """Decode tok/s of the one request in this window, timed by the server (first to last token)."""
        if self.decode_time_count != 1 or self.decode_time_sum <= 0 or completion_tokens < 2:
            return None
        return (completion_tokens - 1) / self.decode_time_sum

    def tokens_from(self, source: str) -> float:
        return self.prompt_tokens_by_source.get(source, 0.0)

    @property
    def window_prompt_tokens(self) -> float:
        """Prompt tokens the window's requests carried, each counted once."""
        return sum(self.prompt_tokens_by_source.values()) or self.prompt_tokens

    def recounted(self, queries: float) -> bool:
        """More prefix-cache queries than prompt tokens in the window: vLLM re-counted them (16x while blocks
        were promoted from a disk tier on the H200), so hits/queried means nothing across this window."""
        return 0 < self.window_prompt_tokens < queries


def _sub_map(after: Mapping, before: Mapping, reset: bool) -> dict:
    if reset:
        return dict(after)
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def delta(before: Snapshot, after: Snapshot) -> Delta:
    """What happened between two scrapes of the same server."""
    went_back = any(getattr(after, name) < getattr(before, name) for name in _COUNTER_FIELDS)
    went_back = went_back or any(
        v < before.prompt_tokens_by_source.get(k, 0.0) for k, v in after.prompt_tokens_by_source.items()
    )
    counters = {
        name: getattr(after, name) if went_back else getattr(after, name) - getattr(before, name)
        for name in _COUNTER_FIELDS
    }
    base = {f.name: getattr(after, f.name) for f in fields(Snapshot)}
    base.update(counters)
    base.update(
        prompt_tokens_by_source=_sub_map(after.prompt_tokens_by_source, before.prompt_tokens_by_source, went_back),
        prompt_tokens_cached_by_source=_sub_map(
            after.prompt_tokens_cached_by_source, before.prompt_tokens_cached_by_source, went_back
        ),
        ttft_buckets=_sub_map(after.ttft_buckets, before.ttft_buckets, went_back),
        # lmcache_mp_* mixes counters and gauges; a difference of gauges still reads as growth
        lmcache=_sub_map(after.lmcache, before.lmcache, went_back),
    )
    return Delta(reset=went_back, **base)


def as_dict(snapshot: Snapshot) -> dict:
    """JSON-ready form (bucket bounds as strings, +Inf included)."""
    out = {f.name: getattr(snapshot, f.name) for f in fields(snapshot)}
    out["ttft_buckets"] = {repr(k) if not math.isinf(k) else "+Inf": v for k, v in snapshot.ttft_buckets.items()}
    out["prompt_tokens_by_source"] = dict(snapshot.prompt_tokens_by_source)
    out["prompt_tokens_cached_by_source"] = dict(snapshot.prompt_tokens_cached_by_source)
    out["cache_config"] = dict(snapshot.cache_config)
    out["lmcache"] = dict(snapshot.lmcache)
    return out


__all__ = [
    "Snapshot",
    "Delta",
    "MetricsError",
    "parse",
    "parse_families",
    "delta",
    "require_prefix_counters",
    "as_dict",
    "requests_in_flight",
]
