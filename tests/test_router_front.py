"""rigkit/files/router_front.py: the router's port held across its restarts (issue 43).

The front runs with tests/fake_router.py as its router (binds a second after it starts, as vllm-router does once its
workers answer; finishes what it serves on SIGTERM). A client thread sends requests on new connections back to back
while the router is restarted (SIGHUP: an upgrade or a config change) and killed (a crash): none fails. Without the
front, the same restarts refuse connections (the first test shows the failure the front removes).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rigkit.paths import FILES_DIR

FRONT = FILES_DIR / "router_front.py"
FAKE_ROUTER = Path(__file__).resolve().parent / "fake_router.py"
IN_FLIGHT_ANSWERS = 3  # answers a router gives before it is restarted: the client's requests reach it


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Client(threading.Thread):
    """Requests on a new connection each, back to back: (outcome, answering pid)."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.stopping, self.outcomes = url, threading.Event(), []

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                with urllib.request.urlopen(self.url, data=b'{"prompt": "x"}', timeout=20) as response:
                    self.outcomes.append(("ok", json.loads(response.read())["pid"]))
            except (urllib.error.URLError, OSError, ValueError) as exc:
                self.outcomes.append((str(exc), None))
                time.sleep(0.05)

    def failed(self) -> list[str]:
        return [outcome for outcome, _ in self.outcomes if outcome != "ok"]

    def answers_from(self, pids) -> int:
        return sum(1 for outcome, pid in list(self.outcomes) if outcome == "ok" and pid in pids)

    def answered_by_other_than(self, pids) -> bool:
        return any(outcome == "ok" and pid not in pids for outcome, pid in list(self.outcomes))


def wait_until(condition, what: str, timeout_s: float = 30.0) -> None:
    """Poll ``condition`` (instead of sleeping a fixed time that a loaded machine may outlast)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.02)


def wait_answers(url: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except (urllib.error.URLError, OSError):
            assert time.monotonic() < deadline, f"{url} never answered"
            time.sleep(0.1)


@pytest.fixture()
def front(tmp_path):
    port = free_port()
    argv_file = tmp_path / "argv.json"
    argv_file.write_text(json.dumps([sys.executable, str(FAKE_ROUTER)]))
    process = subprocess.Popen(
        [sys.executable, str(FRONT), "--listen", f"127.0.0.1:{port}", "--argv-file", str(argv_file),
         "--restart-delay", "0.5", "--ready-timeout", "20", "--stop-timeout", "10"],
        stderr=open(tmp_path / "front.log", "wb"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1/completions"
    try:
        wait_answers(url)
        yield process, url, tmp_path / "front.log"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)


def children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_a_router_restarted_in_place_refuses_connections(tmp_path):
    """What the front removes: the router itself stopped and started again refuses while it is down."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"

    def router() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(FAKE_ROUTER), "--host", "127.0.0.1", "--port", str(port)])

    process = router()
    wait_answers(url)
    client = Client(url)
    client.start()
    wait_until(lambda: client.answers_from({process.pid}) >= IN_FLIGHT_ANSWERS, "the first router answering")
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=10)
    first = process.pid
    process = router()
    wait_until(lambda: client.answered_by_other_than({first}), "the restarted router answering the client")
    client.stopping.set()
    client.join(timeout=30)
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=10)
    assert client.failed(), "a restart in place refused nothing: the front would not be needed"


def test_restarts_and_a_crash_behind_the_front_lose_no_request(front):
    process, url, log = front
    client = Client(url)
    client.start()
    pids = set()
    for _ in range(3):  # an upgrade or a config change: systemctl reload
        [router] = children(process.pid)
        pids.add(router)
        # requests in flight when the restart comes; then the next router has answered the client
        wait_until(lambda: client.answers_from({router}) >= IN_FLIGHT_ANSWERS, f"router {router} answering")
        os.kill(process.pid, signal.SIGHUP)
        wait_until(lambda: client.answered_by_other_than(pids), "a new router answering after SIGHUP")
    [router] = children(process.pid)
    pids.add(router)
    wait_until(lambda: client.answers_from({router}) >= IN_FLIGHT_ANSWERS, f"router {router} answering")
    os.kill(router, signal.SIGKILL)  # a crash: started again after the restart delay
    wait_until(lambda: client.answered_by_other_than(pids), "a new router answering after the crash")
    pids.update(children(process.pid))
    client.stopping.set()
    client.join(timeout=60)
    answered = {pid for outcome, pid in client.outcomes if outcome == "ok"}
    print(f"\nrouter front: {len(client.outcomes)} requests, {len(client.failed())} failed, {len(answered)} routers")
    assert client.failed() == [], (client.failed()[:3], log.read_text()[-2000:])
    assert len(answered) >= 4 and answered <= pids | answered  # every restart gave a new router that answered


def test_the_router_is_stopped_with_the_front(tmp_path, front):
    process, _, _ = front
    [router] = children(process.pid)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
    assert not Path(f"/proc/{router}").exists() or "Z" in Path(f"/proc/{router}/stat").read_text().split(")")[1][:3]
