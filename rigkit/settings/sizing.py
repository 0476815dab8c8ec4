"""Capacity and memory sizing: how many long sessions a KV tier holds, what the container needs.

Two figures, never mixed up (the story's own correction):
- the cache tiers' cost, kv_bytes_per_token: what one token costs in L1 RAM and on the L2 disk (~131 KB/token
  for the 27B hybrid under LMCache on the real rig: 50K tokens ~ 6.5 GB). It sets how many sessions a tier holds.
- the GPU KV per token (gpu_kv_bytes_per_token): what one token costs in each GPU's KV pool, which the KV cache
  dtype and the tensor-parallel size change (18.9 KB/token int8 on the real rig). It sets the longest context.
Two units, each knob declaring its own in its doc (rigkit/settings/knobs.py): memory knobs (l1_size_gb, model_size_gb,
mem_headroom_gb, mem_limit_gb, ram_reserve_gb) count GiB (2^30 bytes), as the tools they reach do:
`lmcache server --l1-size-gb` multiplies by 2^30 (lmcache 0.5.x v1/distributed/config.py) and compose's `110g`
is 110 GiB (docker/go-units RAMInBytes); disk knobs (l2_budget_gb) count GB (10^9 bytes), as disks and df -H do.
"""

from __future__ import annotations

import math
from typing import Optional

GB = 10**9
GIB = 2**30
KB = 1000  # the card's KB/token is in decimal kilobytes, as in the user's card
# Session lengths the capacity line reports: the real rig's typical, long and maximal contexts.
SESSION_TOKENS: dict[str, int] = {"50K": 50_000, "128K": 128_000, "262K": 262_144}


def session_gb(tokens: int, kv_bytes_per_token: int) -> float:
    """KV cache size of one session of ``tokens`` tokens, in GB."""
    return tokens * kv_bytes_per_token / GB


def sessions_fitting(capacity_gb: float, tokens: int, kv_bytes_per_token: int) -> int:
    """Whole sessions of ``tokens`` tokens that fit in ``capacity_gb``."""
    return math.floor(capacity_gb * GB / (tokens * kv_bytes_per_token))


def _tier(label: str, capacity_bytes: float, kv_bytes_per_token: int) -> str:
    counts = " ".join(
        f"{sessions_fitting(capacity_bytes / GB, tokens, kv_bytes_per_token)}x{name}"
        for name, tokens in SESSION_TOKENS.items()
    )
    return f"{label}: {counts}"


def capacity_line(l1_gib: Optional[float], l2_gb: Optional[float], kv_bytes_per_token: int) -> str:
    """One line for the deploy summary, e.g. ``L1 30 GiB: 4x50K 1x128K 0x262K | L2 ... (131 KB/token)``."""
    tiers = ([_tier(f"L1 {l1_gib:g} GiB", l1_gib * GIB, kv_bytes_per_token)] if l1_gib else []) + (
        [_tier(f"L2 {l2_gb:g} GB", l2_gb * GB, kv_bytes_per_token)] if l2_gb else []
    )
    per_token = f"{kv_bytes_per_token / 1000:g} KB/token"
    if not tiers:
        return f"no KV tier beyond the GPU ({per_token})"
    return " | ".join(tiers) + f" ({per_token})"


# Bytes of one KV element in vLLM 0.26's cache (vllm/utils/torch_utils.py STR_DTYPE_TO_TORCH_DTYPE); "auto"
# is the model's dtype, counted as 16 bits (set kv_cache_dtype when a checkpoint's own config picks another).
KV_ELEMENT_BYTES = {
    "auto": 2,
    "float16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "int8_per_token_head": 1,
    "fp8_per_token_head": 1,
}
# Per-token-head dtypes also keep a float32 scale per token, per KV head, for K and for V
# (vllm/v1/kv_cache_interface.py AttentionSpec.unpadded_page_size_bytes).
PER_TOKEN_HEAD_SCALE_BYTES = 4


def gpu_kv_bytes_per_token(
    kv_cache_dtype: Optional[str], attention_layers: int, kv_heads: int, head_dim: int, tensor_parallel_size: int
) -> Optional[int]:
    """KV bytes one token takes in EACH GPU's pool, as vLLM 0.26 lays out its pages (before any padding);
    None for a dtype whose packed layout rigkit does not model (MLA, TurboQuant).

    Each GPU keeps its share of the KV heads, at least one (vLLM replicates heads when TP > KV heads).
    """
    dtype = kv_cache_dtype or "auto"
    heads = max(1, kv_heads // tensor_parallel_size)
    if dtype == "int4_per_token_head":
        per_head = 2 * (head_dim // 2)
    elif dtype == "nvfp4":
        per_head = 2 * (head_dim // 2 + head_dim // 16)  # fp4 data + fp8 block scales, K and V
    elif dtype in KV_ELEMENT_BYTES:
        per_head = 2 * head_dim * KV_ELEMENT_BYTES[dtype]
    else:
        return None
    if dtype.endswith("_per_token_head"):
        per_head += 2 * PER_TOKEN_HEAD_SCALE_BYTES
    return attention_layers * heads * per_head


def gpu_line(
    bytes_per_token: int, kv_cache_dtype: Optional[str], tensor_parallel_size: int, max_model_len: Optional[int]
) -> str:
    """The capacity line's GPU part: the per-GPU KV rate and what the longest context needs of each GPU."""
    line = f"GPU KV {bytes_per_token / 1000:g} KB/token/GPU ({kv_cache_dtype or 'auto'}, TP {tensor_parallel_size})"
    if max_model_len:
        line += f": a {max_model_len}-token context needs {max_model_len * bytes_per_token / GB:.2f} GB/GPU"
    return line


def required_mem_limit_gib(l1_gib: float, model_size_gib: float, headroom_gib: float) -> int:
    """The smallest container memory limit (GiB, compose's `g`) that holds pinned L1, the weights' page cache
    and headroom.

    Both pinned L1 and mmap'd weight pages count against the cgroup: L1=60 needed 110g on the real rig.
    """
    return math.ceil(l1_gib + model_size_gib + headroom_gib)
