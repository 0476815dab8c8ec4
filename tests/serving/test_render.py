"""compose.yml and .env rendering, checked with the real docker-compose (v1.29 here)."""

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from engine_argv import SHIM, free_port, run_entrypoint, start_entrypoint

from rigkit.errors import ConfigError, PreflightError
from rigkit.paths import PROFILES_FILE
from rigkit.serving.commands import rendering_for
from rigkit.serving.render import (
    L2_CONTAINER_PATH,
    compose_argv,
    detect_compose_command,
    dotenv_line,
    env_values,
    render_compose,
    render_env,
)
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.knobs import KNOBS_BY_NAME
from rigkit.settings.profiles import ab_pair, load_profiles, parse_profiles

IMAGES = {
    "cpu-lab": "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64,
    "lmcache-mp": "lmcache/vllm-openai@sha256:" + "2" * 64,
    "lmcache-mp-baseline": "lmcache/vllm-openai@sha256:" + "2" * 64,
    "native-offload": "vllm/vllm-openai@sha256:" + "3" * 64,
    "prefix-only": "vllm/vllm-openai@sha256:" + "3" * 64,
    "native-tiered": "vllm/vllm-openai@sha256:" + "4" * 64,
    "native-tiered-baseline": "vllm/vllm-openai@sha256:" + "4" * 64,
}
DOCKER_COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(
    DOCKER_COMPOSE is None, reason="docker-compose not installed (bin/setup installs it)"
)


def data_for(profile: str, **knobs) -> dict:
    return {
        "serving_profile": profile,
        "serving_image": IMAGES[profile],
        "allow_incubating": True,
        "model": "/models/tiny" if profile == "cpu-lab" else "Qwen/Qwen3-8B",
        **knobs,
    }


def settings(profile: str, **knobs):
    return settings_for_host(data_for(profile, **knobs), variables=[])


def write_stack(directory: Path, s) -> Path:
    compose = directory / "compose.yml"
    compose.write_text(render_compose(s))
    (directory / ".env").write_text(render_env(s))
    return compose


