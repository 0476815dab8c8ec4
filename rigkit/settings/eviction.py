"""How much of a CPU tier a session can really use, by each cache's eviction rule (issue 42: at l1_size_gb 30 a 32K
session of an 8B shape was evicted by LMCache before its CPU-tier request; the capacity line counted the whole L1).

- LMCache's MP server (L1): once usage reaches the trigger watermark it frees the eviction ratio of the allocated
  memory, least recently used first. Knobs `--eviction-trigger-watermark` (0.8) and `--eviction-ratio` (0.2):
  LMCache's lmcache/v1/distributed/config.py, EvictionConfig (trigger_watermark 0.8, eviction_ratio 0.2), applied
  by lmcache/v1/distributed/storage_controllers/eviction_controller.py (read in the index of LMCache's main branch;
  that 0.5.3, the version rigkit runs, has the same defaults is to be checked against its wheel). rigkit's prelude
  passes neither, so the defaults hold. What survives any eviction: watermark - ratio (60 %); what fits before one
  fires: the watermark (80 %).
- vLLM's OffloadingConnector CPU tier (CPUOffloadingSpec, TieringOffloadingSpec): least recently used blocks are
  evicted one by one, only when a new block needs room (vllm/v1/kv_offload/lru_manager.py, cpu/manager.py): the
  whole of cpu_bytes_to_use holds sessions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

LMCACHE_TRIGGER_WATERMARK = 0.8
LMCACHE_EVICTION_RATIO = 0.2


@dataclass(frozen=True)
class EvictionRule:
    text: str
    fits_fraction: float  # of the tier's size, filled before an eviction fires
    kept_fraction: float  # of the tier's size, kept by any eviction (the most recent sessions)

    def sessions(self, capacity_bytes: float, session_bytes: float) -> tuple[float, float]:
        """(sessions kept whatever the eviction, sessions held before one fires)."""
        if session_bytes <= 0:
            return 0.0, 0.0
        return self.kept_fraction * capacity_bytes / session_bytes, self.fits_fraction * capacity_bytes / session_bytes

    def held_bytes(self, capacity_bytes: int) -> int:
        """Bytes the tier fills before an eviction fires (whole bytes: the boundary is exact, not a float's)."""
        return int(self.fits_fraction * capacity_bytes)

    def sessions_held(self, capacity_bytes: int, session_bytes: float) -> int:
        """Whole sessions the tier holds before an eviction fires: a session cut by an eviction is recomputed from
        its first evicted block on, so a part of one is no session. Filling exactly held_bytes is taken as not past
        the watermark (whether LMCache 0.5.3 compares with > or >= is unconfirmed: at that one byte the count may be
        one high)."""
        if session_bytes <= 0:
            return 0
        return int(self.held_bytes(capacity_bytes) // session_bytes)


LMCACHE_L1 = EvictionRule(
    f"LMCache frees {100 * LMCACHE_EVICTION_RATIO:.0f} % once {100 * LMCACHE_TRIGGER_WATERMARK:.0f} % full "
    "(least recently used first)",
    LMCACHE_TRIGGER_WATERMARK,
    LMCACHE_TRIGGER_WATERMARK - LMCACHE_EVICTION_RATIO,
)
VLLM_LRU = EvictionRule("vLLM's CPU tier evicts least recently used blocks only as new ones need room", 1.0, 1.0)
RULES = {"LMCacheMPConnector": LMCACHE_L1, "OffloadingConnector": VLLM_LRU}


def rule_for(kv_connector: Optional[str]) -> Optional[EvictionRule]:
    """The rule of a connector by its vLLM name (kv_transfer_config's kv_connector); None: rigkit does not know it."""
    return RULES.get(kv_connector or "")
