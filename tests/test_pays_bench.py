"""bench/gpu/pays.py (issue 42's device run): what it renders, how it sets native offload's block size, and how it
judges a point; its plumbing (start, probe, sweep, stop) runs on the dry-run engine (bench/gpu/README.md)."""

import json
import sys

import pytest

from rigkit.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench" / "gpu"))

import pays  # noqa: E402

from rigkit.validation.pays import RigLimits  # noqa: E402


def test_kv_per_token_is_the_issues_144_kib():
    assert pays.KV_BYTES_PER_TOKEN == 144 * 1024


def test_offload_block_goes_into_the_connector_config():
    script = """--kv-transfer-config '{"kv_connector":"OffloadingConnector","kv_connector_extra_config":{"cpu_bytes_to_use":1}}'"""
    out = pays.with_offload_block(script, 256)
    config = json.loads(out.split("'")[1])
    assert config["kv_connector_extra_config"] == {"block_size": 256, "cpu_bytes_to_use": 1}
    with pytest.raises(ValueError):
        pays.with_offload_block("vllm serve m", 64)


def test_render_every_case_with_rigkits_own_rendering(tmp_path):
    out = tmp_path / "stacks-pays.json"
    pays.render(out)
    rendered = json.loads(out.read_text())
    stacks = {s["case"]: s for s in rendered["stacks"]}
    assert set(stacks) == set(pays.CASES)
    assert {s["round"] for s in stacks.values()} == {1, 2}
    assert len({s["port"] for s in stacks.values()}) == len(stacks)
    assert len({s["lmcache_http_port"] for s in stacks.values() if s["lmcache_http_port"]}) == 2
    assert '"block_size":256,' in stacks["native-offload-block256"]["script"]
    assert "block_size" not in stacks["native-offload"]["script"]  # round 1 is rigkit's rendering as it is
    assert stacks["lmcache-mp-chunk256"]["env"]["LMCACHE_CHUNK_SIZE"] == "256"
    assert stacks["lmcache-mp"]["env"]["LMCACHE_CHUNK_SIZE"] == str(pays.LMCACHE_CHUNK_TOKENS)
    for stack in stacks.values():
        assert "--load-format=dummy" in stack["script"]
        assert stack["env"]["RIGKIT_MAX_MODEL_LEN"] == str(pays.PAYS_KNOBS["max_model_len"])
        assert max(stack["lengths"]) + 16 + 64 <= pays.PAYS_KNOBS["max_model_len"]
    # the GPU pool holds one longest session, no more: the fillers that evict it stay small
    pool = pays.PAYS_KNOBS["num_gpu_blocks_override"] * pays.GPU_BLOCK_TOKENS
    assert max(pays.LENGTHS) < pool < 1.25 * max(pays.LENGTHS)
    # the session and the fillers that evict it (2 x 32K) fit below LMCache's 80 % watermark of the CPU tier
    cpu_tier = pays.PAYS_KNOBS["l1_size_gb"] * 2**30
    assert 3 * max(pays.LENGTHS) * pays.KV_BYTES_PER_TOKEN < 0.8 * cpu_tier


def test_model_dir_has_the_8b_shape_and_the_test_tokenizer(tmp_path):
    pays.write_model(tmp_path, pays.QWEN3_8B)
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["num_hidden_layers"], config["num_key_value_heads"], config["head_dim"]) == (36, 8, 128)
    assert (tmp_path / "tokenizer.json").is_file()


def test_probe_command_reads_the_tiers_file_sizes(tmp_path):
    command = pays.probe_command(tmp_path, pays.KV_BYTES_PER_TOKEN)
    sizes = command[command.index("--file-bytes") + 1]
    assert sizes == f"{16 * 147456},{1024 * 147456}"  # the lmcache-mp profile's chunk
    assert command[command.index("--threads") + 1] == "1,16"
    assert "--gpu" in command


def test_a_point_is_judged_against_the_probe():
    entry = {
        "points": [
            {
                "tokens": 32000,
                "ttft_s": {"cold": [1.35, 1.36], "warm-gpu": [0.18], "warm-connector": [0.33, 0.34]},
                "labels": {"cold": ["cold", "cold"], "warm-gpu": ["warm-gpu"], "warm-connector": ["warm-connector"]},
                "fillers_sent": 4,
            }
        ]
    }
    limits = RigLimits.from_probe({"gpus": [{"index": 0, "h2d": {"pinned": {"bulk": 55e9}}}]})
    pays.report_of(entry, pays.KV_BYTES_PER_TOKEN, limits)
    report = entry.pop("report_model")
    assert entry["cpu_tier_share"]["32000"] == pytest.approx(0.55, abs=0.02)
    assert report.floors[0].flag
    lines = pays.summary_lines("native-offload", report, limits)
    assert "native-offload: 32000 tokens warm-connector" in lines[0] and "FLAG" in lines[0]
    assert lines[-1] == "native-offload: warm-connector: pays from 32K tokens (the shortest length measured)"
