"""Deploy timings on the lab (printed as a table, never asserted): the targets of issues 4 and 26.

    sudo .venv/bin/python bench/deploy_bench.py [--rigs rig4,rig5,rig6,rig8] [--skip-first]

- first deploy of cpu-lab release 1 to 1, 2 and 4 rigs at once (the stack, its files and its ledger are
  removed first; the rig keeps its engine, its L2 disk and the image, so no pull is timed), and the no-op
  re-deploy right after; the parallel scaling ratio is N rigs / 1 rig;
- upgrade release 1 -> 2 on one rig: wall time and how long /v1/models did not answer (polled every 0.2 s);
- rollback.py to release 1, which the rig keeps: wall time, API unavailability (down + up + engine start),
  the toolkit's overhead (the rest: SSH, facts, rendering, smoke, ledger) and image pulls seen by the rig's
  engine (`docker events`), which must be none (0 bytes); the upgrade's overhead likewise (release 2 is put on
  the rig first, so the upgrade pulls nothing either);
- pyinfra's floor (`pyinfra INVENTORY fact server.Hostname`) on 1 and N rigs in the same run, and the fact round
  trips of a no-op on one rig (the lock's channel, which carries the survey, and each command `-vvv` logs:
  deterministic, unlike wall time on a shared machine).
Each step prints a line as it starts; the end prints every target with met / NOT MET and its figure.

Rigs are host-network lab rigs named with --rigs (default: the last four host-network rigs of the lab);
the lab must be up (`rigkit lab up --rigs N`). Every vLLM start costs ~3 GB of RAM.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import requests

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_account import CpuAccount, CpuSpent, idle_rate, precompile  # noqa: E402
from pyinfra_timeline import Timeline, run_timed  # noqa: E402

from rigkit.fleet.pyinfra_args import pyinfra_executable  # noqa: E402
from rigkit.lab.lab_model import stage_on_lab_rigs  # noqa: E402
from rigkit.lab.pyinfra_output import parse_results  # noqa: E402
from rigkit.lab.state import RigState, read_state  # noqa: E402
from rigkit.paths import RIG_STACK_DIR, RIG_STATE_DIR  # noqa: E402
from rigkit.serving.ledger import LEDGER_PATH  # noqa: E402
from rigkit.serving.render import CONTAINER_NAME  # noqa: E402

INVENTORY = REPO_ROOT / "inventory" / "lab.py"
POLL_S = 0.2
# issue 26's targets
NOOP_VS_FLOOR = 2.0  # a no-op within this many times pyinfra's one-fact floor, on 1 and on N rigs
SCALING_N_VS_1 = 1.2  # a no-op on N rigs within this many times one rig
OVERHEAD_S = 3.0  # a rollback's (and an upgrade's, image on the rig) overhead on top of down+up+start
NOOP_ROUND_TRIPS = 2  # round trips per rig in a no-op, the lock's channel included
LOCK_CHANNEL = 1  # the rig lock's channel: the survey's one round trip
FLOOR_FACT = "server.Hostname"


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def verdict(target: str, met: bool, figure: str) -> str:
    return f"  [{'met' if met else 'NOT MET'}] {target}: {figure}"


def floor(rigs: list[RigState]) -> float:
    args = [
        pyinfra_executable(),
        "-y",
        *[arg for rig in rigs for arg in ("--limit", rig.name)],
        str(INVENTORY),
        "fact",
        FLOOR_FACT,
    ]
    account = CpuAccount(rig.container for rig in rigs).start()
    started = time.monotonic()
    result = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    LAST_CPU[0] = account.stop()
    if result.returncode != 0:
        raise SystemExit(f"pyinfra fact failed:\n{(result.stdout + result.stderr)[-4000:]}")
    return elapsed


def scaling_estimate(one_s: float, one: CpuSpent, many: CpuSpent, count: int) -> str:
    """The wall time the CPU a no-op on ``count`` rigs adds to one rig's accounts for, on this machine's cores (all of
    it shared: the lab), and where each rig has cores of its own (a fleet: the controller's share only)."""
    cores = os.cpu_count() or 1
    added = (many.rigs_s + many.controller_s) - (one.rigs_s + one.controller_s)
    shared = one_s + added / cores
    controller_added = many.controller_s - one.controller_s
    fleet = one_s + controller_added
    return (
        f"    derived from these figures: the {count - 1} more rigs add {added:.2f} CPU-s (rigs and controller); "
        f"spread over {cores} cores that is {added / cores:.2f} s, ~{shared / one_s:.2f}x one rig from CPU alone "
        f"(what this lab's shared cores set); with each rig on cores of its own only the controller's "
        f"+{controller_added:.2f} CPU-s would remain: ~{fleet / one_s:.2f}x (a projection, "
        "not measured)"
    )


def noop_round_trips(rig: RigState) -> int:
    """Round trips of a no-op deploy on one rig: the rig lock's channel, which carries the survey (roles.rig_lock),
    and each command pyinfra -vvv logs (">>> ": in a no-op, the operations' one fact batch)."""
    result = subprocess.run(
        [pyinfra_executable(), "-y", "-vvv", "--limit", rig.name, str(INVENTORY), "deploy.py"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    return LOCK_CHANNEL + (result.stdout + result.stderr).count(">>> ")


def rig_shell(rig: RigState, command: str) -> str:
    return subprocess.run(
        ["docker", "exec", rig.container, "bash", "-c", command], capture_output=True, text=True, timeout=600
    ).stdout


def pyinfra(rigs: list[RigState], deploy: str, *data: str) -> tuple[float, str]:
    args = [pyinfra_executable(), "-y"]
    for rig in rigs:
        args += ["--limit", rig.name]
    for item in data:
        args += ["--data", item]
    account = CpuAccount(rig.container for rig in rigs).start()
    timeline = run_timed(args + [str(INVENTORY), deploy], cwd=str(REPO_ROOT))
    LAST_CPU[0] = account.stop()
    output = timeline.output
    if timeline.returncode != 0:
        raise SystemExit(f"pyinfra {deploy} failed on {[r.name for r in rigs]}:\n{output[-4000:]}")
    LAST_TIMELINE[0] = timeline
    total = parse_results(output).get("Grand total")
    return timeline.wall_s, ("changed" if total and total.success else "no change" if total else "?")


# the last pyinfra run's timeline, for the profile lines
LAST_TIMELINE: list[Timeline] = [Timeline((), 0.0, 0)]
# the last pyinfra run's CPU, the controller's and the rigs' (bench/cpu_account.py)
LAST_CPU: list[CpuSpent] = [CpuSpent(0.0, None, 0)]


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} (1 / 5 / 15 min) on {os.cpu_count()} cores"


def remove_stack(rig: RigState) -> None:
    rig_shell(
        rig,
        f"docker rm -f {CONTAINER_NAME} >/dev/null 2>&1; rm -rf {RIG_STACK_DIR} "
        f"{RIG_STATE_DIR}/release.sha256 {LEDGER_PATH}",
    )


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


def image_pulls(rig: RigState, since: str) -> list[str]:
    return (
        rig_shell(rig, f"docker events --since {since} --until $(date +%s) --filter type=image --filter event=pull")
        .strip()
        .splitlines()
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rigs", help="comma-separated rig names (4 for the full table)")
    parser.add_argument(
        "--skip-first", action="store_true", help="skip the first-deploy rows (no vLLM restarts for the scaling part)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per no-op and floor figure (the median is shown)")
    args = parser.parse_args()
    state = read_state()
    by_name = {rig.name: rig for rig in state.rigs}
    names = args.rigs.split(",") if args.rigs else [r.name for r in state.rigs if not r.netns][-4:]
    rigs = [by_name[name] for name in names]
    release_1, release_2 = state.serving_image["releases"]["1"], state.serving_image["releases"]["2"]
    rows: list[Row] = []
    profiles: list[tuple[str, str]] = []  # (run, where its wall time went)
    counts = sorted({1, min(2, len(rigs)), len(rigs)})
    load_at_start = load_average()
    progress(f"rigs {', '.join(names)}; {load_at_start}")
    progress("writing the checkout's bytecode (bench/cpu_account.py precompile: an installed rigkit has it)")
    precompile(REPO_ROOT)
    progress("staging the lab's model on every lab rig (rigkit stage; a no-op when staged)")
    staged = stage_on_lab_rigs(INVENTORY, REPO_ROOT)
    if staged.returncode != 0:
        raise SystemExit(f"rigkit stage failed:\n{(staged.stdout + staged.stderr)[-4000:]}")

    progress("the rigs at rest for 5 s (their idle engines' CPU, counted in every run's rig figure)")
    idle = idle_rate(rig.container for rig in rigs)
    if idle is not None:
        progress(f"the rigs at rest: {idle * 1000:.0f} ms of CPU per second each")

    first: dict[int, float] = {}
    noop: dict[int, float] = {}
    floors: dict[int, float] = {}
    noop_cpu: dict[int, CpuSpent] = {}
    floor_cpu: dict[int, CpuSpent] = {}
    for count in counts:
        group = rigs[:count]
        if not args.skip_first:
            for rig in group:
                remove_stack(rig)
            progress(f"first deploy of release 1 on {count} rig(s)")
            first[count], outcome = pyinfra(group, "deploy.py", f"serving_image={release_1}")
            rows.append(Row("first deploy (image cached)", count, first[count], outcome))
        else:
            progress(f"converging {count} rig(s) on release 1")
            pyinfra(group, "deploy.py", f"serving_image={release_1}")
        samples, floor_samples, cpu_samples, floor_cpu_samples = [], [], [], []
        for attempt in range(args.repeat):
            progress(f"no-op re-deploy and pyinfra's floor on {count} rig(s), {attempt + 1}/{args.repeat}")
            seconds, outcome = pyinfra(group, "deploy.py", f"serving_image={release_1}")
            samples.append(seconds)
            cpu_samples.append(LAST_CPU[0])
            profiles.append((f"no-op, {count} rig(s), run {attempt + 1}", LAST_TIMELINE[0].summary()))
            floor_samples.append(floor(group))
            floor_cpu_samples.append(LAST_CPU[0])
        noop[count], floors[count] = statistics.median(samples), statistics.median(floor_samples)
        noop_cpu[count], floor_cpu[count] = CpuSpent.median(cpu_samples), CpuSpent.median(floor_cpu_samples)
        rows.append(
            Row(
                "no-op re-deploy",
                count,
                noop[count],
                f"{outcome}; median of {args.repeat}; {noop_cpu[count].describe()}",
            )
        )
        rows.append(
            Row(
                f"pyinfra floor (fact {FLOOR_FACT})",
                count,
                floors[count],
                f"median of {args.repeat}; {floor_cpu[count].describe()}",
            )
        )

    rig = rigs[0]
    progress(f"round trips of a no-op on {rig.name} (pyinfra -vvv)")
    round_trips = noop_round_trips(rig)

    progress(f"upgrade release 1 -> 2 on {rig.name} (release 2 put on the rig first: no pull is timed)")
    rig_shell(rig, f"docker pull -q {release_2} >/dev/null")
    time.sleep(1.1)  # `docker events --since` counts whole seconds: the pull above must fall before it
    since = rig_shell(rig, "date +%s").strip()
    with Availability(rig) as availability:
        upgrade_s, _ = pyinfra([rig], "deploy.py", f"serving_image={release_2}")
    profiles.append(("upgrade 1 -> 2", LAST_TIMELINE[0].summary()))
    upgrade_pulls = image_pulls(rig, since)
    upgrade_overhead = upgrade_s - availability.longest
    rows.append(
        Row(
            "upgrade release 1 -> 2",
            1,
            upgrade_s,
            f"/v1/models unavailable {availability.longest:.1f} s; toolkit overhead {upgrade_overhead:.1f} s; "
            f"image pulls {len(upgrade_pulls)}",
        )
    )

    progress(f"rollback.py to release 1 on {rig.name}")
    since = rig_shell(rig, "date +%s").strip()
    with Availability(rig) as availability:
        rollback_s, _ = pyinfra([rig], "rollback.py")
    profiles.append(("rollback to 1", LAST_TIMELINE[0].summary()))
    pulls = image_pulls(rig, since)
    serving = rig_shell(rig, f"docker inspect --format '{{{{.Config.Image}}}}' {CONTAINER_NAME}").strip()
    overhead = rollback_s - availability.longest
    rows.append(
        Row(
            "rollback to cached release 1",
            1,
            rollback_s,
            f"unavailable {availability.longest:.1f} s (down+up+engine start); toolkit overhead "
            f"{overhead:.1f} s; image pulls {len(pulls)} (0 bytes pulled: {not pulls}); "
            f"serving release 1: {serving == release_1}",
        )
    )

    ram_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    print(
        f"\nmachine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, {ram_gib} GiB RAM; "
        f"rigs {', '.join(names)}\n  at the start: {load_at_start}\n  at the end:   {load_average()}\n"
        "  (a load above the core count means other work shared the cores: wall times are then noisy, "
        "round trips are not)"
    )
    print(f"{'measurement':<36} {'rigs':>4} {'seconds':>8}  note")
    for row in rows:
        print(f"{row.what:<36} {row.rigs:>4} {row.seconds:>8.1f}  {row.note}")
    print("\nwhere the wall time went (seconds per pyinfra phase; bench/pyinfra_timeline.py):")
    for what, summary in profiles:
        print(f"  {what}: {summary}")
    top = counts[-1]
    print("\ntargets (issue 26), each beside the figure it is judged against, from this run:")
    print(
        verdict(
            f"no-op round trips per rig <= {NOOP_ROUND_TRIPS} (the lock's channel with the survey, commands)",
            round_trips <= NOOP_ROUND_TRIPS,
            f"{round_trips} (pyinfra -vvv on {rig.name})",
        )
    )
    for count in sorted({1, top}):
        ratio = noop[count] / floors[count]
        print(
            verdict(
                f"no-op <= {NOOP_VS_FLOOR:g}x pyinfra's one-fact floor, {count} rig(s)",
                ratio <= NOOP_VS_FLOOR,
                f"{noop[count]:.2f} s vs {floors[count]:.2f} s ({ratio:.2f}x)",
            )
        )
    if top > 1:
        ratio = noop[top] / noop[1]
        print(
            verdict(
                f"no-op on {top} rigs <= {SCALING_N_VS_1:g}x one rig",
                ratio <= SCALING_N_VS_1,
                f"{noop[top]:.2f} s vs {noop[1]:.2f} s ({ratio:.2f}x); pyinfra's one-fact floor in this run: "
                f"{floors[top]:.2f} s vs {floors[1]:.2f} s ({floors[top] / floors[1]:.2f}x)",
            )
        )
        spent = noop_cpu[top]
        if spent.rigs_s is not None:
            print(
                f"    the lab's rigs share this machine's {os.cpu_count()} cores: a no-op on {top} rigs spent "
                f"{spent.rigs_s:.2f} CPU-s on the rigs and {spent.controller_s:.2f} on the controller "
                f"(1 rig: {noop_cpu[1].rigs_s:.2f} and {noop_cpu[1].controller_s:.2f}; pyinfra's floor on {top}: "
                f"{floor_cpu[top].rigs_s:.2f} and {floor_cpu[top].controller_s:.2f})"
            )
            if idle is not None:
                print(
                    f"    of the rigs' {spent.rigs_s:.2f} CPU-s, ~{idle * top * noop[top]:.2f} is their engines' at "
                    f"rest ({idle * 1000:.0f} ms per second each over the {noop[top]:.2f} s)"
                )
            print(scaling_estimate(noop[1], noop_cpu[1], spent, top))
    print(
        verdict(
            f"rollback overhead <= {OVERHEAD_S:g} s, 0 bytes pulled",
            overhead <= OVERHEAD_S and not pulls,
            f"{overhead:.1f} s = wall {rollback_s:.1f} s less the engine's down+up+start "
            f"{rollback_s - overhead:.1f} s; {len(pulls)} pulls",
        )
    )
    print(
        verdict(
            f"upgrade (image on the rig) overhead <= {OVERHEAD_S:g} s, 0 bytes pulled",
            upgrade_overhead <= OVERHEAD_S and not upgrade_pulls,
            f"{upgrade_overhead:.1f} s = wall {upgrade_s:.1f} s less the engine's down+up+start "
            f"{upgrade_s - upgrade_overhead:.1f} s; {len(upgrade_pulls)} pulls",
        )
    )
    print("  (no-op >= 5x faster than Ansible's deploy play: bench/peer_bench.py, which runs the play)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
