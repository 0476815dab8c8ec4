"""Lab timings (printed, not asserted): `lab up` cold and warm, pyinfra first and no-op run per rig.

    sudo .venv/bin/python bench/lab_bench.py [--rigs 3] [--cold]

Without --cold, "cold" means: `lab down` (the cache survives), then `lab up` (rig image and serving
image come from the cache). With --cold the cache is purged first: debootstrap, package install, the
vLLM wheel download, image build and push all run (about 10 minutes). "warm" is `lab up` again with
the lab running. pyinfra runs tests/lab/deploys/probe.py against one rig at a time (--limit).
The lab is left up.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from rigkit.fleet.pyinfra_args import pyinfra_executable  # noqa: E402
from rigkit.lab.cli import lab_down, lab_up  # noqa: E402
from rigkit.lab.pyinfra_output import parse_results  # noqa: E402

PROBE_DEPLOY = REPO_ROOT / "tests" / "lab" / "deploys" / "probe.py"
PROBE_PATH = "/etc/rigkit-lab-probe"
INVENTORY = REPO_ROOT / "inventory" / "lab.py"


def quiet(_message: str) -> None:
    pass


def timed(action) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started


def pyinfra_run(rig_name: str) -> tuple[float, str]:
    started = time.monotonic()
    result = subprocess.run(
        [pyinfra_executable(), "-y", "--limit", rig_name, str(INVENTORY), str(PROBE_DEPLOY)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"pyinfra failed on {rig_name}:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    total = parse_results(result.stdout + result.stderr)["Grand total"]
    outcome = "changed" if total.success else "no change" if total.no_change else "?"
    return elapsed, outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rigs", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="purge the cache first (minutes)")
    args = parser.parse_args()

    lab_down(progress=quiet, purge_cache=args.cold)
    cold = timed(lambda: lab_up(args.rigs, progress=quiet))
    state = None

    def up_again():
        nonlocal state
        state = lab_up(args.rigs, progress=quiet)

    warm = timed(up_again)
    print(
        f"lab up, {'cold (cache purged)' if args.cold else 'after lab down (cache kept)'}, "
        f"{args.rigs} rigs: {cold:7.1f} s"
    )
    print(f"lab up, lab already up ({args.rigs} rigs):            {warm:7.1f} s")
    print(f"{'rig':<6} {'pyinfra first':>14} {'outcome':>9} {'pyinfra no-op':>14} {'outcome':>10}")
    for rig in state.rigs:
        subprocess.run(["docker", "exec", rig.container, "rm", "-f", PROBE_PATH], check=True)
        first, first_outcome = pyinfra_run(rig.name)
        noop, noop_outcome = pyinfra_run(rig.name)
        print(f"{rig.name:<6} {first:12.2f} s {first_outcome:>9} {noop:12.2f} s {noop_outcome:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
