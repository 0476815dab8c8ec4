"""The lab's router: the real vllm-router (the test extra's pinned release, in .venv) on this machine's loopback in
front of the lab rigs that serve, started by `rigkit lab up --router`, stopped by `rigkit lab down`.

It routes to the rigs on host networking (their APIs at 127.0.0.1:<serving_port>); a rig in its own network namespace
binds its own loopback, which the router cannot reach, and is left out (said). vllm-router waits at start until every
worker answers, so the router comes after a deploy: `lab up --router` refuses while no rig serves. It runs with the
router role's health checks (rigkit.router.HEALTH_FLAGS): a rig that stops answering leaves the routing within
ROUTER_UNHEALTHY_WITHIN_S and comes back once healthy. inventory/lab_router.py declares it as the gateway `@local`:
`rigkit deploy inventory/lab_router.py` then drains each rig from it in turn (never installs a router here: the
router role is refused on the controller).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional, Sequence

from rigkit.errors import PreflightError
from rigkit.lab.proc import LabStepError, Progress, process_alive, read_pid, start_daemon, stop_pid, wait_until
from rigkit.lab.state import RigState, read_state_or_none
from rigkit.paths import LAB_DIR
from rigkit.rollout.router_record import ROUTER_RECORD_PATH, RouterRecord
from rigkit.router import CONTROLLER_HOST, HEALTH_FLAGS, ROUTER_FRONT_SOURCE, ROUTER_UNHEALTHY_WITHIN_S, front_argv

ROUTER_MODULE = "vllm_router.launch_router"
LAB_ROUTER_HOST = "127.0.0.1"
# not the router role's default ports: tests/lab/test_router_lab.py installs a router with them on rig1, which shares
# this machine's network
LAB_ROUTER_PORT = 8310
LAB_ROUTER_METRICS_PORT = 8311
LAB_ROUTER_POLICY = "round_robin"  # every rig gets requests: a client loop shows each one leave and come back
ROUTER_PID_FILE = LAB_DIR / "router.pid"  # the front's: it supervises the router as the gateway's unit does
ROUTER_ARGV_FILE = LAB_DIR / "router.argv.json"
ROUTER_LOG_FILE = LAB_DIR / "router.log"
ROUTER_START_TIMEOUT_S = 90.0  # the router's own wait for its workers (60 s) and its start
ROUTER_WORKER_STARTUP_TIMEOUT_S = 60


def lab_router_url() -> str:
    return f"http://{LAB_ROUTER_HOST}:{LAB_ROUTER_PORT}"


def rig_url(rig: RigState) -> str:
    """A host-network rig's API as the router on this machine reaches it."""
    return f"http://127.0.0.1:{rig.serving_port}"


