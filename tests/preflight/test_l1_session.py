"""The L1 gate of issue 42 (rigkit.preflight.l1_session) and the eviction rules it counts with
(rigkit.settings.eviction)."""

import pytest

from rigkit.preflight.l1_session import check_l1_session
from rigkit.settings.eviction import LMCACHE_L1, VLLM_LRU, rule_for
from rigkit.settings.hostdata import rig_settings

DIGEST = "@sha256:" + "0" * 64
QWEN3_8B = {"model_attention_layers": 36, "model_kv_heads": 8, "model_head_dim": 128}  # 144 KiB/token


def settings(profile, image, **data):
    return rig_settings(
        {
            "serving_profile": profile,
            "serving_image": image + DIGEST,
            "allow_incubating": True,
            "model": "Qwen/Qwen3-8B",
            **QWEN3_8B,
            **data,
        }
    ).stack


def test_lmcache_rule_frees_a_fifth_once_four_fifths_full():
    kept, fits = LMCACHE_L1.sessions(30 * 2**30, 32000 * 147456)
    assert fits == pytest.approx(0.8 * 32212254720 / 4718592000)
    assert kept == pytest.approx(0.6 * 32212254720 / 4718592000)
    assert VLLM_LRU.sessions(10, 5) == (2.0, 2.0)
    assert rule_for("LMCacheMPConnector") is LMCACHE_L1 and rule_for("ExampleConnector") is None


def test_an_l1_below_one_long_session_is_warned_with_the_size_that_holds_it():
    # 262,144 tokens x 144 KiB = 38.7 GB: LMCache's 30 GiB fills to 80 % (25.8 GB) and evicts
    findings = check_l1_session(
        settings("lmcache-mp", "lmcache/vllm-openai", max_model_len=262144, kv_bytes_per_token=147456, l1_size_gb=30)
    )
    assert [f.level for f in findings] == ["warn"]
    assert "cannot hold one 262,144-token session (38.7 GB" in findings[0].message
    assert findings[0].fix == "set l1_size_gb to at least 45 (GiB), or a lower max_model_len"


def test_native_offload_uses_its_whole_cpu_tier():
    # 38.7 GB in 40 GiB (42.9 GB): vLLM's LRU has no watermark, LMCache's 80 % would not hold it
    native = settings("native-offload", "vllm/vllm-openai", max_model_len=262144, l1_size_gb=40)
    assert check_l1_session(native) == []
    lmcache = settings(
        "lmcache-mp", "lmcache/vllm-openai", max_model_len=262144, kv_bytes_per_token=147456, l1_size_gb=40
    )
    assert check_l1_session(lmcache)


def test_nothing_to_say_without_a_cpu_tier_or_a_length():
    assert check_l1_session(settings("prefix-only", "vllm/vllm-openai", max_model_len=262144)) == []
    assert check_l1_session(settings("native-offload", "vllm/vllm-openai")) == []
