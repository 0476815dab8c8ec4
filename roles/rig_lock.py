"""rig_lock: one deploy at a time on a rig; a second one waits (up to rig_lock_wait_s) or is refused.

The lock is an flock on ``LOCK_PATH`` held by a process on the rig for as long as this controller's SSH
connection lives: it is taken before any fact of the deploy is read (so the plan is made from the state
the previous deploy left) and it is released when the run ends, however it ends. A killed controller's
connection closes, the rig-side holder gets end-of-file and exits, and a re-run finds the lock free.
A holder that outlives that is stale and is ended (taken over) when
- it was started by this controller host and its controller pid no longer runs, or
- it is older than ``rig_lock_stale_s``.
``HOLDER_PATH`` says who holds the lock (controller host, pid, start time, command), for the waiting
deploy's message and for the staleness decision.

deploy.py runs this first (roles.PIPELINE); rollback.py calls it itself. A rig whose lock cannot be taken
gets one failing operation ("Rig lock") and nothing else. Its variables: rigkit.settings.defaults (section rig_lock).
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

from pyinfra import host
from pyinfra.operations import python

from rigkit.operations import refuse, say
from rigkit.paths import RIG_STATE_DIR
from rigkit.settings.hostdata import RigSettings
from rigkit.survey import SurveyScript
from roles import Run

LOCK_FILE, HOLDER_FILE = "deploy.lock", "deploy.lock.holder"
LOCK_PATH = f"{RIG_STATE_DIR}/{LOCK_FILE}"
HOLDER_PATH = f"{RIG_STATE_DIR}/{HOLDER_FILE}"
EXIT_TIMEOUT = 3
# Seconds the controller allows for the rig to answer, on top of the wait itself.
CHANNEL_SLACK_S = 60


@dataclass(frozen=True)
class Holder:
    """Who holds a rig's lock, as written in HOLDER_PATH."""

    controller: str
    pid: int
    started: float  # epoch seconds on the rig's clock
    rig_pid: int  # the rig-side process keeping the flock
    command: str = ""

    def to_line(self) -> str:
        return (
            f"controller={self.controller} pid={self.pid} started={self.started:.0f} "
            f"rig_pid={self.rig_pid} command={self.command}"
        )

    @classmethod
    def from_line(cls, line: str) -> Optional["Holder"]:
        head, _, command = line.strip().partition(" command=")
        fields = dict(part.split("=", 1) for part in head.split() if "=" in part)
        try:
            return cls(
                fields["controller"], int(fields["pid"]), float(fields["started"]), int(fields["rig_pid"]), command
            )
        except (KeyError, ValueError):
            return None

    def describe(self, now: float) -> str:
        return (
            f"controller {self.controller} pid {self.pid} since {now - self.started:.0f} s "
            f"({(self.command or 'unknown command')[:80]})"
        )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_reason(
    holder: Holder, now: float, controller: str, stale_after_s: int, is_alive: Callable[[int], bool] = pid_alive
) -> Optional[str]:
    """Why the holder's lock may be taken over, or None while it must be respected."""
    if holder.controller == controller and not is_alive(holder.pid):
        return f"its controller pid {holder.pid} on {controller} is gone"
    if now - holder.started > stale_after_s:
        return f"held {now - holder.started:.0f} s > rig_lock_stale_s {stale_after_s}"
    return None


def lock_script(
    holder_fields: str, wait_s: int, state_dir: str = RIG_STATE_DIR, survey: Optional[SurveyScript] = None
) -> str:
    """Rig-side: take the flock (asking the controller what to do when it is held), then hold it until EOF.

    Protocol on stdout: "HELD <holder line>" (the controller answers "WAIT" or "TAKEOVER" on stdin),
    then "LOCKED", or "TIMEOUT <holder line>" and exit status EXIT_TIMEOUT. With ``survey``, the survey's
    output and its end line follow "LOCKED": it runs once the flock is held, by the holder, so it reads
    the state the previous deploy left, as a survey read after the lock would; its commands get neither
    the controller's stdin nor the lock's descriptor (a process they leave behind cannot keep the lock).
    """
    lock_path, holder_path = f"{state_dir}/{LOCK_FILE}", f"{state_dir}/{HOLDER_FILE}"
    return (
        f"""set -u
mkdir -p {state_dir} && exec 9>>{lock_path} || exit 4
if ! flock -n 9; then
  echo "HELD $(cat {holder_path} 2>/dev/null)"
  read -r verdict || exit 5
  if [ "$verdict" = TAKEOVER ]; then
    stale=$(sed -n 's/.* rig_pid=\\([0-9]*\\).*/\\1/p' {holder_path})
    [ -n "$stale" ] && kill "$stale" 2>/dev/null
  fi
  flock -w {int(wait_s)} 9 || {{ echo "TIMEOUT $(cat {holder_path} 2>/dev/null)"; exit {EXIT_TIMEOUT}; }}
fi
umask 077
printf '%s\\n' "{holder_fields} started=$(date +%s) rig_pid=$$ command=$RIGKIT_LOCK_COMMAND" > {holder_path}
chmod 600 {holder_path}
echo LOCKED
"""
        + (f"( set +u\n{survey.script}\n) </dev/null 2>/dev/null 9>&-\necho '{survey.end_line}'\n" if survey else "")
        + """exec cat >/dev/null
"""
    )


