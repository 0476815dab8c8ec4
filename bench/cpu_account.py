"""Where a lab run's CPU goes: the controller's process and each lab rig's container, and the bytecode the runs load.

The lab's rigs are containers on the controller's own cores, so whatever a rig runs for a deploy (sshd, the lock,
the survey, the operations' fact batch, the docker CLI and its engine) competes with the controller and with the
other rigs: on N rigs a no-op's wall time grows with N times a rig's CPU, which on a real fleet each rig spends
on its own cores. The benches print both figures beside the wall time, so the two causes can be told apart.

- The controller: ``resource.getrusage(RUSAGE_CHILDREN)`` (user + system) around a run, the run being a child
  of the bench that it waited for.
- A rig: its container's cgroup CPU counter (v1 ``cpuacct.usage``, v2 ``cpu.stat`` usage_usec), read from the
  controller; it holds everything the rig ran, its idle engine included (a few ms per second).
"""

from __future__ import annotations

import compileall
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

CGROUP = Path("/sys/fs/cgroup")


def _container_id(container: str) -> Optional[str]:
    result = subprocess.run(
        ["docker", "inspect", "--format", "{{.Id}}", container], capture_output=True, text=True, timeout=30
    )
    return result.stdout.strip() or None


def _counter(container_id: str) -> Optional[Path]:
    for path in (
        CGROUP / "cpuacct" / "docker" / container_id / "cpuacct.usage",  # v1, docker's cgroupfs driver
        CGROUP / "cpu,cpuacct" / "docker" / container_id / "cpuacct.usage",
        CGROUP / "system.slice" / f"docker-{container_id}.scope" / "cpu.stat",  # v2, systemd driver
        CGROUP / "docker" / container_id / "cpu.stat",  # v2, cgroupfs driver
    ):
        if path.exists():
            return path
    return None


def _seconds(counter: Path) -> float:
    text = counter.read_text()
    if counter.name == "cpu.stat":
        fields = dict(line.split() for line in text.splitlines() if line.strip())
        return int(fields["usage_usec"]) / 1e6
    return int(text) / 1e9


def _controller_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class CpuSpent:
    controller_s: float
    rigs_s: Optional[float]  # None: the rigs' cgroup counters were not found
    rigs: int

    @classmethod
    def median(cls, samples: list["CpuSpent"]) -> "CpuSpent":
        """Each figure's median over several runs of the same command."""
        rigs = [sample.rigs_s for sample in samples]
        return cls(
            statistics.median(sample.controller_s for sample in samples),
            None if None in rigs else statistics.median(rigs),
            samples[0].rigs,
        )

    def describe(self) -> str:
        if self.rigs_s is None:
            return f"CPU: controller {self.controller_s:.2f} s, rigs n/a"
        return (
            f"CPU: controller {self.controller_s:.2f} s, rigs {self.rigs_s:.2f} s "
            f"({self.rigs_s / max(self.rigs, 1):.2f} s per rig)"
        )


class CpuAccount:
    """CPU spent by the controller's child runs and by the given lab rigs' containers, between start() and stop()."""

    def __init__(self, containers: Iterable[str]):
        ids = [_container_id(container) for container in containers]
        counters = [_counter(container_id) if container_id else None for container_id in ids]
        self.counters = None if None in counters or not counters else counters
        self.rigs = len(ids)
        self._start = (0.0, 0.0)

    def _now(self) -> tuple[float, float]:
        rigs = sum(_seconds(counter) for counter in self.counters) if self.counters else 0.0
        return _controller_seconds(), rigs

    def start(self) -> "CpuAccount":
        self._start = self._now()
        return self

    def stop(self) -> CpuSpent:
        controller, rigs = self._now()
        return CpuSpent(
            controller_s=controller - self._start[0],
            rigs_s=(rigs - self._start[1]) if self.counters else None,
            rigs=self.rigs,
        )


def idle_rate(containers: Iterable[str], seconds: float = 5.0) -> Optional[float]:
    """CPU-seconds per second each rig spends at rest (its engine, its daemons) over ``seconds``: the share of a
    run's rig CPU that is not the run's (None when the counters are not found)."""
    account = CpuAccount(containers).start()
    time.sleep(seconds)
    spent = account.stop()
    return None if spent.rigs_s is None else spent.rigs_s / seconds / max(spent.rigs, 1)


def precompile(root: Path) -> None:
    """Write the checkout's bytecode before anything is timed. An installed rigkit (a wheel) has it; an editable
    checkout writes it on its first run, unless PYTHONDONTWRITEBYTECODE is set (as on this lab's machine), when
    every run compiles rigkit's modules again (~0.08 s of a no-op's controller CPU, a cost no user pays)."""
    for folder in ("rigkit", "roles"):  # the deploy files and the inventory pyinfra compiles itself, every run
        compileall.compile_dir(str(root / folder), quiet=1)


if __name__ == "__main__":  # a quick look: python bench/cpu_account.py CONTAINER... -- COMMAND...
    split = sys.argv.index("--")
    account = CpuAccount(sys.argv[1:split]).start()
    subprocess.run(sys.argv[split + 1 :])
    print(account.stop().describe())
