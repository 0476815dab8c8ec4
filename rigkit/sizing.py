"""Capacity and memory sizing: how many long sessions a KV tier holds, what the container needs.

The KV cache costs kv_bytes_per_token in every tier (~131 KB/token for the 27B hybrid on the real
rig: 50K tokens ~ 6.5 GB). GB here means 10^9 bytes, as the knobs do.
"""

from __future__ import annotations

import math
from typing import Optional

GB = 10**9
# Session lengths the capacity line reports: the real rig's typical, long and maximal contexts.
SESSION_TOKENS: dict[str, int] = {"50K": 50_000, "128K": 128_000, "262K": 262_144}


def session_gb(tokens: int, kv_bytes_per_token: int) -> float:
    """KV cache size of one session of ``tokens`` tokens, in GB."""
    return tokens * kv_bytes_per_token / GB


def sessions_fitting(capacity_gb: float, tokens: int, kv_bytes_per_token: int) -> int:
    """Whole sessions of ``tokens`` tokens that fit in ``capacity_gb``."""
    return math.floor(capacity_gb * GB / (tokens * kv_bytes_per_token))


def _tier(label: str, capacity_gb: float, kv_bytes_per_token: int) -> str:
    counts = " ".join(f"{sessions_fitting(capacity_gb, tokens, kv_bytes_per_token)}x{name}"
                      for name, tokens in SESSION_TOKENS.items())
    return f"{label} {capacity_gb:g} GB: {counts}"


def capacity_line(l1_gb: Optional[float], l2_gb: Optional[float], kv_bytes_per_token: int) -> str:
    """One line for the deploy summary, e.g. ``L1 30 GB: 4x50K 1x128K 0x262K | L2 ... (131 KB/token)``."""
    tiers = [_tier(label, gb, kv_bytes_per_token) for label, gb in (("L1", l1_gb), ("L2", l2_gb)) if gb]
    per_token = f"{kv_bytes_per_token / 1000:g} KB/token"
    if not tiers:
        return f"no KV tier beyond the GPU ({per_token})"
    return " | ".join(tiers) + f" ({per_token})"


def required_mem_limit_gb(l1_gb: float, model_size_gb: float, headroom_gb: float) -> int:
    """The smallest container memory limit that holds pinned L1, the weights' page cache and headroom.

    Both pinned L1 and mmap'd weight pages count against the cgroup: L1=60 GB needed 110g on the real rig.
    """
    return math.ceil(l1_gb + model_size_gb + headroom_gb)


