"""Compose v2 beside v1 (issue 11): a Debian 13 rig (docker.io 26, compose v2, the Go plugin) serves the
same release as the Debian 12 rigs (compose v1.29), both compose parsers read rigkit's files back
exactly, and an invalid compose file never takes a serving stack down.

The v2 binary the parser tests run is the rig image's own plugin, copied out by `rigkit lab up`
(a static binary that runs on this Debian 12 controller too).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from test_serving_lab import ledger

from rigkit.facts.docker import ComposeCommand
from rigkit.lab import rig_image
from rigkit.paths import RIG_STACK_DIR
from rigkit.serving.commands import release_commands
from rigkit.serving.render import CONTAINER_NAME, render_compose, render_env
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.knobs import KNOBS_BY_NAME

pytestmark = [pytest.mark.lab]

LMCACHE = {
    "serving_profile": "lmcache-mp",
    "allow_incubating": True,
    "model": "Qwen/Qwen3-8B",
    "l2_enabled": True,
    "serving_image": "lmcache/vllm-openai@sha256:" + "2" * 64,
}
# Values each parser has its own rules for: quotes, backslashes, `#`, `$` (compose interpolation), spaces.
ROUND_TRIP = {
    "served_model_name": "my model # not a comment",
    "hf_token": 'hf_it\'s "quoted" \\ back',
    "model": "/models/$tiny$$ and $HOME",
    "l2_adapter_json": '{"type": "fs", "base_path": "/kv-store/a b", "note": "50% #1"}',
}
# PyYAML (compose v1) keeps the last of two equal keys; compose-go (v2) refuses the file.
DUPLICATE_KEY = "services:\n  serving:\n    image: busybox\n    image: busybox\n"
BROKEN = "services: [\n"


def compose_binaries() -> dict[str, str]:
    return {"v1": shutil.which("docker-compose") or "docker-compose", "v2": str(rig_image.compose_v2_path())}


def compose(version: str, compose_file: Path, *args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key in ("PATH", "HOME", "LANG")}
    return subprocess.run(
        [compose_binaries()[version], "-f", str(compose_file), *args],
        cwd=compose_file.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(params=["v1", "v2"])
def version(request, lab) -> str:
    binary = compose_binaries()[request.param]
    assert Path(binary).exists() or shutil.which(binary), f"compose {request.param} missing: {binary}"
    return request.param


def test_both_compose_versions_read_every_env_value_back_exactly(version, tmp_path):
    settings = settings_for_host({**LMCACHE, **ROUND_TRIP})
    (tmp_path / "compose.yml").write_text(render_compose(settings))
    (tmp_path / ".env").write_text(render_env(settings))
    result = compose(version, tmp_path / "compose.yml", "config")
    assert result.returncode == 0, result.stderr
    environment = yaml.safe_load(result.stdout)["services"]["serving"]["environment"]
    # `config` prints a compose file again, so it writes every `$` in a value as `$$`
    read_back = {key: str(value).replace("$$", "$") for key, value in environment.items()}
    for knob, value in ROUND_TRIP.items():
        assert read_back[KNOBS_BY_NAME[knob].env] == value, (version, knob)


def test_a_duplicated_key_is_a_file_v1_accepts_and_v2_refuses(lab, tmp_path):
    (tmp_path / "compose.yml").write_text(DUPLICATE_KEY)
    assert compose("v1", tmp_path / "compose.yml", "config", "-q").returncode == 0
    refused = compose("v2", tmp_path / "compose.yml", "config", "-q")
    assert refused.returncode != 0 and "already defined" in refused.stderr, refused.stderr


def debian_13_rig(lab):
    rigs = [rig for rig in lab.rigs if rig.distro == "trixie"]
    assert rigs, "the test lab has no Debian 13 rig (RIGKIT_TEST_DISTROS)"
    return rigs[0]


def test_the_debian_13_rig_serves_the_release_with_compose_v2(lab, deployed, rig_exec):
    rig = debian_13_rig(lab)
    assert rig_exec(rig, ". /etc/os-release && echo $VERSION_ID").stdout.strip() == "13"
    assert rig_exec(rig, "docker compose version --short").stdout.strip().startswith("2.")
    assert rig_exec(rig, ComposeCommand().command()).stdout.strip() == "docker compose"
    assert rig_exec(rig, f"docker inspect --format '{{{{.State.Running}}}}' {CONTAINER_NAME}").stdout.strip() == "true"
    latest = ledger(rig, rig_exec)[-1]
    assert (latest["image"], latest["smoke"]) == (lab.serving_image["releases"]["1"], "pass"), latest


@pytest.mark.parametrize(
    "distro, text",
    [("bookworm", BROKEN), ("trixie", BROKEN), ("trixie", DUPLICATE_KEY)],
    ids=["v1-broken", "v2-broken", "v2-duplicate-key"],
)
def test_an_invalid_compose_file_never_stops_the_serving_stack(lab, deployed, rig_exec, distro, text):
    rig = next(rig for rig in lab.rigs if rig.distro == distro and not rig.netns)
    compose_command = rig_exec(rig, ComposeCommand().command()).stdout.strip()
    container = rig_exec(rig, f"docker inspect --format '{{{{.Id}}}}' {CONTAINER_NAME}").stdout.strip()
    rendered = f"{RIG_STACK_DIR}/compose.yml"
    rig_exec(rig, f"cp -p {rendered} {rendered}.kept")
    try:
        rig_exec(rig, f"cat > {rendered} <<'EOF'\n{text}EOF")
        for command in release_commands(compose_command, "unused", False, "http://127.0.0.1:1/v1/models", 5):
            if rig_exec(rig, command, check=False).returncode != 0:  # pyinfra stops at the first failure
                assert command.endswith("config -q"), command
                break
        else:
            pytest.fail("the invalid file was released")
    finally:
        rig_exec(rig, f"mv {rendered}.kept {rendered}")
    assert rig_exec(
        rig, f"docker inspect --format '{{{{.Id}}}} {{{{.State.Running}}}}' {CONTAINER_NAME}"
    ).stdout.split() == [container, "true"]
