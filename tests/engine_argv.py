"""What the serving container would launch, without a container: docker-compose reads the rendered compose.yml
and .env (`config`: its own interpolation and `$$` unescaping), bash runs the resulting command with the
resulting environment, and shim programs (vllm, lmcache) record the argv they get."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from rigkit.serving.render import entrypoint_script, env_values, render_compose, render_env

DOCKER_COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(
    DOCKER_COMPOSE is None, reason="docker-compose not installed (bin/setup installs it)"
)

SHIM = """#!/bin/bash
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$ARGV_LOG.$(basename "$0")"
"""
# `lmcache server`, a Python script as pip installs it: records its argv (as the program sees it, in
# $ARGV_LOG.lmcache) and its command line (as ps shows it, in $ARGV_LOG.lmcache.cmdline), then answers /healthcheck
# on its --http-port until the engine's shim has started (its $ARGV_LOG.vllm or $ARGV_LOG.python exists), at most
# 5 s (two Python starts on a loaded 2-core host took over 2); for LMCACHE_SHIM_LIVES_S seconds when that is set,
# or exits at once with LMCACHE_SHIM_LIVES_S=0, as a server that fails to start. The entrypoint's watcher of the
# server (and so the run that captures its output) ends only after the server has exited.
LMCACHE_SHIM = """#!/usr/bin/python3
import http.server, json, os, sys, threading, time
log = os.environ["ARGV_LOG"] + ".lmcache"
with open("/proc/self/cmdline", "rb") as cmdline, open(log + ".cmdline", "a") as out:
    out.write(json.dumps(cmdline.read().decode().rstrip("\\0").split("\\0")) + "\\n")
with open(log, "a") as out:
    out.write(json.dumps(sys.argv[1:]) + "\\n")
if os.environ.get("LMCACHE_SHIM_LIVES_S", "5") == "0":
    sys.exit("lmcache shim: failed to start")
port = int(sys.argv[sys.argv.index("--http-port") + 1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/healthcheck" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", port), Health)
def until_the_engine_started():
    engine = [os.environ["ARGV_LOG"] + "." + name for name in ("vllm", "python")]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(os.path.exists(path) for path in engine):
        time.sleep(0.05)
    server.shutdown()
if "LMCACHE_SHIM_LIVES_S" in os.environ:
    threading.Timer(float(os.environ["LMCACHE_SHIM_LIVES_S"]), server.shutdown).start()
else:
    threading.Thread(target=until_the_engine_started).start()
server.serve_forever()
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def composed_service(directory: Path, settings) -> dict:
    """The serving service as docker-compose itself reads the rendered files (no host env leaking in)."""
    (directory / "compose.yml").write_text(render_compose(settings))
    (directory / ".env").write_text(render_env(settings))
    env = {key: value for key, value in os.environ.items() if key in ("PATH", "HOME", "LANG")}
    result = subprocess.run(
        [DOCKER_COMPOSE, "-f", "compose.yml", "config"],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    service = yaml.safe_load(result.stdout)["services"]["serving"]
    # `config` prints a compose file again, escaping every `$` as `$$`: undo that to get what the container gets
    unescape = lambda text: str(text).replace("$$", "$")  # noqa: E731
    environment = service["environment"]
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    service["environment"] = {key: unescape(value) for key, value in environment.items()}
    service["command"] = [unescape(part) for part in service["command"]]
    return service


def launched_argv(tmp_path: Path, settings, programs=("vllm",)) -> dict[str, list[str]]:
    """program -> the argv (without its name) the container's entrypoint starts it with."""
    service = composed_service(tmp_path, settings)
    assert service["entrypoint"] == ["/bin/bash", "-c"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # lmcache-mp's entrypoint starts vLLM only once the server's /healthcheck answers: its shim answers it
    for name in {*programs, "lmcache"}:
        (bin_dir / name).write_text(LMCACHE_SHIM if name == "lmcache" else SHIM)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "argv"
    env = {**service["environment"], "PATH": f"{bin_dir}:/usr/bin:/bin", "ARGV_LOG": str(log)}
    if "LMCACHE_HTTP_PORT" in env:  # a port free on this machine, whatever the knob's default
        env["LMCACHE_HTTP_PORT"] = str(free_port())
    result = subprocess.run(
        ["bash", "-c", *service["command"]], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    # a program started in the background (the lmcache server) may write a moment later
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(Path(f"{log}.{name}").exists() for name in programs):
        time.sleep(0.05)
    return {name: json.loads(Path(f"{log}.{name}").read_text().splitlines()[0]) for name in programs}


def flags(argv: list[str]) -> dict[str, object]:
    """`--flag value` / `--flag=value` / bare `--flag` -> {flag: value or True}; a repeated flag fails."""
    parsed: dict[str, object] = {}
    index = 0
    while index < len(argv):
        word = argv[index]
        assert word.startswith("-"), f"{word!r} is not a flag (argv {argv})"
        if "=" in word:
            flag, value = word.split("=", 1)
        elif index + 1 < len(argv) and not argv[index + 1].startswith("--"):
            flag, value = word, argv[index + 1]
            index += 1
        else:
            flag, value = word, True
        assert flag not in parsed, f"{flag} given twice"
        parsed[flag] = value
        index += 1
    return parsed


def start_entrypoint(tmp_path: Path, s, vllm_shim: str = SHIM, **env_extra) -> subprocess.CompletedProcess:
    """Run the real entrypoint script in bash with the env compose would give it; programs are shims
    that record their argv (no GPU, no vLLM needed to see what the container would launch)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, shim in (("vllm", vllm_shim), ("lmcache", LMCACHE_SHIM), ("python", SHIM)):
        (bin_dir / name).write_text(shim)
        (bin_dir / name).chmod(0o755)
    script = entrypoint_script(s).replace("/opt/vllm/bin/python", str(bin_dir / "python"))
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "ARGV_LOG": str(tmp_path / "argv"),
        **env_values(s),
        **s.profile.fixed_env,
        **env_extra,
    }
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)


def run_entrypoint(tmp_path: Path, s) -> dict[str, list[str]]:
    result = start_entrypoint(tmp_path, s)
    log = tmp_path / "argv"
    assert result.returncode == 0, result.stderr
    deadline = time.monotonic() + 5
    expected = (
        {"vllm", "lmcache"} if s.profile.name == "lmcache-mp" else {"python" if s.profile.name == "cpu-lab" else "vllm"}
    )
    # the lmcache server is started in the background: give its shim a moment
    while time.monotonic() < deadline and not all(Path(f"{log}.{name}").exists() for name in expected):
        time.sleep(0.05)
    return {name: json.loads(Path(f"{log}.{name}").read_text().splitlines()[0]) for name in expected}