def compose_config(compose: Path) -> dict:
    """What docker-compose itself reads from the rendered files (no host env leaking in)."""
    env = {key: value for key, value in os.environ.items() if key in ("PATH", "HOME", "LANG")}
    result = subprocess.run(
        [DOCKER_COMPOSE, "-f", str(compose), "config"],
        cwd=compose.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    service = yaml.safe_load(result.stdout)["services"]["serving"]
    # `config` prints a compose file again, so it escapes every `$` in a value as `$$`
    service["environment"] = {key: str(value).replace("$$", "$") for key, value in service["environment"].items()}
    return service


def rendered(s) -> dict:
    return yaml.safe_load(render_compose(s))


@pytest.fixture(params=sorted(IMAGES))
def profile_name(request):
    return request.param


def test_rendered_compose_shape(profile_name):
    s = settings(profile_name, l2_enabled=True)
    document = rendered(s)
    assert set(document) == {"services"}  # no `version:`: the compose spec both v1.29 and v2 read
    service = document["services"]["serving"]
    assert service["image"] == IMAGES[profile_name] and "@sha256:" in service["image"]
    assert service["network_mode"] == "host" and service["ipc"] == "host" and service["init"] is True
    assert service["mem_limit"] == service["memswap_limit"] == f"{s.knobs['mem_limit_gb']}g"
    assert "shm_size" not in service  # ipc: host: the container's /dev/shm is the rig's (Docker ignores shm_size)
    assert service["labels"] == {
        "org.rigkit.stack": "serving",
        "org.rigkit.profile": profile_name,
        "org.rigkit.knobs-hash": s.knobs_hash,
    }
    assert service["restart"] == s.knobs["restart_policy"]
    declared = {line.split("=", 1)[0] for line in service["environment"]}
    assert set(env_values(s)) <= declared
    assert {KNOBS_BY_NAME[name].env for name in s.profile.env_knobs} == set(env_values(s))
    if s.profile.needs_gpus:
        device = service["deploy"]["resources"]["reservations"]["devices"][0]
        assert device["driver"] == "nvidia" and device["count"] == "all"
    else:
        assert "deploy" not in service
    if s.l2_active:
        # long syntax: a missing source (an L2 disk that did not mount) fails instead of being created
        assert service["volumes"] == [{"type": "bind", "source": s.knobs["l2_path"], "target": L2_CONTAINER_PATH}]
    else:
        assert "volumes" not in service


def test_gpu_mask_becomes_device_ids():
    service = rendered(settings("native-offload", gpu_mask="2,3"))["services"]["serving"]
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["2", "3"]


def test_bind_address_defaults_to_loopback_and_knob_changes_it():
    assert env_values(settings("cpu-lab"))["RIGKIT_BIND_ADDRESS"] == "127.0.0.1"
    assert env_values(settings("cpu-lab", bind_address="0.0.0.0"))["RIGKIT_BIND_ADDRESS"] == "0.0.0.0"


def test_l2_mount_follows_the_knob_for_optional_profiles():
    assert "volumes" not in rendered(settings("lmcache-mp"))["services"]["serving"]
    s = settings("lmcache-mp", l2_enabled=True, l2_path="/mnt/nvme-kv")
    assert rendered(s)["services"]["serving"]["volumes"] == [
        {"type": "bind", "source": "/mnt/nvme-kv", "target": "/kv-store"}
    ]
    assert env_values(s)["LMCACHE_L2_ADAPTER"] == '{"type":"fs","base_path":"/kv-store"}'


def test_connector_config_filled_from_knobs():
    script = rendered(settings("native-offload", l1_size_gb=40))["services"]["serving"]["command"][0]
    assert '"cpu_bytes_to_use":42949672960' in script  # 40 GiB
    script = rendered(settings("cpu-lab"))["services"]["serving"]["command"][0]
    assert '"shared_storage_path":"/kv-store"' in script


def test_native_offload_gets_the_bytes_lmcache_allocates_for_the_same_l1():
    # lmcache v1/distributed/config.py: --l1-size-gb N allocates N * 2^30 bytes; an A/B of the two stacks at
    # one l1_size_gb must compare equal cache sizes
    lmcache = settings("lmcache-mp", l1_size_gb=60)
    native = rendered(settings("native-offload", l1_size_gb=60))["services"]["serving"]["command"][0]
    assert env_values(lmcache)["LMCACHE_L1_GB"] == "60"
    assert f'"cpu_bytes_to_use":{60 * 2**30}' in native and lmcache.l1_bytes == 60 * 2**30


def test_ab_pair_renders_differ_only_in_the_connector():
    profiles = load_profiles()
    with_connector, without = ab_pair(profiles, "native-offload")
    a = rendered(settings(with_connector.name))["services"]["serving"]
    b = rendered(settings(without.name))["services"]["serving"]
    differing = {key for key in a if a[key] != b.get(key)}
    assert differing == {"labels", "command", "environment"}
    assert re.sub(r" \\\n  --kv-transfer-config '[^']*'", "", a["command"][0]) == b["command"][0]
    assert set(a["environment"]) - set(b["environment"]) == {"LMCACHE_L1_GB=${LMCACHE_L1_GB:-}"}


@needs_compose
def test_every_profile_passes_docker_compose_config(tmp_path, profile_name):
    s = settings(profile_name, l2_enabled=True, gpu_mask="" if profile_name == "cpu-lab" else "0,1")
    service = compose_config(write_stack(tmp_path, s))
    assert service["image"] == IMAGES[profile_name]
    assert {key: str(value) for key, value in service["environment"].items() if key in env_values(s)} == env_values(s)
    assert service["mem_limit"] == service["memswap_limit"]


ROUND_TRIP = {
    "served_model_name": "my model # not a comment",
    "hf_token": 'hf_it\'s "quoted" \\ back',
    "model": "/models/$tiny$$ and $HOME",
    "l2_adapter_json": '{"type": "fs", "base_path": "/kv-store/a b", "note": "50% #1"}',
}


@needs_compose
def test_env_values_read_back_exactly_by_docker_compose(tmp_path):
    s = settings("lmcache-mp", l2_enabled=True, **ROUND_TRIP)
    service = compose_config(write_stack(tmp_path, s))
    for knob, value in ROUND_TRIP.items():
        assert service["environment"][KNOBS_BY_NAME[knob].env] == value, knob


@needs_compose
def test_shell_env_does_not_leak_into_a_clean_config(tmp_path):
    s = settings("cpu-lab")
    service = compose_config(write_stack(tmp_path, s))
    assert service["environment"]["HF_TOKEN"] == ""


def test_dotenv_line_quoting():
    assert dotenv_line("A", "x y") == "A='x y'"
    assert dotenv_line("A", "it's") == 'A="it\'s"'
    assert dotenv_line("A", "a\\b\"c'") == 'A="a\\\\b\\"c\'"'
    for bad in ("${HOME}", "a\nb", "it's $5"):
        with pytest.raises(ConfigError) as caught:
            dotenv_line("A", bad, "model")
        assert caught.value.field == "model"


def test_env_file_holds_every_declared_value_and_nothing_else():
    s = settings("lmcache-mp", hf_token="hf_abc")
    lines = [line for line in render_env(s).splitlines() if line and not line.startswith("#")]
    assert [line.split("=", 1)[0] for line in lines] == list(env_values(s))
    assert "HF_TOKEN='hf_abc'" in lines and "hf_abc" not in render_compose(s)


def test_detect_compose_command():
    assert detect_compose_command(True, "/usr/bin/docker-compose") == "docker compose"
    assert detect_compose_command(False, "/usr/bin/docker-compose") == "docker-compose"
    assert detect_compose_command(False, None) is None
    assert compose_argv("docker compose") == ["docker", "compose"]
    assert compose_argv("docker-compose") == ["docker-compose"]
    with pytest.raises(PreflightError):
        compose_argv(None)


def option(argv: list[str], flag: str):
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_cpu_lab_entrypoint_launches_what_the_knobs_say(tmp_path):
    argv = run_entrypoint(tmp_path, settings("cpu-lab", serving_port=8101, num_gpu_blocks_override=72))["python"]
    assert argv[:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "/models/tiny"]
    assert option(argv, "--served-model-name") == "tiny" and option(argv, "--port") == "8101"
    assert option(argv, "--host") == "127.0.0.1" and option(argv, "--max-model-len") == "8192"
    assert option(argv, "--num-gpu-blocks-override") == "72"
    assert json.loads(option(argv, "--kv-transfer-config"))["kv_connector_extra_config"] == {
        "shared_storage_path": "/kv-store"
    }


def test_unset_optional_engine_args_are_left_out(tmp_path):
    argv = run_entrypoint(tmp_path, settings("prefix-only"))["vllm"]
    assert argv[:2] == ["serve", "Qwen/Qwen3-8B"]
    assert "--num-gpu-blocks-override" not in argv and "--max-model-len" not in argv
    assert "--kv-transfer-config" not in argv and "--enable-prefix-caching" in argv


@pytest.mark.parametrize("l2", [False, True])
def test_lmcache_server_gets_the_knobs(tmp_path, l2):
    port = free_port()
    argvs = run_entrypoint(
        tmp_path,
        settings(
            "lmcache-mp", l1_size_gb=60, chunk_size=1584, l2_enabled=l2, lmcache_port=6555, lmcache_http_port=port
        ),
    )
    server = argvs["lmcache"]
    assert server[0] == "server" and option(server, "--l1-size-gb") == "60"
    assert option(server, "--port") == "6555" and option(server, "--http-port") == str(port)
    assert option(server, "--http-host") == "127.0.0.1"  # its HTTP API is for the rig (and the tunnel) only
    extra = json.loads(option(argvs["vllm"], "--kv-transfer-config"))["kv_connector_extra_config"]
    assert extra == {"lmcache.mp.port": 6555}
    assert option(server, "--chunk-size") == "1584"
    assert option(server, "--l2-adapter") == ('{"type":"fs","base_path":"/kv-store"}' if l2 else None)
    assert json.loads(option(argvs["vllm"], "--kv-transfer-config"))["kv_connector"] == "LMCacheMPConnector"


UNICODE_ROUND_TRIP = {
    "served_model_name": "line\u2028para\u2029next\x85feed\x0cvt\x0bfs\x1cend",
    "model": "/models/\U0001f600 caf\u00e9 \u00a0nbsp",
    "l2_adapter_json": '{"path": "/kv/\U0001f600\u2028"}',
}


@needs_compose
def test_unicode_values_and_paths_read_back_exactly_by_docker_compose(tmp_path):
    path = "/mnt/kv-\U0001f600-caf\u00e9"
    s = settings("lmcache-mp", l2_enabled=True, l2_path=path, **UNICODE_ROUND_TRIP)
    compose = render_compose(s)
    assert "\\ud83d" not in compose  # no surrogate-pair escapes: PyYAML reads them back as two broken characters
    service = compose_config(write_stack(tmp_path, s))
    assert service["volumes"][0]["source"] == path
    for knob, value in UNICODE_ROUND_TRIP.items():
        assert service["environment"][KNOBS_BY_NAME[knob].env] == value, knob


def test_rigkits_own_env_reader_agrees_on_line_separators():
    from rigkit.serving.ledger import parse_dotenv

    s = settings("lmcache-mp", l2_enabled=True, **UNICODE_ROUND_TRIP)
    values = parse_dotenv(render_env(s))
    assert {env: values[env] for env in env_values(s)} == env_values(s)


@pytest.mark.parametrize("profile", sorted(load_profiles()))
def test_every_profile_turns_usage_reporting_off(profile):
    # LMCache reports usage unless LMCACHE_TRACK_USAGE=false or DO_NOT_TRACK=1; vLLM unless VLLM_NO_USAGE_STATS=1
    environment = rendered(settings(profile))["services"]["serving"]["environment"]
    assert {"VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1"} <= set(environment)
    if load_profiles()[profile].needs_gpus:  # images that may carry LMCache
        assert "LMCACHE_TRACK_USAGE=false" in environment


def test_a_profile_cannot_turn_telemetry_back_on():
    text = PROFILES_FILE.read_text().replace(
        'fixed_env: {HF_HUB_OFFLINE: "1"', 'fixed_env: {DO_NOT_TRACK: "0", HF_HUB_OFFLINE: "1"'
    )
    with pytest.raises(ConfigError) as caught:
        parse_profiles(text)
    assert "profiles.cpu-lab.fixed_env" in caught.value.field and "DO_NOT_TRACK" in caught.value.problem


def test_a_cache_server_that_dies_at_start_stops_the_stack_before_vllm_starts(tmp_path):
    # vLLM would wait up to 300 s (lmcache.mp.mq_timeout) for a server that is gone
    s = settings("lmcache-mp", lmcache_http_port=free_port())
    started = time.monotonic()
    result = start_entrypoint(tmp_path, s, LMCACHE_SHIM_LIVES_S="0")
    assert result.returncode == 1 and time.monotonic() - started < 10
    assert "lmcache shim: failed to start" in result.stderr  # its own message: the container's log tail
    assert "lmcache server exited before its /healthcheck answered" in result.stderr
    assert not (tmp_path / "argv.vllm").exists()


def test_a_cache_server_that_dies_under_vllm_stops_the_stack(tmp_path):
    s = settings("lmcache-mp", lmcache_http_port=free_port())
    vllm_serving = SHIM + "exec sleep 25\n"  # a process that ends on SIGTERM, as vLLM does
    started = time.monotonic()
    result = start_entrypoint(tmp_path, s, vllm_shim=vllm_serving, LMCACHE_SHIM_LIVES_S="3")
    assert result.returncode != 0 and time.monotonic() - started < 15
    assert (tmp_path / "argv.vllm").exists()  # vLLM started once the health check answered
    assert "exited: stopping the stack" in result.stderr


def test_native_tiered_writes_its_disk_tier_on_the_l2_mount_with_a_fixed_hash_seed():
    # the kv_transfer_config of the H200 capture (tests/fixtures/gpu-h200-vllm0.26/native-tiered-eager), with the
    # L2 mount as root_dir and L1 in GiB; PYTHONHASHSEED fixed, or the disk tier never hits after a restart
    s = settings("native-tiered", l1_size_gb=2)
    service = rendered(s)["services"]["serving"]
    config = json.loads(re.search(r"--kv-transfer-config '(.*)'", service["command"][0]).group(1))
    assert config == {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 2 * 2**30,
            "secondary_tiers": [{"type": "fs", "root_dir": "/kv-store"}],
        },
    }
    # the seed is the kv_hash_seed knob, declared once (fleet-wide), read from .env like every knob
    assert rendering_for(s).container_env()["PYTHONHASHSEED"] == "0"
    assert (
        rendering_for(settings("native-tiered", l1_size_gb=2, kv_hash_seed=7)).container_env()["PYTHONHASHSEED"] == "7"
    )
    assert service["volumes"] == [{"type": "bind", "source": s.knobs["l2_path"], "target": "/kv-store"}]
    assert s.profile.connector.l2_needs_janitor and s.l2_active
    baseline = rendered(settings("native-tiered-baseline", l1_size_gb=2))["services"]["serving"]
    baseline_env = rendering_for(settings("native-tiered-baseline", l1_size_gb=2)).container_env()
    assert baseline_env["PYTHONHASHSEED"] == "0" and "--kv-transfer-config" not in baseline["command"][0]


