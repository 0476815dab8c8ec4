"""Processes for the lab: commands that fail with the step's name, daemons started and stopped by PID."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from rigkit.errors import RigkitError

# A long step reports what it is doing with one line of text at a time.
Progress = Callable[[str], None]


def print_progress(message: str) -> None:
    print(f"[lab] {message}", flush=True)


class LabStepError(RigkitError):
    """A lab step failed: the field is the step, the value the command or path it tripped on."""


def run(
    cmd: Sequence[str],
    step: str,
    fix: str,
    *,
    input_text: str | None = None,
    timeout: float | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Run a command, capture its output, and on failure raise an error naming the step and the fix."""
    try:
        result = subprocess.run(list(cmd), input=input_text, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise LabStepError(step, cmd[0], f"command not found ({exc})", fix) from exc
    except subprocess.TimeoutExpired as exc:
        raise LabStepError(step, " ".join(cmd), f"timed out after {timeout} s", fix) from exc
    if check and result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise LabStepError(step, " ".join(cmd), f"exit {result.returncode}: {' | '.join(tail)}", fix)
    return result


def remove_tree(path: Path, step: str) -> None:
    """rm -rf, never across a mount (a mount left under ``path`` stays, and is named): GNU rm walks a tree of
    any depth with a bounded number of descriptors, where shutil.rmtree holds two per directory level."""
    fix = f"see what is still mounted under it: findmnt -R {path}; unmount it, then run `rigkit lab down` again"
    run(["rm", "-rf", "--one-file-system", "--", str(path)], step, fix)
    if path.exists():
        raise LabStepError(step, f"rm -rf {path}", "left the directory in place", fix)


def start_daemon(cmd: Sequence[str], log_file: Path, pid_file: Path) -> int:
    """Start a daemon as a plain background process in its own session; record its PID."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        process = subprocess.Popen(
            list(cmd), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    pid_file.write_text(f"{process.pid}\n")
    return process.pid


def process_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (whatever program it runs)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def pid_runs(pid: int | None, executable_name: str) -> bool:
    """True if PID is alive and is still the program we started (PIDs get recycled)."""
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # also a process that exits between the two reads
        return False
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        return False
    return bool(cmdline) and os.path.basename(cmdline[0].decode()) == executable_name


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def stop_pid(pid: int, executable_name: str, grace_seconds: float = 30.0) -> bool:
    """SIGTERM, wait, then SIGKILL. Returns True if the process was ours and is gone now."""
    if not pid_runs(pid, executable_name):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        if not pid_runs(pid, executable_name):
            _reap(pid)
            return True
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    while pid_runs(pid, executable_name):
        time.sleep(0.1)
    _reap(pid)
    return True


def _reap(pid: int) -> None:
    # If this very process started the daemon (tests do), collect the zombie.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


PROGRESS_INTERVAL_S = 10.0


def run_with_progress(
    cmd: Sequence[str], step: str, fix: str, progress: Progress, label: str, interval: float = PROGRESS_INTERVAL_S
) -> None:
    """Run a long command; every INTERVAL seconds report its latest output line; on failure name the step."""
    started = time.monotonic()
    last_report = started
    tail: list[str] = []
    try:
        process = subprocess.Popen(
            list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
    except FileNotFoundError as exc:
        raise LabStepError(step, cmd[0], f"command not found ({exc})", fix) from exc
    assert process.stdout is not None
    for line in process.stdout:
        line = line.rstrip()
        if not line:
            continue
        tail = (tail + [line])[-8:]
        now = time.monotonic()
        if now - last_report >= interval:
            progress(f"{label}: {now - started:.0f} s: {line[:120]}")
            last_report = now
    if process.wait() != 0:
        raise LabStepError(step, " ".join(cmd)[:200], f"exit {process.returncode}: {' | '.join(tail[-5:])}", fix)
    progress(f"{label}: done in {time.monotonic() - started:.0f} s")


HEARTBEAT_S = 30.0


def input_hash(*parts: object) -> str:
    """A short, stable key of build inputs (any JSON-serialisable values)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def directory_digest(directory: Path) -> dict[str, str]:
    """sha256 of every file under DIRECTORY, by relative path (bytes only: mtimes do not matter)."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def streamed(
    cmd: Sequence[str],
    step: str,
    fix: str,
    progress: Progress,
    timeout: float,
    interesting: re.Pattern[str],
    input_text: str | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """Run a long command, pass its interesting lines and a heartbeat to PROGRESS, return all output."""
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            list(cmd),
            stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
    except FileNotFoundError as exc:
        raise LabStepError(step, cmd[0], f"command not found ({exc})", fix) from exc
    if input_text is not None:
        assert process.stdin is not None
        process.stdin.write(input_text)
        process.stdin.close()
    lines: queue.Queue[str | None] = queue.Queue()
    # a reader thread, so the heartbeat keeps coming while the command is silent (pip installing)
    threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True).start()
    output: list[str] = []
    last_report = started
    while True:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            line = ""
        if line is None:
            break
        now = time.monotonic()
        if line:
            output.append(line)
        if line and interesting.search(line):
            progress(f"{step}: {line[:160]}")
            last_report = now
        elif now - last_report >= HEARTBEAT_S:
            last = f" … {output[-1][:120]}" if output else ""
            progress(f"{step}: still running ({now - started:.0f} s){last}")
            last_report = now
        if now - started > timeout:
            process.kill()
            raise LabStepError(step, " ".join(cmd), f"timed out after {timeout:.0f} s", fix)
    returncode = process.wait()
    if returncode != 0:
        raise LabStepError(step, " ".join(cmd), f"exit {returncode}: {' | '.join(output[-6:])}", fix)
    return "\n".join(output)


def _pump(stream, lines: "queue.Queue[str | None]") -> None:
    for line in stream:
        lines.put(line.rstrip())
    lines.put(None)
