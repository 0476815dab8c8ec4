"""Does the tier pay? Each warm tier's TTFT against the floor the rig's own link and disk set, and from which context
length it beats recomputing (issue 42). Pure logic: the rig's limits come from rigkit/files/rig_limits.py's JSON,
the TTFTs from validation (rigkit.validation.procedure, rigkit.validation.pays_sweep).

- KV bytes of a session = KV bytes per token x tokens (per token: measured from the store's growth,
  rigkit.validation.procedure.capacity_from, else from the model's shape, rigkit.settings.sizing).
- A warm tier cannot beat warm-gpu (the prefill of the few tokens left and the first decode step, with the KV on the
  GPU already) plus moving the session's KV over the tier's link: floor = warm-gpu TTFT + KV bytes / rate. The rate
  is the pinned host-to-device link for a CPU tier (every profile's CPU tier is pinned memory: vLLM's
  CPUOffloadingSpec pins its tensors, TieringOffloadingSpec registers its shared region, LMCache's L1 is pinned by
  default) and the disk's best read the probe measured for a disk tier.
- share = floor transfer time / measured transfer time (measured = tier TTFT - warm-gpu TTFT, the issue's rate
  definition); gain = cold TTFT / tier TTFT.
- breakeven over a sweep of context lengths: the shortest length from which the tier is faster than cold at every
  longer length measured ("pays from 9K tokens"), else the rate it would need to tie cold at the longest length.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from pydantic import BaseModel, Field

# A tier below this share of its floor's transfer rate is flagged (issue 42's bar: every CPU tier at >= 75 % of its
# pinned-link floor, or the upstream limit that stops it named).
SHARE_MIN = 0.75
# A measured rate within this factor of a slower path's rate is read as running on that path (pageable memory,
# block-sized copies, one reader thread).
SAME_PATH_FACTOR = 1.15
GB = 10**9

CPU_TIER, DISK_TIER = "warm-connector", "warm-persistent"
TIER_LINKS = {CPU_TIER: "pinned host-to-device link", DISK_TIER: "disk read"}


class LinkRates(BaseModel):
    """Host-to-device copies from one kind of host memory (bytes/s): one bulk copy, and one copy per block."""

    bulk: Optional[float] = None
    blocks: Optional[float] = None


class GpuLimits(BaseModel):
    index: Optional[int] = None
    name: Optional[str] = None
    pcie_gen: Optional[int] = None
    pcie_gen_max: Optional[int] = None
    pcie_width: Optional[int] = None
    pcie_width_max: Optional[int] = None
    pinned: LinkRates = Field(default_factory=LinkRates)
    pageable: LinkRates = Field(default_factory=LinkRates)
    block_bytes: Optional[int] = None
    blocks: Optional[int] = None


class DiskRead(BaseModel):
    file_bytes: int
    files: int
    threads: int
    o_direct: bool
    bytes_per_s: Optional[float] = None


class RigLimits(BaseModel):
    """What rigkit/files/rig_limits.py measured on the rig."""

    gpus: list[GpuLimits] = Field(default_factory=list)
    disk_path: Optional[str] = None
    disk_device: Optional[str] = None
    disk_filesystem: Optional[str] = None
    disk_reads: list[DiskRead] = Field(default_factory=list)
    no_gpu: Optional[str] = None  # why the rig has no GPU to measure (a CPU rig: no link floor for a CPU tier)
    errors: list[str] = Field(default_factory=list)

    @classmethod
    def from_probe(cls, probe: dict) -> "RigLimits":
        """The probe's JSON (rig_limits.main's output) as the card keeps it."""
        gpus = []
        for gpu in probe.get("gpus") or []:
            h2d = gpu.get("h2d") or {}
            gpus.append(
                GpuLimits(
                    **{k: gpu.get(k) for k in GpuLimits.model_fields if k not in ("pinned", "pageable")},
                    pinned=LinkRates(**h2d.get("pinned", {})),
                    pageable=LinkRates(**h2d.get("pageable", {})),
                )
            )
        disk = probe.get("disk") or {}
        return cls(
            gpus=gpus,
            disk_path=disk.get("path"),
            disk_device=disk.get("device"),
            disk_filesystem=disk.get("filesystem"),
            disk_reads=[DiskRead(**{k: r[k] for k in DiskRead.model_fields if k in r}) for r in disk.get("reads", [])],
            no_gpu=probe.get("no_gpu"),
            errors=list(probe.get("errors") or []),
        )

    def _slowest(self, memory: str, kind: str) -> Optional[float]:
        # one GPU's session crosses its own link; with several GPUs the slowest one sets the floor (TP shards move
        # at once, each over its own link, and the request waits for the last)
        rates = [getattr(getattr(g, memory), kind) for g in self.gpus]
        present = [r for r in rates if r]
        return min(present) if present else None

    @property
    def pinned(self) -> Optional[float]:
        return self._slowest("pinned", "bulk")

    @property
    def pinned_blocks(self) -> Optional[float]:
        return self._slowest("pinned", "blocks")

    @property
    def pageable(self) -> Optional[float]:
        return self._slowest("pageable", "bulk")

    @property
    def disk(self) -> Optional[float]:
        """The fastest read the probe measured (a single-stream read is no ceiling: vLLM's fs tier, 16 threads,
        read faster than dd did on the same machine)."""
        return max((r.bytes_per_s for r in self.disk_reads if r.bytes_per_s), default=None)

    @property
    def disk_single_thread(self) -> Optional[float]:
        return max((r.bytes_per_s for r in self.disk_reads if r.bytes_per_s and r.threads == 1), default=None)

    def rate_for(self, tier: str) -> Optional[float]:
        return self.pinned if tier == CPU_TIER else self.disk if tier == DISK_TIER else None


def kv_bytes(kv_bytes_per_token: float, tokens: int) -> float:
    return kv_bytes_per_token * tokens


def floor_s(warm_gpu_s: float, session_bytes: float, rate: float) -> float:
    """The fastest a warm tier can answer: warm-gpu's TTFT plus moving the session's KV at `rate` bytes/s."""
    return warm_gpu_s + session_bytes / rate


class TierFloor(BaseModel):
    """One warm tier at one context length, against the floor the rig's limit sets."""

    tier: str
    tokens: int
    kv_bytes: float
    cold_s: Optional[float] = None
    warm_gpu_s: float
    tier_s: float
    limit: str  # which limit: TIER_LINKS
    limit_bytes_per_s: Optional[float] = None
    floor_s: Optional[float] = None
    rate_bytes_per_s: Optional[float] = None  # KV bytes / (tier TTFT - warm-gpu TTFT)
    share: Optional[float] = None  # floor transfer time / measured transfer time
    gain: Optional[float] = None  # cold / tier
    flag: Optional[str] = None  # below SHARE_MIN: the likely cause

    @property
    def pays(self) -> Optional[bool]:
        return None if self.cold_s is None else self.tier_s < self.cold_s


