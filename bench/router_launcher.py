"""The benchmark's own vllm-router: the real router (the .venv's vllm_router) started on the controller's loopback.

    with started_router("cache_aware", ["http://127.0.0.1:8101", ...]) as router:
        requests.get(router.url + "/workers")

Not the router role (roles/router.py runs it under systemd on a gateway host): a bench needs a router it can
start over any worker URLs (tunnels, fake workers) and stop again, in its own process group, its log kept in a
temporary file and shown when it does not come up.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import requests

from rigkit.errors import ConfigError, RigkitError
from rigkit.settings.defaults import ROUTER_POLICIES

LOOPBACK = "127.0.0.1"
# Healthy workers: ready ~1.2 s after the start (measured on this machine with 0.1.17).
READY_TIMEOUT_S = 60.0
READY_POLL_S = 0.1
STOP_TIMEOUT_S = 10.0
# The router re-checks unhealthy workers at start every this many seconds (its default, 30 s, would make a worker
# that answers a moment late cost half a minute).
WORKER_STARTUP_CHECK_S = 1


class RouterStartError(RigkitError):
    """The benchmark's vllm-router did not come up."""


def free_port() -> int:
    """A loopback TCP port free right now (the router binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def router_argv(policy: str, worker_urls: Sequence[str], port: int, prometheus_port: int) -> list[str]:
    """The command line of one router; each gets its own Prometheus port (every router defaults to 29000)."""
    if policy not in ROUTER_POLICIES:
        raise ConfigError("policy", policy, "is not a vllm-router policy", f"use one of {', '.join(ROUTER_POLICIES)}")
    if not worker_urls:
        raise ConfigError("worker_urls", [], "a router needs at least one worker", "pass the rigs' API URLs")
    return [
        sys.executable,
        "-m",
        "vllm_router.launch_router",
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--prometheus-host",
        LOOPBACK,
        "--prometheus-port",
        str(prometheus_port),
        "--policy",
        policy,
        "--worker-startup-check-interval",
        str(WORKER_STARTUP_CHECK_S),
        "--log-level",
        "warning",
        "--worker-urls",
        *worker_urls,
    ]


@dataclass(frozen=True)
class Router:
    policy: str
    url: str
    log: Path

    def worker_urls(self) -> list[str]:
        """The workers the router lists (GET /list_workers)."""
        response = requests.get(f"{self.url}/list_workers", timeout=5)
        response.raise_for_status()
        return list(response.json()["urls"])


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


@contextmanager
def started_router(policy: str, worker_urls: Sequence[str]) -> Iterator[Router]:
    """A running router over `worker_urls` on a free loopback port, stopped (SIGTERM, then SIGKILL) on exit."""
    port = free_port()
    argv = router_argv(policy, worker_urls, port, free_port())
    log = Path(tempfile.mkstemp(prefix=f"vllm-router-{policy}-", suffix=".log")[1])
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    router = Router(policy, f"http://{LOOPBACK}:{port}", log)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _healthy(router.url):
            if process.poll() is not None or time.monotonic() > deadline:
                why = (
                    f"exited {process.returncode}"
                    if process.poll() is not None
                    else f"not healthy after {READY_TIMEOUT_S:.0f} s"
                )
                raise RouterStartError(
                    "vllm-router",
                    policy,
                    f"{why}; its log:\n{log.read_text()[-3000:]}",
                    "check that every worker URL answers /health and vllm-router is installed",
                )
            time.sleep(READY_POLL_S)
        yield router
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        log.unlink(missing_ok=True)
