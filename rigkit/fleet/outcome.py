"""What a pyinfra run did to each rig, read from its output: ok, failed (the step and the reason), unreachable,
aborted or not run (rigkit deploy's summary, rigkit.rollout.run's stages)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Optional

from rigkit.operations import REFUSED_PREFIX
from rigkit.operations.serving import PULL_STEP
from rigkit.remote.registry import registry_failure

REASON_CHARS = 1200  # a reason is kept whole up to this (under the table); the table's column is cut
OK, FAILED, UNREACHABLE, ABORTED, NOT_RUN = "ok", "failed", "unreachable", "aborted", "not run"
DRY_RUN = "dry run"  # reached, prepared, nothing changed (pyinfra --dry): its changes are in pyinfra's table above
DRY_RUN_REASON = 'nothing changed: --dry shows what would, in pyinfra\'s "Detected changes" table above'
# the line that ends a run: its results, or a dry run's table of what would change
RESULTS_LINE, DETECTED_CHANGES_LINE = "--> Results:", "--> Detected changes:"

ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
HOST_LINE_RE = re.compile(r"^\s*\[(?P<host>[^\]\s]+)\]\s*(?P<text>.*)$")
RAISED_RE = re.compile(r"^(?:[\w.]+\.)?(?P<type>\w*(?:Error|Exception)): (?P<msg>.+)$")
# pyinfra's own line for an error that stopped the run (a rigkit refusal while preparing is one)
RUN_ERROR_RE = re.compile(r"^--> pyinfra error(?: in .*? line \d+)?: (?P<msg>.+)$")
OPERATION_RE = re.compile(r"^--> Starting operation: (?P<name>.*?)\s*$")
CALLBACK_ERROR_RE = re.compile(
    r"Unexpected error in Python callback: (?P<type>\w+)\((?P<quote>['\"])(?P<msg>.*)(?P=quote),?\)$"
)
# pyinfra's own line for a failed operation ("Error" or "Error: executed N commands"), not a command's
# output that starts with the word (docker's "Error response from daemon: ...")
PYINFRA_ERROR_RE = re.compile(r"^Error(?::|$)")
# Lines pyinfra prints per host that are bookkeeping, not the reason for a failure.
NOT_A_REASON = (
    "Connected",
    "Ready:",
    "Success",
    "No changes",
    "Error:",
    "Error (ignored)",
    "Loaded fact",
    "Traceback",
    "File ",
    "^",
    "Unexpected error in Python callback",
)


@dataclass
class RigOutcome:
    rig: str
    status: str = OK
    step: str = ""
    reason: str = ""
    release: str = ""
    notes: list[str] = field(default_factory=list)


def _clean(line: str) -> str:
    return ANSI_RE.sub("", line).rstrip()


def _short(text: str, limit: int = REASON_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _reason_from(lines: list[str], operation: Optional[str] = None) -> str:
    """The most telling of a host's lines before its Error: a rigkit refusal's line, a raised RigkitError's
    message (pyinfra's "Unexpected error in Python callback"), else the last output line; a failed pull's
    docker error is worded by what it says of the registry (rigkit.remote.registry.registry_failure)."""
    for text in reversed(lines):
        if text.startswith(REFUSED_PREFIX):
            return text[len(REFUSED_PREFIX) :]
        match = CALLBACK_ERROR_RE.search(text)
        if match:
            return match.group("msg").replace("\\n", " ").replace("\\r", " ")  # repr's escapes
    for text in reversed(lines):
        if text and not text.startswith(NOT_A_REASON) and not text.startswith("noop:"):
            if operation and operation.endswith(PULL_STEP):
                failure = registry_failure(text)
                return f"{failure.problem}. Fix: {failure.fix} (docker: {text})"
            return text
    return ""


def summarize(output: str, hosts: Iterable[str] = (), dry_run: bool = False) -> dict[str, RigOutcome]:
    """Per-rig outcome from pyinfra's output (stdout and stderr together, in order).

    ``hosts`` are the rigs the run targeted: one that never shows up is reported as not reached. A ``dry_run``
    (pyinfra --dry without -y) ends at its table of detected changes; a rig it prepared without error is DRY_RUN.
    """
    outcomes: dict[str, RigOutcome] = {name: RigOutcome(name) for name in hosts}
    recent: dict[str, list[str]] = {}
    operation: Optional[str] = None
    run_error = last_exception = ""
    finished = False
    for raw in output.splitlines():
        line = _clean(raw)
        op = OPERATION_RE.match(line)
        if op:
            operation = op.group("name")
            continue
        if line.startswith(DETECTED_CHANGES_LINE if dry_run else RESULTS_LINE):
            finished = True
        stopped = RUN_ERROR_RE.match(line)
        if stopped:
            run_error = stopped.group("msg").strip()
        exception = RAISED_RE.match(line)
        if exception:  # the run's own end when nothing follows (bad input while preparing); else a host's
            last_exception = f"{exception.group('type')}: {exception.group('msg')}"
        match = HOST_LINE_RE.match(line)
        if not match:
            continue
        name, text = match.group("host"), match.group("text").strip()
        outcome = outcomes.setdefault(name, RigOutcome(name))
        history = recent.setdefault(name, [])
        if operation is None and text.startswith(("Could not connect", "Connection", "Host key", "Authentication")):
            outcome.status, outcome.step, outcome.reason = UNREACHABLE, "connect", _short(text)
        elif text.startswith("Error (ignored)"):
            outcome.notes.append(f"{operation}: {_short(_reason_from(history, operation))}")
        elif PYINFRA_ERROR_RE.match(text) and outcome.status == OK:
            outcome.status, outcome.step = FAILED, operation or "prepare"
            own = text.partition(":")[2].strip()
            telling = own and not own.startswith("executed ")
            outcome.reason = _short(own if telling else _reason_from(history, operation) or text)
        history.append(text)
        del history[:-40]
    if not finished and not run_error:
        run_error = last_exception
    for name, outcome in outcomes.items():
        if name not in recent:
            outcome.status, outcome.step = NOT_RUN, "-"
            outcome.reason = _short(run_error or "pyinfra never reported this rig (check --limit and the inventory)")
        elif outcome.status == OK and (run_error or not finished):
            outcome.status, outcome.step = ABORTED, operation or "prepare"
            outcome.reason = _short(run_error or "the run stopped before this rig finished")
        elif outcome.status == OK and dry_run:
            outcome.status, outcome.step, outcome.reason = DRY_RUN, "-", DRY_RUN_REASON
    return outcomes
