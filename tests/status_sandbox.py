"""A rig for `rigkit status` tests, on this machine: the real script run under sh, its rig paths moved into a
temporary directory and the rig's tools stubbed on PATH (the engine read through the docker CLI: docker prints a
made-up `docker inspect` shaped as docker 20.10's, nvidia-smi the real H200 capture in tests/fixtures, systemctl
"active"); the API probe is the real one, against a tiny /v1/models server on this machine's loopback. The stack's files are exactly what
rigkit renders for cpu-lab, as a deploy writes them to a lab rig.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rigkit.paths import RIG_STACK_DIR, RIG_STATE_DIR
from rigkit.serving.commands import rendering_for
from rigkit.serving.ledger import Ledger, Release
from rigkit.settings.hostdata import rig_settings
from rigkit.status.probe import status_script
from rigkit.status.rig import assess

IMAGE_1 = "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64
IMAGE_2 = "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "2" * 64
NVIDIA_SMI = Path(__file__).parent / "fixtures" / "nvidia-smi" / "h200-x2-ubuntu2404" / "nvidia-smi.txt"
# the H200 health query as captured (its last line is the capture's own `exit=0`, dropped here)
GPU_QUERY = Path(__file__).parent / "fixtures" / "nvidia-smi" / "gpu-check-2026-12-03" / "nvidia-smi-query-gpu.csv"
# a kernel log line every boot has: journalctl -k -b answers with at least this one
KERNEL_BOOT_LINE = "Dec 03 10:02:11 rig1 kernel: Linux version 6.18.44-fc-v1147-gpu"
JANITOR_STATUS = "/run/rigkit-l2-janitor.json"


class Models(BaseHTTPRequestHandler):
    served = ["tiny"]

    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": name, "object": "model"} for name in self.served]})
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def api_port():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def stack_of(port: int, l2: Path, **knobs):
    data = {
        "serving_profile": "cpu-lab",
        "serving_image": IMAGE_1,
        "gpus": 0,
        "serving_port": port,
        "l2_path": str(l2),
        **knobs,
    }
    return rig_settings(data).stack


def made_up_inspect(image: str, env: dict[str, str], running: bool = True, labels: dict | None = None) -> list[dict]:
    """Made up, with the fields rigkit reads from docker 20.10's `docker inspect` of the stack's container."""
    return [
        {
            "Id": "4b1d2c3e5f60" + "0" * 52,
            "Name": "/rigkit-serving",
            "RestartCount": 0,
            "Config": {
                "Image": image,
                "Labels": {"org.rigkit.stack": "serving", **(labels or {})},
                "Env": [f"{k}={v}" for k, v in env.items()] + ["PATH=/usr/local/sbin:/usr/bin"],
            },
            "State": {"Status": "running" if running else "exited", "Running": running},
        }
    ]


class Rig:
    """A rig's filesystem under a temporary directory, as a verified deploy of ``stack`` leaves it."""

    def __init__(self, root: Path, stack, running: bool = True):
        self.root, self.stack = root, stack
        self.stack_dir, self.state_dir = root / "stack", root / "state"
        self.shm, self.l2, self.bin = root / "shm", Path(stack.knobs["l2_path"]), root / "bin"
        for directory in (self.stack_dir, self.state_dir, self.shm, self.l2, self.bin):
            directory.mkdir(parents=True, exist_ok=True)
        rendering = rendering_for(stack)
        (self.stack_dir / "compose.yml").write_text(rendering.compose)
        (self.stack_dir / ".env").write_text(rendering.env)
        (self.state_dir / "release.sha256").write_text(rendering.hash + "\n")
        ledger = Ledger(
            [
                Release(
                    image=stack.image,
                    profile="cpu-lab",
                    knobs_hash=stack.knobs_hash,
                    smoke="pass",
                    rendering=rendering.hash,
                    deployed_at="2026-12-01T12:30:05+00:00",
                )
            ]
        )
        (self.state_dir / "ledger.json").write_text(ledger.to_json())
        (self.l2 / "entry-1").write_bytes(b"k" * 4096)
        (root / "janitor.json").write_text(json.dumps({"state": "ok", "updated_at": time.time()}))
        self.labels = {"org.rigkit.profile": rendering.profile, "org.rigkit.knobs-hash": rendering.knobs_hash}
        # a TCP engine: the engine section's API script leaves the reading to the stubbed docker CLI (this machine's
        # own engine socket would answer it otherwise); a test points it at a stand-in engine's socket instead
        self.docker_host = "tcp://127.0.0.1:9"
        self.inspect(made_up_inspect(stack.image, rendering.container_env(), running, self.labels))
        self.tool(
            "docker",
            f'case "$1" in info) echo 20.10.24;; ps) echo 4b1d2c3e5f60;; inspect) cat {root}/inspect.json;; esac',
        )
        self.tool(
            "nvidia-smi",
            f'case "$1" in --query-gpu=*) grep -v "^exit=" {GPU_QUERY};; *) cat {NVIDIA_SMI};; esac',
        )
        self.kernel_log([KERNEL_BOOT_LINE])
        # journalctl -k as the kernel log (-n 1: its last line); dmesg refused as kernel.dmesg_restrict does
        self.tool(
            "journalctl",
            f'case " $* " in *" -n 1 "*) tail -n 1 {root}/kernel.log;; *) cat {root}/kernel.log;; esac',
        )
        self.tool("dmesg", 'echo "dmesg: read kernel buffer failed: Operation not permitted" >&2; exit 1')
        self.tool("systemctl", "echo active")

    def tool(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)

    def kernel_log(self, lines: list[str]) -> None:
        (self.root / "kernel.log").write_text("".join(line + "\n" for line in lines))

    def inspect(self, containers: list[dict]) -> None:
        (self.root / "inspect.json").write_text(json.dumps(containers, indent=4) + "\n")

    def run(self, script: str) -> str:
        """The script as a rig runs it, its rig paths moved under root."""
        for rig_path, here in (
            (RIG_STACK_DIR, self.stack_dir),
            (RIG_STATE_DIR, self.state_dir),
            ("/dev/shm", self.shm),
            (JANITOR_STATUS, self.root / "janitor.json"),
        ):
            script = script.replace(rig_path, str(here))
        env = {**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}", "DOCKER_HOST": self.docker_host}
        return subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, timeout=60).stdout

    def status(self, today=None):
        today = today or self.stack
        return assess("rig1", today, self.run(status_script(today)))


@pytest.fixture
def rig(tmp_path, api_port):
    return Rig(tmp_path, stack_of(api_port, tmp_path / "l2"))
