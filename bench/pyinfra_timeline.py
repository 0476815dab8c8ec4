"""Where a pyinfra run spends its wall time: each output line stamped as it arrives, cut into pyinfra's phases.

pyinfra 3.10's CLI (pyinfra_cli/cli.py) logs a line as it enters each phase: "--> Loading config...",
"--> Loading inventory...", "--> Connecting to hosts...", "--> Preparing operation files...", "--> Skipping
change detection" (with -y), "--> Beginning operation run...", "--> Results:". The time before the first is the
Python start and pyinfra_cli's imports; "prepare" holds deploy.py's own imports, the rig lock, the survey and
the operations' generation; "execute" holds every operation (for a rollback, the engine's stop and start); the
time after "Results" is the table, then the disconnect and the interpreter's exit. "--> Starting operation: NAME" lines time each operation.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Optional, Sequence

# (marker that opens the phase, the phase's name); the phase before the first marker is START
START = "python start, pyinfra imports"
PHASES = (
    ("--> Loading config", "config"),
    ("--> Loading inventory", "inventory"),
    ("--> Connecting to hosts", "connect"),
    ("--> Preparing operation files", "prepare (deploy imports, lock, survey, operations)"),
    ("--> Skipping change detection", "prepare (deploy imports, lock, survey, operations)"),
    ("--> Gathering facts", "fact"),
    ("--> Beginning operation run", "execute"),
    ("--> Results", "results"),
    ("--> Disconnecting from hosts", "disconnect, exit"),
)
OPERATION_MARKER = "--> Starting operation: "
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Timeline:
    """One run's output, each line with the seconds since the process started."""

    lines: tuple[tuple[float, str], ...]
    wall_s: float
    returncode: int

    @property
    def output(self) -> str:
        return "\n".join(text for _, text in self.lines)

    def phases(self) -> list[tuple[str, float]]:
        """Each phase and its seconds, in order; phases with the same name (prepare's two markers) merged."""
        cuts: list[tuple[float, str]] = [(0.0, START)]
        for stamp, text in self.lines:
            for marker, name in PHASES:
                if text.lstrip().startswith(marker):
                    cuts.append((stamp, name))
                    break
        cuts.append((self.wall_s, ""))
        merged: dict[str, float] = {}
        for (start, name), (end, _) in zip(cuts, cuts[1:]):
            merged[name] = merged.get(name, 0.0) + end - start
        return list(merged.items())

    def operations(self) -> list[tuple[str, float]]:
        """Each operation of the execute phase and its seconds (to the next operation or the results)."""
        starts = [
            (stamp, text.split(OPERATION_MARKER, 1)[1].strip())
            for stamp, text in self.lines
            if OPERATION_MARKER in text
        ]
        end = next((stamp for stamp, text in self.lines if text.lstrip().startswith("--> Results")), self.wall_s)
        return [(name, later - stamp) for (stamp, name), (later, _) in zip(starts, starts[1:] + [(end, "")])]

    def summary(self, slowest: int = 3) -> str:
        """One line: each phase's seconds, then the slowest operations."""
        phases = ", ".join(f"{name} {seconds:.2f}" for name, seconds in self.phases())
        top = sorted(self.operations(), key=lambda item: -item[1])[:slowest]
        ops = "; ".join(f"{name} {seconds:.2f}" for name, seconds in top)
        return f"{phases}" + (f" | slowest operations: {ops}" if ops else "")


def run_timed(argv: Sequence[str], cwd: Optional[str] = None, env: Optional[dict] = None) -> Timeline:
    """Run ``argv``, stamping each line of its merged stdout and stderr as it arrives."""
    started = time.monotonic()
    process = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    lines = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append((time.monotonic() - started, ANSI.sub("", line.rstrip("\n"))))
    returncode = process.wait()
    return Timeline(tuple(lines), time.monotonic() - started, returncode)
