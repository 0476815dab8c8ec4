"""The real vllm-router (the test extra's pinned release, .venv) in a child process on loopback, for tests that
drain workers through it: free ports for its API and its Prometheus exporter (the exporter's default port is
host-global, so two routers at once would collide), ready when /health answers, its log kept for a failure."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

import requests

READY_TIMEOUT_S = 30.0
PROCESSED = "vllm_router_processed_requests_total"
# 1 while the router's health checks hold the worker healthy, 0 once they marked it down (vllm-router 0.1.17)
WORKER_HEALTH = "vllm_router_worker_health"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RouterProcess:
    def __init__(self, worker_urls: Sequence[str], policy: str = "round_robin", extra: Sequence[str] = ()):
        self.port, self.prometheus_port = free_port(), free_port()
        self.argv = [
            sys.executable,
            "-m",
            "vllm_router.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(self.prometheus_port),
            "--policy",
            policy,
            "--worker-urls",
            *worker_urls,
            *extra,
        ]
        self.log = Path(tempfile.mkstemp(prefix="vllm-router-", suffix=".log")[1])
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "RouterProcess":
        self.process = subprocess.Popen(self.argv, stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm-router exited {self.process.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self.__exit__()
        raise RuntimeError(f"vllm-router not ready after {READY_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def processed(self) -> dict[str, float]:
        return processed(self.prometheus_port)

    def series(self) -> dict[str, dict[str, float]]:
        return per_worker(self.prometheus_port)


def processed(prometheus_port: int) -> dict[str, float]:
    """Requests a router on this machine sent to each worker (its Prometheus counter), by worker URL."""
    return per_worker(prometheus_port)[PROCESSED]


def per_worker(prometheus_port: int) -> dict[str, dict[str, float]]:
    """A router's per-worker series (PROCESSED, WORKER_HEALTH): metric -> worker URL -> value."""
    text = requests.get(f"http://127.0.0.1:{prometheus_port}/metrics", timeout=5).text
    series: dict[str, dict[str, float]] = {PROCESSED: {}, WORKER_HEALTH: {}}
    for line in text.splitlines():
        name = line.partition("{")[0]
        if name in series and 'worker="' in line:
            labels, _, value = line.rpartition(" ")
            worker = labels.split('worker="', 1)[1].split('"', 1)[0]
            series[name][worker] = float(value)
    return series


class Loops:
    """Methods run in daemon threads until the block ends (the client loops and watchers of the router tests)."""

    def __init__(self, *targets):
        self.stopping = threading.Event()
        self._threads = [threading.Thread(target=target, daemon=True) for target in targets]

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        for thread in self._threads:
            thread.join(timeout=90)
