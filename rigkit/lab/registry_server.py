"""The lab's image registry: Debian's docker-registry on 127.0.0.1:5000, storage cached across `lab down`.

127.0.0.0/8 is an implicit insecure registry for Docker, so neither the host engine nor a rig's
engine needs configuration to push or pull. The storage holds the serving releases (hundreds of MB,
minutes to push), so it lives under CACHE_DIR, not LAB_DIR.
"""

from __future__ import annotations

import shutil
import socket
import urllib.error
import urllib.request

from rigkit.errors import PreflightError
from rigkit.lab.proc import (
    LabStepError,
    Progress,
    pid_runs,
    process_alive,
    read_pid,
    start_daemon,
    stop_pid,
    wait_until,
)
from rigkit.paths import CACHE_DIR, LAB_DIR

REGISTRY_HOST = "127.0.0.1"
REGISTRY_PORT = 5000
REGISTRY = f"{REGISTRY_HOST}:{REGISTRY_PORT}"
REGISTRY_STORAGE = CACHE_DIR / "registry"
REGISTRY_CONFIG = LAB_DIR / "registry.yml"
REGISTRY_PID_FILE = LAB_DIR / "registry.pid"
REGISTRY_LOG_FILE = LAB_DIR / "registry.log"
REGISTRY_EXECUTABLE = "docker-registry"
REGISTRY_START_TIMEOUT_S = 30.0


def registry_config(storage_dir: str, addr: str = REGISTRY) -> str:
    return (
        "version: 0.1\n"
        "log:\n  level: warn\n"
        "storage:\n"
        "  filesystem:\n"
        f"    rootdirectory: {storage_dir}\n"
        "  delete:\n    enabled: true\n"
        "http:\n"
        f"  addr: {addr}\n"
    )


def registry_answers(registry: str = REGISTRY) -> bool:
    try:
        with urllib.request.urlopen(f"http://{registry}/v2/", timeout=3) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def port_taken(host: str = REGISTRY_HOST, port: int = REGISTRY_PORT) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, port)) == 0


def registry_pid() -> int | None:
    pid = read_pid(REGISTRY_PID_FILE)
    return pid if pid_runs(pid, REGISTRY_EXECUTABLE) else None


def ensure_registry(progress: Progress) -> int:
    """The lab registry answers on 127.0.0.1:5000; returns its PID."""
    pid = registry_pid()
    if pid and registry_answers():
        progress(f"registry: reusing {REGISTRY} (pid {pid})")
        return pid
    if port_taken():
        raise PreflightError(
            "registry port",
            REGISTRY,
            "something the lab did not start listens there",
            "stop it (ss -ltnp 'sport = :5000' shows which process) and run `rigkit lab up` again",
        )
    if not shutil.which(REGISTRY_EXECUTABLE):
        raise PreflightError(
            "docker-registry",
            None,
            "Debian's registry is not installed",
            "apt-get install docker-registry (or bin/setup)",
        )
    REGISTRY_STORAGE.mkdir(parents=True, exist_ok=True)
    REGISTRY_CONFIG.parent.mkdir(parents=True, exist_ok=True)
    REGISTRY_CONFIG.write_text(registry_config(str(REGISTRY_STORAGE)))
    progress(f"registry: starting docker-registry on {REGISTRY} (storage {REGISTRY_STORAGE})")
    cmd = [REGISTRY_EXECUTABLE, "serve", str(REGISTRY_CONFIG)]
    pid = start_daemon(cmd, REGISTRY_LOG_FILE, REGISTRY_PID_FILE)
    if (
        not wait_until(lambda: not process_alive(pid) or registry_answers(), REGISTRY_START_TIMEOUT_S)
        or not registry_answers()
    ):
        tail = " | ".join(REGISTRY_LOG_FILE.read_text(errors="replace").strip().splitlines()[-5:])
        raise LabStepError(
            "registry", " ".join(cmd), f"did not answer on {REGISTRY} (log {REGISTRY_LOG_FILE}: {tail})", "read the log"
        )
    progress(f"registry: ready (pid {pid})")
    return pid


def stop_registry(progress: Progress) -> bool:
    pid = registry_pid()
    if not pid:
        return False
    progress(f"registry: stopping (pid {pid})")
    stopped = stop_pid(pid, REGISTRY_EXECUTABLE)
    REGISTRY_PID_FILE.unlink(missing_ok=True)
    return stopped
