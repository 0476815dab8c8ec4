"""compose.yml and .env rendering, checked with the real docker-compose (v1.29 here)."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from rigkit.errors import ConfigError, PreflightError
from rigkit.hostdata import settings_for_host
from rigkit.knobs import KNOBS_BY_NAME
from rigkit.profiles import ab_pair, load_profiles
from rigkit.render import (L2_CONTAINER_PATH, compose_argv, detect_compose_command, dotenv_line, env_values,
                           render_compose, render_env)

IMAGES = {"cpu-lab": "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64,
          "lmcache-mp": "lmcache/vllm-openai@sha256:" + "2" * 64,
          "lmcache-mp-baseline": "lmcache/vllm-openai@sha256:" + "2" * 64,
          "native-offload": "vllm/vllm-openai@sha256:" + "3" * 64,
          "prefix-only": "vllm/vllm-openai@sha256:" + "3" * 64}
DOCKER_COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(DOCKER_COMPOSE is None, reason="docker-compose not installed (bin/setup installs it)")


def data_for(profile: str, **knobs) -> dict:
    return {"serving_profile": profile, "serving_image": IMAGES[profile], "allow_incubating": True,
            "model": "/models/tiny" if profile == "cpu-lab" else "Qwen/Qwen3-8B", **knobs}


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
    result = subprocess.run([DOCKER_COMPOSE, "-f", str(compose), "config"], cwd=compose.parent, env=env,
                            capture_output=True, text=True, timeout=60)
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
    assert int(service["shm_size"].rstrip("g")) >= s.l1_gb
    assert service["labels"] == {"org.rigkit.stack": "serving", "org.rigkit.profile": profile_name,
                                 "org.rigkit.knobs-hash": s.knobs_hash}
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
        assert service["volumes"] == [f"{s.knobs['l2_path']}:{L2_CONTAINER_PATH}"]
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
    assert rendered(s)["services"]["serving"]["volumes"] == ["/mnt/nvme-kv:/kv-store"]
    assert env_values(s)["LMCACHE_L2_ADAPTER"] == '{"type":"fs","base_path":"/kv-store"}'


def test_connector_config_filled_from_knobs():
    script = rendered(settings("native-offload", l1_size_gb=40))["services"]["serving"]["command"][0]
    assert '"cpu_bytes_to_use":40000000000' in script
    script = rendered(settings("cpu-lab"))["services"]["serving"]["command"][0]
    assert '"shared_storage_path":"/kv-store"' in script


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
    "hf_token": "hf_it's \"quoted\" \\ back",
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
    assert dotenv_line("A", 'a\\b"c\'') == 'A="a\\\\b\\"c\'"'
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
