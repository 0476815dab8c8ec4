"""The story's rig as a worked example (inventory/ and group_data/dual_3090_qwen36.py): loaded by pyinfra's own
inventory code, it renders the engine command of the field notes, compared flag by flag (order-insensitive,
value-exact) with what vLLM and the LMCache server get once docker-compose and bash have run it."""

import json
import re
import shlex

import pytest
from engine_argv import composed_service, flags, launched_argv, needs_compose
from test_example_fleet import load_hosts

from rigkit.paths import REPO_ROOT
from rigkit.serving.render import L2_CONTAINER_PATH
from rigkit.settings.hostdata import settings_for_host

# ../shared/reference/field-notes.md, "The served stack on a real rig", verbatim ("…" is the notes' own).
FIELD_NOTES_VLLM = (
    "vllm serve … --enable-prefix-caching --mamba-cache-mode align --max-num-batched-tokens 1584 "
    """--kv-transfer-config '{"kv_connector":"LMCacheMPConnector","kv_role":"kv_both"}'"""
)
FIELD_NOTES_LMCACHE = (
    "lmcache server --chunk-size ${LMCACHE_CHUNK_SIZE:-1584} --l1-size-gb ${LMCACHE_L1_GB:-30} "
    """--eviction-policy LRU [--l2-adapter '{"type":"fs","base_path":"/lmcache-kv"}']"""
)
# What the notes' "…" leaves out, as the story states it (the notes' heading, the discussion's card and rig
# lines: Qwen3.6-27B FP8, int8-PTH KV, MTP n=3, 262K, TP=2, util 0.92) and the env the rig ran with (L1=60, L2 on).
STORY_FLAGS = {
    "--tensor-parallel-size": "2",
    "--max-model-len": "262144",
    "--gpu-memory-utilization": "0.92",
    "--kv-cache-dtype": "int8_per_token_head",
    "--speculative-config": '{"method":"mtp","num_speculative_tokens":3}',
}
STORY_ENV = {"LMCACHE_CHUNK_SIZE": "1584", "LMCACHE_L1_GB": "60"}
# The API rigkit serves (its own knobs): not part of the engine command the notes show.
RIGKITS_OWN_FLAGS = {"--served-model-name": "qwen3.6-27b-fp8", "--host": "127.0.0.1", "--port": "8000"}


@pytest.fixture
def story_rig(tmp_path):
    (tmp_path / "inventory").mkdir()
    hosts = load_hosts(REPO_ROOT / "inventory" / "dual_3090_qwen36.py", ["dual_3090_qwen36.py"], tmp_path / "inventory")
    assert list(hosts) == ["rig-qwen36"]
    return settings_for_host(hosts["rig-qwen36"])


def notes_flags(command: str, program_words: int) -> dict:
    """The notes' command line as flags: `${VAR:-default}` read with the story's env, `[optional]` included."""
    command = re.sub(r"\$\{(\w+):-[^}]*\}", lambda match: STORY_ENV[match.group(1)], command)
    return flags(shlex.split(command.replace("[", "").replace("]", ""))[program_words:])


@needs_compose
def test_the_story_rig_renders_the_field_notes_engine_command(tmp_path, story_rig):
    argv = launched_argv(tmp_path, story_rig, programs=("vllm", "lmcache"))
    assert argv["vllm"][:2] == ["serve", "Qwen/Qwen3.6-27B-FP8"]
    rendered = flags(argv["vllm"][2:])
    for flag, value in RIGKITS_OWN_FLAGS.items():
        assert rendered.pop(flag) == value
    expected = {**notes_flags(FIELD_NOTES_VLLM, 3), **STORY_FLAGS}
    # rigkit names the LMCache server's ZMQ port (lmcache_port, the server's default) where the notes left it out
    connector = json.loads(rendered.pop("--kv-transfer-config"))
    assert connector.pop("kv_connector_extra_config") == {"lmcache.mp.port": 5555}
    assert connector == json.loads(expected.pop("--kv-transfer-config"))
    assert rendered == expected


@needs_compose
def test_the_story_rig_renders_the_field_notes_lmcache_server(tmp_path, story_rig):
    server = launched_argv(tmp_path, story_rig, programs=("vllm", "lmcache"))["lmcache"]
    assert server[0] == "server"
    rendered, expected = flags(server[1:]), notes_flags(FIELD_NOTES_LMCACHE, 2)
    # the fs adapter's directory is where rigkit mounts the NVMe's L2 directory in the container
    assert json.loads(rendered.pop("--l2-adapter")) == {
        **json.loads(expected.pop("--l2-adapter")),
        "base_path": L2_CONTAINER_PATH,
    }
    # rigkit's own: the ports as knobs (the notes ran LMCache's defaults) and the HTTP API on the loopback only
    assert rendered.pop("--port") == "5555" and rendered.pop("--http-host") == "127.0.0.1"
    assert rendered.pop("--http-port").isdigit()  # lmcache_http_port (a free port on this machine in the test)
    assert rendered == expected


@needs_compose
def test_the_story_rig_container_limits_and_l2_disk(tmp_path, story_rig):
    service = composed_service(tmp_path, story_rig)
    assert service["mem_limit"] in ("110g", 110_000_000_000) and service["memswap_limit"] == service["mem_limit"]
    assert service["restart"] == "no"  # incubating: a dead cache must not resurrect and fight for the GPUs
    volume = service["volumes"][0]
    assert (volume["source"], volume["target"]) == ("/mnt/rigkit-l2/lmcache", L2_CONTAINER_PATH)  # the NVMe mount
    assert story_rig.knobs["mem_limit_gb"] == 110 and story_rig.l1_gib == 60


def test_the_story_rig_capacity_line_keeps_the_cache_rate_apart_from_the_gpu_rate(story_rig):
    line = story_rig.capacity()
    assert line.startswith("L1 60 GiB: 9x50K 3x128K 1x262K | L2 100 GB: 15x50K 5x128K 2x262K (131 KB/token)")
    assert line.endswith(
        "GPU KV 16.64 KB/token/GPU (int8_per_token_head, TP 2): a 262144-token context needs 4.36 GB/GPU"
    )
