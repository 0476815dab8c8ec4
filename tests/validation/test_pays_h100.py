"""Issue 42 on an H100 (bench/gpu/pays.py, 2026-12-06; vLLM 0.26.0, LMCache 0.5.3, a Qwen3-8B shape with dummy
weights: 144 KiB of KV per token): the rig probe and every profile's CPU tier at 8K, 16K and 32K tokens (3 sessions
each), then candidate settings at 32K, judged again here with rigkit.validation.pays from what the device recorded.

Held: the probe's figures; each CPU tier's share of the pinned link at 32K (rigkit's renderings of native-offload and
native-tiered >= 75 %; LMCache at chunk 256 74 %, flagged, at chunk 1024 94 %: the default moved to 1024); where each
CPU tier pays; the disk tier's verdict from the probe ("does not pay up to 32K ... needs 3.9 GB/s, the disk gives
1.2 GB/s"); every request labelled by its counters as the tier it was sent for.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigkit.settings.hostdata import settings_for_host
from rigkit.validation.pays import CPU_TIER, DISK_TIER, SHARE_MIN, RigLimits, pays_report
from rigkit.validation.pays_sweep import PointRecord

CAPTURE = Path(__file__).parents[1] / "fixtures" / "gpu-h100-vllm0.26" / "pays-2026-12-06" / "pays.json"
RECORDED = json.loads(CAPTURE.read_text())
LIMITS = RigLimits.from_probe(RECORDED["limits"])
KV_PER_TOKEN = RECORDED["kv_bytes_per_token"]
DISK_STACKS = {"native-tiered"}
DIGEST = "@sha256:" + "0" * 64


def report(name: str):
    entry = RECORDED["stacks"][name]
    points = [PointRecord(p["tokens"], p["ttft_s"], p["labels"], p["fillers_sent"]).point() for p in entry["points"]]
    return pays_report([p for p in points if p], KV_PER_TOKEN, LIMITS, "Qwen3-8B shape", disk_tier=name in DISK_STACKS)


def share_at(name: str, tokens: int) -> float:
    (floor,) = [f for f in report(name).floors if f.tier == CPU_TIER and f.tokens == tokens]
    return floor.share


def test_the_probe_read_the_h100s_link_and_disk():
    assert [(g.name, g.pcie_gen, g.pcie_width) for g in LIMITS.gpus] == [("NVIDIA H100 80GB HBM3", 5, 16)]
    assert LIMITS.pinned == pytest.approx(54.2e9, rel=0.01) and LIMITS.pageable == pytest.approx(5.4e9, rel=0.01)
    assert LIMITS.disk == pytest.approx(1.24e9, rel=0.01) and LIMITS.disk_single_thread < LIMITS.disk
    assert KV_PER_TOKEN == 36 * 8 * 128 * 2 * 2


def test_every_request_was_served_by_the_tier_it_was_sent_for():
    for name, entry in RECORDED["stacks"].items():
        for point in entry["points"]:
            for tier, labels in point["labels"].items():
                assert labels == [tier] * 3, (name, point["tokens"], tier, labels)
        assert entry["errors"] == []


@pytest.mark.parametrize(
    "name, share",
    [("native-offload", 0.83), ("native-tiered", 0.84), ("lmcache-mp", 0.74), ("lmcache-mp-chunk1024", 0.94)],
)
def test_each_cpu_tier_against_the_pinned_link_at_32k(name, share):
    assert share_at(name, 32000) == pytest.approx(share, abs=0.01)
    flagged = [f.flag for f in report(name).floors if f.tokens == 32000 and f.tier == CPU_TIER][0]
    assert bool(flagged) is (share < SHARE_MIN)


def test_the_candidates_native_offloads_block_size_does_not_win_and_lmcaches_chunk_1024_does():
    """Block 64: 85 % against the rendering's 83 % (within one run's noise); 256: 62 %. LMCache's chunk 1024: 94 %
    against 256's 74 %: the lmcache-mp profile's chunk_size is 1024 since (profiles.yaml says why)."""
    assert share_at("native-offload-block64", 32000) - share_at("native-offload", 32000) < 0.05
    assert share_at("native-offload-block256", 32000) < share_at("native-offload", 32000)
    assert share_at("lmcache-mp-chunk1024", 32000) > SHARE_MIN > share_at("lmcache-mp", 32000)
    lmcache = settings_for_host(
        {
            "serving_profile": "lmcache-mp",
            "serving_image": "lmcache/vllm-openai" + DIGEST,
            "allow_incubating": True,
            "model": "m",
        }
    )
    assert lmcache.knobs["chunk_size"] == 1024 and lmcache.store_chunk_tokens == 1024


@pytest.mark.parametrize("name", ["native-offload", "native-tiered", "lmcache-mp"])
def test_every_cpu_tier_pays_from_8k_tokens(name):
    (verdict,) = [b for b in report(name).breakevens if b.tier == CPU_TIER]
    assert verdict.pays_from_tokens == 8000 and verdict.text == "pays from 8K tokens (the shortest length measured)"


def test_the_disk_tier_does_not_pay_on_this_machine_and_says_the_rate_it_would_need():
    (verdict,) = [b for b in report("native-tiered").breakevens if b.tier == DISK_TIER]
    assert verdict.pays_from_tokens is None
    assert verdict.text.startswith("does not pay up to 32K on this rig: needs 3.9 GB/s, the disk gives 1.2 GB/s")
    assert not [b for b in report("native-offload").breakevens if b.tier == DISK_TIER]  # it has no disk tier