def likely_cause(tier: str, rate: float, limits: RigLimits) -> str:
    """Why a tier runs well below its floor, from which slower path its rate matches."""
    if tier == CPU_TIER:
        if limits.pageable and rate <= limits.pageable * SAME_PATH_FACTOR and limits.pageable < (limits.pinned or 0):
            return f"runs at the pageable rate ({fmt_rate(limits.pageable)}): its host memory is likely not pinned"
        blocks, bulk = limits.pinned_blocks, limits.pinned
        if blocks and bulk and blocks < SHARE_MIN * bulk and rate <= blocks * SAME_PATH_FACTOR:
            return (
                f"small blocks: block-sized copies reach {fmt_rate(blocks)} on this rig against {fmt_rate(bulk)} "
                f"in one copy (a larger offload block moves more per copy)"
            )
        return "the transfer path, not the link: per-request overhead, or copies not overlapped with compute"
    single = limits.disk_single_thread
    if single and rate <= single * SAME_PATH_FACTOR and single < (limits.disk or 0):
        return f"reads at the one-thread rate ({fmt_rate(single)}): the tier reads with too few threads"
    return "the read path, not the disk: per-file overhead, or reads not overlapped with the copy to the GPU"


def tier_floor(
    tier: str,
    tokens: int,
    kv_bytes_per_token: float,
    warm_gpu_s: float,
    tier_s: float,
    limits: RigLimits,
    cold_s: Optional[float] = None,
) -> TierFloor:
    session = kv_bytes(kv_bytes_per_token, tokens)
    limit = limits.rate_for(tier)
    transfer = tier_s - warm_gpu_s
    rate = session / transfer if transfer > 0 else None
    share = rate / limit if rate and limit else None
    flag = likely_cause(tier, rate, limits) if share is not None and rate and share < SHARE_MIN else None
    return TierFloor(
        tier=tier,
        tokens=tokens,
        kv_bytes=session,
        cold_s=cold_s,
        warm_gpu_s=warm_gpu_s,
        tier_s=tier_s,
        limit=TIER_LINKS.get(tier, "?"),
        limit_bytes_per_s=limit,
        floor_s=floor_s(warm_gpu_s, session, limit) if limit else None,
        rate_bytes_per_s=rate,
        share=share,
        gain=cold_s / tier_s if cold_s and tier_s > 0 else None,
        flag=flag,
    )


