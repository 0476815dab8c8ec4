"""Deploy timings on the lab (printed as a table, never asserted): the fleet targets of issue 4.

    sudo .venv/bin/python bench/deploy_bench.py [--rigs rig4,rig5,rig6,rig8] [--skip-first]

- first deploy of cpu-lab release 1 to 1, 2 and 4 rigs at once (the stack, its files and its ledger are
  removed first; the rig keeps its engine, its L2 disk and the image, so no pull is timed), and the no-op
  re-deploy right after; the parallel scaling ratio is N rigs / 1 rig;
- upgrade release 1 -> 2 on one rig: wall time and how long /v1/models did not answer (polled every 0.2 s);
- rollback.py to release 1, which the rig keeps: wall time, API unavailability (down + up + engine start),
  the toolkit's overhead (the rest: SSH, facts, rendering, smoke, ledger) and image pulls seen by the rig's
  engine (`docker events`), which must be none (0 bytes).

Rigs are host-network lab rigs named with --rigs (default: the last four host-network rigs of the lab);
the lab must be up (`rigkit lab up --rigs N`). Every vLLM start costs ~3 GB of RAM.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import requests

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from rigkit.lab.pyinfra_output import parse_results  # noqa: E402
from rigkit.lab.state import RigState, read_state  # noqa: E402
from rigkit.serving.ledger import LEDGER_PATH  # noqa: E402
from rigkit.paths import RIG_STACK_DIR, RIG_STATE_DIR  # noqa: E402
from rigkit.fleet.pyinfra_args import pyinfra_executable  # noqa: E402
from rigkit.serving.render import CONTAINER_NAME  # noqa: E402

INVENTORY = REPO_ROOT / "inventory" / "lab.py"
POLL_S = 0.2
TARGETS = {"noop_per_rig_s": 3.0, "scaling_4_vs_1": 1.5, "rollback_overhead_s": 5.0}


def rig_shell(rig: RigState, command: str) -> str:
    return subprocess.run(["docker", "exec", rig.container, "bash", "-c", command], capture_output=True,
                          text=True, timeout=600).stdout


def pyinfra(rigs: list[RigState], deploy: str, *data: str) -> tuple[float, str]:
    args = [pyinfra_executable(), "-y"]
    for rig in rigs:
        args += ["--limit", rig.name]
    for item in data:
        args += ["--data", item]
    started = time.monotonic()
    result = subprocess.run(args + [str(INVENTORY), deploy], cwd=REPO_ROOT, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    if result.returncode != 0:
        raise SystemExit(f"pyinfra {deploy} failed on {[r.name for r in rigs]}:\n{output[-4000:]}")
    total = parse_results(output).get("Grand total")
    return elapsed, ("changed" if total and total.success else "no change" if total else "?")


def remove_stack(rig: RigState) -> None:
    rig_shell(rig, f"docker rm -f {CONTAINER_NAME} >/dev/null 2>&1; rm -rf {RIG_STACK_DIR} "
                   f"{RIG_STATE_DIR}/release.sha256 {LEDGER_PATH}")


class Availability:
    """Polls /v1/models in a thread; the longest stretch it did not answer is the downtime, and ``back_at``
    (wall-clock time, comparable with the engine's container start) when it last answered again."""

    def __init__(self, rig: RigState):
        self.url = f"http://127.0.0.1:{rig.serving_port}/v1/models"
        self.down_since: float | None = None
        self.longest = 0.0
        self.back_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                up = requests.get(self.url, timeout=1).status_code == 200
            except requests.RequestException:
                up = False
            now = time.monotonic()
            if not up and self.down_since is None:
                self.down_since = now
            elif up and self.down_since is not None:
                self.longest = max(self.longest, now - self.down_since)
                self.down_since = None
                self.back_at = time.time()
            time.sleep(POLL_S)

    def __enter__(self) -> "Availability":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Row:
    what: str
    rigs: int
    seconds: float
    note: str = ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rigs", help="comma-separated rig names (4 for the full table)")
    parser.add_argument("--skip-first", action="store_true", help="skip the first-deploy rows (no vLLM restarts "
                        "for the scaling part)")
    args = parser.parse_args()
    state = read_state()
    by_name = {rig.name: rig for rig in state.rigs}
    names = args.rigs.split(",") if args.rigs else [r.name for r in state.rigs if not r.netns][-4:]
    rigs = [by_name[name] for name in names]
    release_1, release_2 = state.serving_image["releases"]["1"], state.serving_image["releases"]["2"]
    rows: list[Row] = []
    counts = sorted({1, min(2, len(rigs)), len(rigs)})

    first: dict[int, float] = {}
    noop: dict[int, float] = {}
    for count in counts:
        group = rigs[:count]
        if not args.skip_first:
            for rig in group:
                remove_stack(rig)
            first[count], outcome = pyinfra(group, "deploy.py", f"serving_image={release_1}")
            rows.append(Row("first deploy (image cached)", count, first[count], outcome))
        else:
            pyinfra(group, "deploy.py", f"serving_image={release_1}")
        noop[count], outcome = pyinfra(group, "deploy.py", f"serving_image={release_1}")
        rows.append(Row("no-op re-deploy", count, noop[count], f"{outcome}; {noop[count] / count:.2f} s per rig"))

    rig = rigs[0]
    with Availability(rig) as availability:
        upgrade_s, _ = pyinfra([rig], "deploy.py", f"serving_image={release_2}")
    rows.append(Row("upgrade release 1 -> 2", 1, upgrade_s, f"/v1/models unavailable {availability.longest:.1f} s"))

    since = rig_shell(rig, "date +%s").strip()
    with Availability(rig) as availability:
        rollback_s, _ = pyinfra([rig], "rollback.py")
    pulls = rig_shell(rig, f"docker events --since {since} --until $(date +%s) --filter type=image "
                           "--filter event=pull").strip().splitlines()
    serving = rig_shell(rig, f"docker inspect --format '{{{{.Config.Image}}}}' {CONTAINER_NAME}").strip()
    overhead = rollback_s - availability.longest
    rows.append(Row("rollback to cached release 1", 1, rollback_s,
                    f"unavailable {availability.longest:.1f} s (down+up+engine start); toolkit overhead "
                    f"{overhead:.1f} s; image pulls {len(pulls)} (0 bytes pulled: {not pulls}); "
                    f"serving release 1: {serving == release_1}"))

    ram_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    print(f"\nmachine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, {ram_gib} GiB RAM; "
          f"rigs {', '.join(names)}")
    print(f"{'measurement':<32} {'rigs':>4} {'seconds':>8}  note")
    for row in rows:
        print(f"{row.what:<32} {row.rigs:>4} {row.seconds:>8.1f}  {row.note}")
    if len(counts) > 1:
        top = counts[-1]
        print(f"\nparallel scaling, {top} rigs vs 1: no-op {noop[top] / noop[1]:.2f}x"
              + (f", first deploy {first[top] / first[1]:.2f}x" if first else "")
              + f" (target <= {TARGETS['scaling_4_vs_1']}x)")
    print(f"targets: no-op <= {TARGETS['noop_per_rig_s']} s per rig; rollback overhead <= "
          f"{TARGETS['rollback_overhead_s']} s with 0 bytes pulled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