def this_command(argv: Optional[list[str]] = None) -> str:
    """The controller's command for the holder file: the program and its files (inventory, deploy), no
    option and no value (``--data hf_token=...`` must never reach the rig)."""
    argv = sys.argv if argv is None else argv
    files = [arg for arg in argv[1:] if arg.endswith(".py") and not arg.startswith("-") and "=" not in arg]
    return " ".join([os.path.basename(argv[0]) if argv else "?", *files]).replace("\n", " ")[:200]


def survey_output(reader, end_line: str) -> Optional[list[str]]:
    """The survey's lines up to its end line; None when the channel ended first (the lock is not held)."""
    lines = []
    for line in reader:
        line = line.rstrip("\n")
        if line == end_line:
            return lines
        lines.append(line)
    return None


# Channels that keep each rig's lock held until this process ends.
_HELD: dict[str, object] = {}


def _wrap_for_host(script: str) -> str:
    command = f"env RIGKIT_LOCK_COMMAND={shlex.quote(this_command())} sh -c {shlex.quote(script)}"
    return f"sudo -n {command}" if host.data.get("_sudo") else command


def rig_lock(rig: RigSettings, run: Run) -> None:
    """Hold this rig's deploy lock for the rest of the run; when refused, a failing operation and
    ``run.refused_by``."""
    if host.name in _HELD:
        return
    survey = SurveyScript(rig) if run.survey_with_lock and run.survey is None else None
    wait_s, stale_s = rig.rig_lock["rig_lock_wait_s"], rig.rig_lock["rig_lock_stale_s"]
    controller = socket.gethostname()
    client = getattr(host.connector, "client", None)
    if client is None:  # not an SSH host (e.g. @local in tests): nothing to lock against
        say(host, "rig_lock: skipped, not an SSH connection")
        return
    channel = client.get_transport().open_session()
    channel.settimeout(wait_s + CHANNEL_SLACK_S)
    channel.exec_command(
        _wrap_for_host(lock_script(f"controller={controller} pid={os.getpid()}", wait_s, survey=survey))
    )
    reader = channel.makefile("r")
    first = reader.readline().strip()
    if first.startswith("HELD"):
        holder = Holder.from_line(first[len("HELD") :])
        now = time.time()
        reason = stale_reason(holder, now, controller, stale_s) if holder else None
        if reason:
            say(host, f"rig_lock: taking over a stale lock ({holder.describe(now)}): {reason}")
        else:
            who = holder.describe(now) if holder else "an unknown holder"
            say(host, f"rig_lock: another deploy holds this rig ({who}); waiting up to {wait_s} s (rig_lock_wait_s)")
        channel.sendall(b"TAKEOVER\n" if reason else b"WAIT\n")
        first = reader.readline().strip()
    if first == "LOCKED" and survey is not None:
        output = survey_output(reader, survey.end_line)
        if output is not None:
            run.survey = survey.state(host, output)
        else:
            first = "the lock's holder ended during the survey"
    if first == "LOCKED":
        _HELD[host.name] = channel
        return
    channel.close()
    if first.startswith("TIMEOUT"):
        holder = Holder.from_line(first[len("TIMEOUT") :])
        who = holder.describe(time.time()) if holder else "an unknown holder"
        problem = f"another deploy holds this rig's lock ({who}) and did not finish within rig_lock_wait_s={wait_s}"
        fix = (
            f"let that deploy finish and re-run, or raise rig_lock_wait_s; a lock older than "
            f"rig_lock_stale_s={stale_s} is taken over"
        )
    else:
        problem = f"could not take {LOCK_PATH} on the rig (answer {first!r}; flock from util-linux is required)"
        fix = "check that the rig has flock and that /var/lib/rigkit is writable"
    python.call(name="Rig lock", function=refuse, field="rig_lock", value=host.name, problem=problem, fix=fix)
    run.refused_by = "rig_lock"