def test_lmcache_fs_l2_renders_no_checksum_option_and_the_card_setup_says_so():
    """LMCache 0.5.3's fs L2 adapter reads no checksum option (FSL2AdapterConfig.from_dict: base_path,
    relative_tmp_dir, read_ahead_size, use_odirect): rendering one would be ignored without a word. The card's setup
    says the L2 files are unguarded instead; stacks without an LMCache fs L2 say nothing."""
    import json as _json

    from rigkit.serving.render import FS_L2_INTEGRITY, default_l2_adapter, l2_integrity
    from rigkit.settings.hostdata import settings_for_host as _settings
    from rigkit.validation.card import RigCard
    from rigkit.validation.card.rig import render_rig_markdown

    base = {
        "serving_profile": "lmcache-mp",
        "allow_incubating": True,
        "model": "m",
        "serving_image": "lmcache/vllm-openai@sha256:" + "3" * 64,
    }
    assert _json.loads(default_l2_adapter()) == {"type": "fs", "base_path": "/kv-store"}
    with_l2 = _settings({**base, "l2_enabled": True})
    assert l2_integrity(with_l2) == FS_L2_INTEGRITY and "no checksum" in FS_L2_INTEGRITY
    assert l2_integrity(_settings(base)) is None
    valkey = _settings({**base, "l2_enabled": True, "l2_adapter_json": {"type": "valkey", "host": "h", "port": 1}})
    assert l2_integrity(valkey) is None
    card = RigCard(rig="r", run_id="x")
    card.repro.l2_integrity = l2_integrity(with_l2)
    assert f"| L2 integrity | {FS_L2_INTEGRITY} |" in render_rig_markdown(card)