def answers(url: str, timeout_s: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def router_argv(worker_urls: Sequence[str]) -> list[str]:
    """vllm-router's argv as the front runs it (the front appends --host/--port: its own loopback port)."""
    return [
        sys.executable,
        "-m",
        ROUTER_MODULE,
        "--prometheus-host",
        LAB_ROUTER_HOST,
        "--prometheus-port",
        str(LAB_ROUTER_METRICS_PORT),
        "--policy",
        LAB_ROUTER_POLICY,
        "--worker-startup-timeout-secs",
        str(ROUTER_WORKER_STARTUP_TIMEOUT_S),
        *HEALTH_FLAGS,
        "--worker-urls",
        *worker_urls,
    ]


def lab_front_argv() -> list[str]:
    """The lab's router as a gateway's runs: the front (rigkit/files/router_front.py) holds LAB_ROUTER_PORT and
    supervises vllm-router behind it with the gateway unit's figures (rigkit.router.front_argv)."""
    return front_argv(
        sys.executable, str(ROUTER_FRONT_SOURCE), f"{LAB_ROUTER_HOST}:{LAB_ROUTER_PORT}", str(ROUTER_ARGV_FILE)
    )


def write_router_argv(worker_urls: Sequence[str]) -> None:
    ROUTER_ARGV_FILE.parent.mkdir(parents=True, exist_ok=True)
    ROUTER_ARGV_FILE.write_text(json.dumps(router_argv(worker_urls)) + "\n")


def record_on_rigs(rigs: Sequence[RigState], record: Optional[RouterRecord]) -> None:
    """Each rig's record of the router it is behind (rigkit.rollout.router_record), as a gateway's deploy writes it:
    a plain `rigkit deploy inventory/lab.py` then knows not to restart all of them at once. None removes it."""
    script = (
        f"rm -f {ROUTER_RECORD_PATH}"
        if record is None
        else f"mkdir -p {os.path.dirname(ROUTER_RECORD_PATH)} && cat > {ROUTER_RECORD_PATH}"
    )
    for rig in rigs:
        subprocess.run(
            ["docker", "exec", "-i", rig.container, "sh", "-c", script],
            input=record.text() if record else "",
            text=True,
            capture_output=True,
            timeout=60,
        )


def restart_router(progress: Progress) -> Optional[int]:
    """A router restart as a gateway's reload: the front restarts vllm-router behind the port it holds (SIGHUP).
    The front's PID, or None when no lab router runs."""
    pid = router_pid()
    if pid:
        progress(f"router: restarting vllm-router behind its front (pid {pid}); clients wait, none is refused")
        os.kill(pid, signal.SIGHUP)
    return pid


def router_pid() -> Optional[int]:
    """The lab router's PID while it runs (the PID file's process still runs vllm-router)."""
    pid = read_pid(ROUTER_PID_FILE)
    if not pid or not process_alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return pid if ROUTER_FRONT_SOURCE.name.encode() in cmdline else None


def ensure_router(rigs: Sequence[RigState], progress: Progress) -> dict:
    """The lab router runs in front of the serving host-network rigs; its record for the lab state."""
    behind = [rig for rig in rigs if not rig.netns]
    left_out = [f"{rig.name} (own network namespace: its API is on its own loopback)" for rig in rigs if rig.netns]
    serving = [rig for rig in behind if answers(f"{rig_url(rig)}/health")]
    left_out += [f"{rig.name} (does not serve yet)" for rig in behind if rig not in serving]
    if not serving:
        raise PreflightError(
            "--router",
            lab_router_url(),
            "no lab rig on host networking serves yet (vllm-router waits at start for every worker)",
            "deploy first (rigkit deploy inventory/lab.py), then run `rigkit lab up --router`",
        )
    urls = [rig_url(rig) for rig in serving]
    record = {
        "url": lab_router_url(),
        "metrics_port": LAB_ROUTER_METRICS_PORT,
        "policy": LAB_ROUTER_POLICY,
        "workers": {rig.name: rig_url(rig) for rig in serving},
        "left_out": left_out,
        "unhealthy_within_s": ROUTER_UNHEALTHY_WITHIN_S,
    }
    behind_it = RouterRecord((CONTROLLER_HOST,), tuple(rig.name for rig in serving))
    pid = router_pid()
    if pid and answers(f"{lab_router_url()}/health"):
        listed = _listed()
        if listed is not None and sorted(listed) == sorted(urls):
            progress(f"router: reusing {lab_router_url()} (pid {pid}) in front of {', '.join(record['workers'])}")
            record_on_rigs(serving, behind_it)
            return {**record, "pid": pid}
        progress(f"router: new workers {', '.join(urls)}")
        write_router_argv(urls)
        restart_router(progress)
        if not wait_until(lambda: sorted(_listed() or []) == sorted(urls), ROUTER_START_TIMEOUT_S):
            raise LabStepError(
                "router", lab_router_url(), f"does not list {', '.join(urls)} after its restart", "read its log"
            )
        record_on_rigs(serving, behind_it)
        return {**record, "pid": pid}
    elif answers(f"{lab_router_url()}/health"):
        raise PreflightError(
            "router port",
            lab_router_url(),
            "something the lab did not start answers there",
            f"stop it (ss -ltnp 'sport = :{LAB_ROUTER_PORT}' shows which process)",
        )
    progress(
        f"router: starting vllm-router on {lab_router_url()} in front of {', '.join(urls)}"
        + (f"; left out: {'; '.join(left_out)}" if left_out else "")
    )
    write_router_argv(urls)
    argv = lab_front_argv()
    pid = start_daemon(argv, ROUTER_LOG_FILE, ROUTER_PID_FILE)
    if not wait_until(
        lambda: not process_alive(pid) or answers(f"{lab_router_url()}/health"), ROUTER_START_TIMEOUT_S
    ) or not answers(f"{lab_router_url()}/health"):
        tail = " | ".join(ROUTER_LOG_FILE.read_text(errors="replace").strip().splitlines()[-5:])
        raise LabStepError(
            "router",
            " ".join(argv[:2]),
            f"did not answer on {lab_router_url()} (log {ROUTER_LOG_FILE}: {tail})",
            "read the log; is vllm-router in .venv (bin/setup)?",
        )
    progress(f"router: ready (pid {pid}); a rig that stops answering leaves it within {ROUTER_UNHEALTHY_WITHIN_S} s")
    record_on_rigs(serving, behind_it)
    return {**record, "pid": pid}


def _listed() -> Optional[list[str]]:
    try:
        with urllib.request.urlopen(f"{lab_router_url()}/list_workers", timeout=3) as response:
            return list(json.loads(response.read())["urls"])
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return None


def stop_router(progress: Progress) -> bool:
    """Stop the lab router (its front stops vllm-router first); the rigs behind it forget it."""
    state = read_state_or_none()
    if state is not None and state.router:
        record_on_rigs([rig for rig in state.rigs if rig.name in state.router.get("workers", {})], None)
    pid = router_pid()
    if not pid:
        ROUTER_PID_FILE.unlink(missing_ok=True)
        return False
    progress(f"router: stopping (pid {pid})")
    stopped = stop_pid(pid, os.path.basename(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()))
    ROUTER_PID_FILE.unlink(missing_ok=True)
    return stopped
