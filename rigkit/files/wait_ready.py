#!/usr/bin/env python3
"""Runs ON the rig: wait until the serving API answers, or fail with the container's last log lines.

Usage: wait_ready.py URL TIMEOUT_S STACK_LABEL_FILTER
Standard library only (a rig has python3, nothing more is promised).
"""

import subprocess
import sys
import time
import urllib.request

PROGRESS_EVERY_S = 15
LOG_TAIL_LINES = 40
# The API is asked this often (a loopback request: the release is done the moment it answers); the containers
# (two docker CLI calls) only every CONTAINERS_EVERY_S.
POLL_S = 0.25
CONTAINERS_EVERY_S = 2.0


def stack_containers(label_filter: str) -> list[tuple[str, str, int]]:
    """(id, status, restart count) of the stack's containers."""
    ids = subprocess.run(["docker", "ps", "-aq", "--filter", label_filter],
                         capture_output=True, text=True).stdout.split()
    if not ids:
        return []
    out = subprocess.run(["docker", "inspect", "--format", "{{.Id}} {{.State.Status}} {{.RestartCount}}", *ids],
                         capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        cid, status, restarts = line.split()
        rows.append((cid[:12], status, int(restarts)))
    return rows


def print_logs(container_id: str) -> None:
    logs = subprocess.run(["docker", "logs", "--tail", str(LOG_TAIL_LINES), container_id],
                          capture_output=True, text=True)
    print(f"--- last {LOG_TAIL_LINES} log lines of {container_id} ---")
    print((logs.stdout + logs.stderr).rstrip())


def main(url: str, timeout_s: float, label_filter: str) -> int:
    started = time.monotonic()
    last_progress = started
    last_containers = started
    while True:
        elapsed = time.monotonic() - started
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    print(f"ready: {url} answered after {elapsed:.0f}s")
                    return 0
        except OSError:
            pass
        if time.monotonic() - last_containers >= CONTAINERS_EVERY_S or elapsed > timeout_s:
            last_containers = time.monotonic()
            for cid, status, restarts in stack_containers(label_filter):
                if status in ("exited", "dead") or restarts > 0:
                    print(f"container {cid} died (status {status}, restarts {restarts}) before {url} answered")
                    print_logs(cid)
                    return 1
        if elapsed > timeout_s:
            print(f"timeout: {url} did not answer within {timeout_s:.0f}s (knob ready_timeout_s)")
            for cid, _, _ in stack_containers(label_filter):
                print_logs(cid)
            return 1
        if time.monotonic() - last_progress >= PROGRESS_EVERY_S:
            print(f"waiting for {url}: {elapsed:.0f}s of {timeout_s:.0f}s", flush=True)
            last_progress = time.monotonic()
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2]), sys.argv[3]))
