"""The lab's Docker engine: no bridge, no iptables, images cached across `lab down`.

A running engine is reused only if it has no bridge network (the lab's network rule); otherwise the
lab refuses rather than reconfigure an engine it does not own. On machines whose capability
bounding set lacks CAP_SYS_RESOURCE (some VMs), `--privileged` containers need the runc wrapper.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

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

DOCKER_SOCKET = Path("/var/run/docker.sock")
NO_BRIDGE_FLAGS = ("--bridge=none", "--iptables=false", "--ip-forward=false", "--ip-masq=false")
ENGINE_DATA_ROOT = CACHE_DIR / "docker"
ENGINE_PID_FILE = LAB_DIR / "dockerd.pid"
ENGINE_LOG_FILE = LAB_DIR / "dockerd.log"
RUNC_WRAPPER_SOURCE = Path(__file__).with_name("runc_wrapper")
RUNC_WRAPPER = LAB_DIR / "bin" / "rigkit-runc"
WRAPPER_RUNTIME_NAME = "rigkit-runc"
CAP_SYS_RESOURCE = 24
ENGINE_START_TIMEOUT_S = 60.0


def capability_bounding_set(proc_status_text: str) -> int:
    """The CapBnd mask from /proc/<pid>/status text."""
    for line in proc_status_text.splitlines():
        if line.startswith("CapBnd:"):
            return int(line.split()[1], 16)
    raise ValueError("no CapBnd line in /proc status text")


def lacks_capability(proc_status_text: str, capability_bit: int) -> bool:
    return not (capability_bounding_set(proc_status_text) >> capability_bit) & 1


def needs_runc_wrapper() -> bool:
    return lacks_capability(Path("/proc/self/status").read_text(), CAP_SYS_RESOURCE)


def _docker(*args: str, timeout: float = 15.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "DOCKER_HOST": f"unix://{DOCKER_SOCKET}"},
    )


def engine_answers() -> bool:
    try:
        return _docker("version", "--format", "{{.Server.Version}}", timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def bridge_networks() -> list[str]:
    result = _docker("network", "ls", "--filter", "driver=bridge", "--format", "{{.Name}}")
    return [name for name in result.stdout.split() if name]


def default_runtime() -> str:
    # right after start-up `docker info` can come back empty for a moment
    for _ in range(50):
        runtime = _docker("info", "--format", "{{.DefaultRuntime}}").stdout.strip()
        if runtime:
            return runtime
        time.sleep(0.2)
    return ""


def engine_state() -> dict:
    """What `lab status` shows and the state file records about the engine."""
    pid = read_pid(ENGINE_PID_FILE)
    started_by_lab = pid_runs(pid, "dockerd")
    return {
        "socket": str(DOCKER_SOCKET),
        "pid": pid if started_by_lab else None,
        "started_by_lab": started_by_lab,
        "runtime_wrapper": default_runtime() == WRAPPER_RUNTIME_NAME,
        "data_root": str(ENGINE_DATA_ROOT) if started_by_lab else None,
        "log": str(ENGINE_LOG_FILE) if started_by_lab else None,
    }


def _check_reusable(progress: Progress) -> None:
    bridges = bridge_networks()
    if bridges:
        raise PreflightError(
            "docker engine",
            str(DOCKER_SOCKET),
            f"the running engine has bridge network(s) {bridges}; lab traffic must stay on host networking",
            "stop that engine (systemctl stop docker docker.socket) and run `rigkit lab up` again: it starts "
            "its own with --bridge=none --iptables=false --ip-forward=false --ip-masq=false",
        )
    if needs_runc_wrapper() and default_runtime() == "runc":
        raise PreflightError(
            "docker engine",
            str(DOCKER_SOCKET),
            "this machine lacks CAP_SYS_RESOURCE, so privileged rigs need the runc wrapper, but the running "
            "engine uses plain runc",
            "stop that engine and run `rigkit lab up` again (it starts one with the wrapper)",
        )
    progress("docker engine: reusing the running engine (no bridge)")


def _install_wrapper() -> None:
    RUNC_WRAPPER.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(RUNC_WRAPPER_SOURCE, RUNC_WRAPPER)
    RUNC_WRAPPER.chmod(RUNC_WRAPPER.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def dockerd_command(use_wrapper: bool) -> list[str]:
    cmd = ["dockerd", *NO_BRIDGE_FLAGS, "--data-root", str(ENGINE_DATA_ROOT), "--host", f"unix://{DOCKER_SOCKET}"]
    if use_wrapper:
        cmd += ["--add-runtime", f"{WRAPPER_RUNTIME_NAME}={RUNC_WRAPPER}", "--default-runtime", WRAPPER_RUNTIME_NAME]
    return cmd


def ensure_engine(progress: Progress) -> dict:
    """A no-bridge engine answers on the default socket; returns its state record."""
    if engine_answers():
        _check_reusable(progress)
        return engine_state()
    if os.geteuid() != 0:
        raise PreflightError(
            "user",
            os.geteuid(),
            "the lab starts a Docker engine and privileged rigs",
            "run as root (sudo rigkit lab up)",
        )
    if not shutil.which("dockerd"):
        raise PreflightError("dockerd", None, "no Docker engine installed", "apt-get install docker.io (or bin/setup)")
    use_wrapper = needs_runc_wrapper()
    if use_wrapper:
        _install_wrapper()
    ENGINE_DATA_ROOT.mkdir(parents=True, exist_ok=True)
    progress(
        "docker engine: starting dockerd (no bridge"
        + (", runc wrapper for the missing CAP_SYS_RESOURCE" if use_wrapper else "")
        + ")"
    )
    pid = start_daemon(dockerd_command(use_wrapper), ENGINE_LOG_FILE, ENGINE_PID_FILE)
    # The new dockerd must be the one answering: an engine still shutting down from `lab down` may
    # answer for a moment while the new one waits for the socket.
    if not wait_until(
        lambda: not process_alive(pid) or (pid_runs(pid, "dockerd") and engine_answers()), ENGINE_START_TIMEOUT_S, 0.3
    ) or not pid_runs(pid, "dockerd"):
        tail = " | ".join(ENGINE_LOG_FILE.read_text(errors="replace").strip().splitlines()[-5:])
        raise LabStepError(
            "docker engine",
            " ".join(dockerd_command(use_wrapper)),
            f"dockerd did not come up (log {ENGINE_LOG_FILE}: {tail})",
            "read the log; another engine may hold /var/run/docker.pid or the socket",
        )
    progress(f"docker engine: ready (pid {pid}, data root {ENGINE_DATA_ROOT})")
    return engine_state()


def stop_engine(progress: Progress) -> bool:
    """Stop the engine only if the lab started it. Returns True if it stopped one."""
    pid = read_pid(ENGINE_PID_FILE)
    if not pid_runs(pid, "dockerd"):
        return False
    progress(f"docker engine: stopping dockerd (pid {pid})")
    stopped = stop_pid(pid, "dockerd", grace_seconds=60.0)
    ENGINE_PID_FILE.unlink(missing_ok=True)
    return stopped
