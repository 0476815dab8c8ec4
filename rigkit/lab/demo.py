"""`rigkit demo`: the main job on the local lab, end to end.

lab up -> `rigkit stage inventory/lab.py` (the lab's model, pinned by lab up, onto every rig: from the controller
once, then rig to rig) -> `pyinfra inventory/lab.py deploy.py` (every role, smoke, ledger) -> `validate.py` on the
first rig (cache tiers proven by vLLM's metrics, results card) -> a short summary per rig, then the validated
rig's card at a glance (per tier: TTFT, times faster than cold, the proof in a few words, the verdict) and the
run directory that holds the whole card, its plots and the greedy outputs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

from rigkit.errors import ConfigError
from rigkit.fleet.pyinfra_args import pyinfra_executable, rigkit_executable
from rigkit.lab.cli import DEFAULT_RIGS, lab_up
from rigkit.paths import REPO_ROOT
from rigkit.remote.tunnel import connect_ssh
from rigkit.serving.ledger import LEDGER_PATH, Ledger
from rigkit.validation.card.glance import run_lines
from rigkit.validation.card.store import RESULTS_DIR, RUN_ID_ENV, load_cards, new_run_id

LAB_INVENTORY = "inventory/lab.py"


def run_pyinfra(*args: str) -> int:
    """Run pyinfra in the repository with its output streamed (it shows each operation as it goes)."""
    command = [pyinfra_executable(), "-y", *args]
    print(f"[demo] $ {' '.join(command)}", flush=True)
    return subprocess.call(command, cwd=REPO_ROOT)


def run_rigkit(*args: str) -> int:
    """Run a rigkit command in its own process (staging never runs in a process that imported pyinfra_cli)."""
    command = [rigkit_executable(), *args]
    print(f"[demo] $ {' '.join(command)}", flush=True)
    return subprocess.call(command, cwd=REPO_ROOT)


def rig_summary(rig, state) -> dict:
    """Release and smoke verdict from the rig's own ledger, read over SSH as on a real fleet."""
    ssh = connect_ssh(state.ssh_data(rig), rig.name)
    try:
        _, stdout, _ = ssh.exec_command(f"cat {LEDGER_PATH} 2>/dev/null")
        ledger = Ledger.from_json(stdout.read().decode())
    finally:
        ssh.close()
    current = ledger.current
    return {
        "rig": rig.name,
        "port": rig.serving_port,
        "image": current.image.rsplit("@", 1)[-1][:19] if current else "-",
        "smoke": (current.smoke or "-") if current else "-",
        "releases": len(ledger.releases),
    }


def validation_lines(status: int, run_dir: Path) -> list[str]:
    """The validation's end: every card the run wrote, at a glance, and its directory; or why there is none."""
    try:
        cards = load_cards(run_dir)
    except ConfigError:
        return [
            f"validation: FAILED (exit {status}) before any card was written ({run_dir} holds none): "
            "its pyinfra output above says why"
        ]
    verdict = "ok" if status == 0 else f"FAILED (exit {status})"
    return [f"validation: {verdict}", *run_lines(cards, run_dir)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rigs", type=int, default=None, help="number of lab rigs (default: lab up's default)")
    parser.add_argument("--no-validate", action="store_true", help="skip the cache-tier validation")


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    state = lab_up(args.rigs or DEFAULT_RIGS)
    deploy_status = run_rigkit("stage", LAB_INVENTORY) or run_pyinfra(LAB_INVENTORY, "deploy.py")
    validate_status = None
    run_dir = REPO_ROOT / RESULTS_DIR / os.environ.setdefault(RUN_ID_ENV, new_run_id())  # validate.py writes there
    if deploy_status == 0 and not args.no_validate:
        validate_status = run_pyinfra(LAB_INVENTORY, "validate.py", "--limit", state.rigs[0].name)
    print("\n== rigkit demo summary ==")
    print(f"{'rig':<8}{'port':<7}{'image':<22}{'smoke':<7}releases")
    for rig in state.rigs:
        try:
            row = rig_summary(rig, state)
            print(f"{row['rig']:<8}{row['port']:<7}{row['image']:<22}{row['smoke']:<7}{row['releases']}")
        except Exception as exc:  # one unreadable rig must not hide the others
            print(f"{rig.name:<8}unreadable: {exc}")
    print(f"deploy: {'ok' if deploy_status == 0 else f'FAILED (exit {deploy_status})'}")
    if validate_status is not None:
        print("\n".join(validation_lines(validate_status, run_dir)))
    print(f"total {time.monotonic() - started:.0f} s; the lab stays up (`rigkit lab down` removes it)")
    return deploy_status or (validate_status or 0)