# --- where a tier pays: a sweep of context lengths ------------------------------------------------------------------


class SweepPoint(BaseModel):
    """Mean TTFTs (s) at one context length: cold, warm-gpu and each warm tier measured there."""

    tokens: int
    cold_s: float
    warm_gpu_s: float
    tiers: dict[str, float] = Field(default_factory=dict)  # tier -> mean TTFT
    sessions: int = 0


class Breakeven(BaseModel):
    tier: str
    pays_from_tokens: Optional[float] = None  # None: does not pay up to the longest length measured
    longest_tokens: int
    needed_bytes_per_s: Optional[float] = (
        None  # the rate that would tie cold at the longest length (when it never pays)
    )
    limit_bytes_per_s: Optional[float] = None
    limit: str = ""
    text: str


def fmt_tokens(tokens: float) -> str:
    return f"{tokens / 1000:.0f}K" if tokens >= 1000 else f"{tokens:.0f}"


def fmt_rate(bytes_per_s: Optional[float]) -> str:
    return "?" if not bytes_per_s else f"{bytes_per_s / GB:.1f} GB/s"


def needed_rate(session_bytes: float, cold_s: float, warm_gpu_s: float) -> Optional[float]:
    """The rate a tier needs to tie cold: its KV moved in the time cold takes beyond warm-gpu; None if cold is no
    slower than warm-gpu (nothing to win)."""
    room = cold_s - warm_gpu_s
    return session_bytes / room if room > 0 else None


def breakeven(
    tier: str, points: Sequence[SweepPoint], kv_bytes_per_token: Optional[float], limits: Optional[RigLimits]
) -> Optional[Breakeven]:
    """Where `tier` starts to pay, from the sweep's points (any order); None when no point measured the tier."""
    measured = sorted((p for p in points if tier in p.tiers), key=lambda p: p.tokens)
    if not measured:
        return None
    longest = measured[-1]
    limit = limits.rate_for(tier) if limits else None
    what = "the disk gives" if tier == DISK_TIER else "the link gives"
    first = len(measured)
    while first > 0 and measured[first - 1].tiers[tier] < measured[first - 1].cold_s:
        first -= 1
    if first < len(measured):
        if first == 0:
            at = float(measured[0].tokens)
            text = f"pays from {fmt_tokens(at)} tokens (the shortest length measured)"
        else:
            lose, win = measured[first - 1], measured[first]
            d_lose, d_win = lose.cold_s - lose.tiers[tier], win.cold_s - win.tiers[tier]
            # the gain over cold, linear between the last length where it lost and the first where it won
            at = lose.tokens + (win.tokens - lose.tokens) * (-d_lose) / (d_win - d_lose)
            text = f"pays from {fmt_tokens(at)} tokens"
        return Breakeven(tier=tier, pays_from_tokens=at, longest_tokens=longest.tokens, text=text, limit=what)
    needed = None
    if kv_bytes_per_token:
        needed = needed_rate(kv_bytes(kv_bytes_per_token, longest.tokens), longest.cold_s, longest.warm_gpu_s)
    text = f"does not pay up to {fmt_tokens(longest.tokens)} on this rig"
    if needed:
        text += f": needs {fmt_rate(needed)}" + (f", {what} {fmt_rate(limit)}" if limit else "")
    return Breakeven(
        tier=tier,
        longest_tokens=longest.tokens,
        needed_bytes_per_s=needed,
        limit_bytes_per_s=limit,
        limit=what,
        text=text,
    )


def disk_verdict_from_probe(
    points: Sequence[SweepPoint], kv_bytes_per_token: Optional[float], limits: Optional[RigLimits]
) -> Optional[Breakeven]:
    """The disk tier's verdict where no point measured it through the tier (a sweep restarts nothing): at the longest
    length, the best it could do is its floor at the probe's disk rate; a floor above cold does not pay, whatever the
    tier's own overheads. None without a disk rate, a KV size or a point."""
    if not points or not kv_bytes_per_token or not limits or not limits.disk:
        return None
    longest = max(points, key=lambda p: p.tokens)
    session = kv_bytes(kv_bytes_per_token, longest.tokens)
    needed = needed_rate(session, longest.cold_s, longest.warm_gpu_s)
    best_s = floor_s(longest.warm_gpu_s, session, limits.disk)
    what = "the disk gives"
    if best_s < longest.cold_s:
        text = (
            f"could pay at {fmt_tokens(longest.tokens)}: its floor at the disk's probed rate, "
            f"{1000 * best_s:,.0f} ms, is under cold's {1000 * longest.cold_s:,.0f} ms (not measured through the tier)"
        )
        return Breakeven(tier=DISK_TIER, longest_tokens=longest.tokens, limit=what, text=text)
    text = (
        f"does not pay up to {fmt_tokens(longest.tokens)} on this rig: needs {fmt_rate(needed)}, {what} "
        f"{fmt_rate(limits.disk)} (probed with O_DIRECT at the tier's file size; its floor "
        f"{1000 * best_s:,.0f} ms against cold's {1000 * longest.cold_s:,.0f} ms)"
    )
    return Breakeven(
        tier=DISK_TIER,
        longest_tokens=longest.tokens,
        needed_bytes_per_s=needed,
        limit_bytes_per_s=limits.disk,
        limit=what,
        text=text,
    )


class PaysReport(BaseModel):
    """The card's "does the tier pay?" section: per tier its floor and share at each length, and its breakeven."""

    kv_bytes_per_token: Optional[float] = None
    kv_bytes_source: str = ""
    floors: list[TierFloor] = Field(default_factory=list)
    sweep: list[SweepPoint] = Field(default_factory=list)
    breakevens: list[Breakeven] = Field(default_factory=list)


def pays_report(
    points: Sequence[SweepPoint],
    kv_bytes_per_token: Optional[float],
    limits: Optional[RigLimits],
    kv_bytes_source: str = "",
    disk_tier: bool = False,
) -> PaysReport:
    """Floors at every measured point and a breakeven per tier; `disk_tier`: the stack has one, and where no point
    measured it, its verdict comes from the probe (disk_verdict_from_probe)."""
    limits = limits or RigLimits()
    floors = []
    tiers = list(dict.fromkeys(t for p in points for t in p.tiers))
    for point in sorted(points, key=lambda p: p.tokens):
        for tier, tier_s in point.tiers.items():
            if kv_bytes_per_token:
                floors.append(
                    tier_floor(tier, point.tokens, kv_bytes_per_token, point.warm_gpu_s, tier_s, limits, point.cold_s)
                )
    return PaysReport(
        kv_bytes_per_token=kv_bytes_per_token,
        kv_bytes_source=kv_bytes_source,
        floors=floors,
        sweep=list(points),
        breakevens=[b for b in (breakeven(t, points, kv_bytes_per_token, limits) for t in tiers) if b]
        + [
            b
            for b in [disk_verdict_from_probe(points, kv_bytes_per_token, limits)]
            if b and disk_tier and DISK_TIER not in tiers
        ],
    )


def is_finite(value: Optional[float]) -> bool:
    return value is not None and math.isfinite(value)
