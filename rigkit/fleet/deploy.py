"""`rigkit deploy`: run a pyinfra deploy over a fleet and say, per rig, what happened.

    rigkit deploy inventory/lab.py                          # deploy.py on every rig
    rigkit deploy inventory/lab.py --limit rig4,rig5 --fail-percent 50   # a comma list is split for pyinfra
    rigkit deploy inventory/lab.py --deploy rollback.py
    rigkit deploy inventory/lab.py --canary 1 --batch 2   # a rollout (rigkit.rollout.run): canaries, then batches
    rigkit deploy inventory/lab.py --deploy rollback.py --batch 1   # a rolling rollback (rigkit.rollout.rollback)
    rigkit deploy inventory/lab.py --dry                    # what each rig would change; nothing changes
    rigkit deploy inventory/fleet.py --all-at-once          # behind a router too: every rig in one run, not drained

On an inventory with a router (group routers), `rigkit deploy` without --canary/--batch goes one rig at a time, each
drained from the router first (rigkit.rollout.drain.routed_default); --all-at-once, or --batch 0, runs every rig at
once. The router role is refused on the controller (@local) unless its data says router_on_controller: true.

Before pyinfra starts, every targeted host's connection data is checked (a host with no usable SSH key
is refused, naming the field and the fix: no host is touched). pyinfra then runs as usual (its output
streams through; any pyinfra option passes through, --fail-percent included); afterwards each reachable
rig's release ledger is read, and a table names every rig with its status, the step that failed, the
reason and the release it serves now. The exit status is non-zero when any rig did not complete. A dry run
(--dry) runs pyinfra without -y, so it shows its table of what would change; with a rollout asked, it first says
the stages the rollout would run, then checks every targeted rig at once: nothing is drained or recorded.

This module is the command (its options, the pyinfra run, the releases read afterwards); the parts are plain
modules of their own: rigkit.fleet.inventory (the hosts, the --limit, the connection data), rigkit.fleet.pyinfra_args (the
pyinfra arguments passed through), rigkit.fleet.outcome (what the run did to each rig), rigkit.fleet.table (the
summary table).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from rigkit.errors import ConfigError, RigkitError
from rigkit.fleet.inventory import check_connection_data, load_inventory, targeted
from rigkit.fleet.outcome import DRY_RUN, OK, UNREACHABLE, RigOutcome, summarize
from rigkit.fleet.pyinfra_args import (
    data_pairs,
    is_dry_run,
    limit_from,
    pyinfra_command,
    split_limits,
)
from rigkit.fleet.table import format_table
from rigkit.model.fleet import stage_inventory
from rigkit.paths import REPO_ROOT
from rigkit.router import is_gateway, refuse_router_on_controller
from rigkit.serving.ledger import Ledger
from rigkit.settings.defaults import ROUTER_VARIABLES
from rigkit.settings.variables import resolve

DEFAULT_DEPLOY = "deploy.py"
ROLLBACK_DEPLOY = "rollback.py"


def ledger_release(ledger_text: str) -> str:
    """'<digest prefix> <kind> smoke=<verdict>' of a ledger's newest release ('' without one)."""
    current = Ledger.from_json(ledger_text).current
    return current.summary() if current else ""


def read_release(name: str, data: dict) -> str:
    from rigkit.remote.tunnel import connect_ssh
    from rigkit.serving.ledger import LEDGER_PATH

    try:
        client = connect_ssh(data, name)
    except Exception as exc:  # the summary must not fail on a rig that is down
        return f"? ({type(exc).__name__})"
    try:
        _, stdout, _ = client.exec_command(f"cat {LEDGER_PATH} 2>/dev/null", timeout=20)
        return ledger_release(stdout.read().decode())
    except Exception as exc:
        return f"? ({type(exc).__name__}: {exc})"
    finally:
        client.close()


def run_pyinfra_streaming(argv: list[str]) -> tuple[int, str]:
    """Run pyinfra, echoing its output as it comes, and return (exit status, the whole output)."""
    process = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               bufsize=1)
    captured = []
    assert process.stdout is not None
    for line in process.stdout:
        sys.stdout.write(line)
        captured.append(line)
    return process.wait(), "".join(captured)


def fleet_deploy(inventory: str, deploy: str, pyinfra_args: Sequence[str]) -> tuple[int, list[RigOutcome]]:
    from rigkit.kv_share import check_inventory
    from rigkit.rollout.drain import plain_run_note

    pyinfra_args = split_limits(pyinfra_args)
    hosts = load_inventory(inventory, data_args=data_pairs(pyinfra_args))  # the data the pyinfra run will see
    check_inventory((name, host["groups"], host["data"]) for name, host in hosts.items())
    names = targeted(hosts, limit_from(pyinfra_args))
    if not names:
        raise ConfigError("--limit", " ".join(limit_from(pyinfra_args)), f"matches no host of {inventory}",
                          f"use host or group names from the inventory: {', '.join(sorted(hosts))}")
    for name in names:  # refused here: nothing has run on any rig yet
        check_connection_data(name, hosts[name]["data"])
        if is_gateway(hosts[name]["groups"]):
            refuse_router_on_controller(name, resolve(ROUTER_VARIABLES, dict(hosts[name]["data"])))
    if (Path(deploy).name in (DEFAULT_DEPLOY, ROLLBACK_DEPLOY) and not is_dry_run(pyinfra_args)
            and (note := plain_run_note(hosts, names))):
        print(f"--> rigkit deploy: {note}", flush=True)
    if Path(deploy).name == DEFAULT_DEPLOY and not is_dry_run(pyinfra_args):
        # the model is on every rig, verified, before any release starts (rollback.py mounts what is staged)
        stage_inventory(hosts, names)
    status, output = run_pyinfra_streaming(pyinfra_command(pyinfra_args, inventory, deploy))
    outcomes = summarize(output, names, dry_run=is_dry_run(pyinfra_args))
    for outcome in outcomes.values():
        if outcome.status != UNREACHABLE and outcome.rig in hosts:
            outcome.release = read_release(outcome.rig, hosts[outcome.rig]["data"])
    ordered = [outcomes[n] for n in names] + [o for n, o in outcomes.items() if n not in names]
    failed = any(o.status not in (OK, DRY_RUN) for o in ordered)
    return (1 if failed or status != 0 else 0), ordered


def add_own_options(parser: argparse.ArgumentParser, defaults: bool = True) -> None:
    """rigkit deploy's own options (the rest goes to pyinfra)."""
    parser.add_argument("--deploy", default=DEFAULT_DEPLOY if defaults else None,
                        help=f"deploy file (default {DEFAULT_DEPLOY}; {ROLLBACK_DEPLOY} rolls back)")
    parser.add_argument("--canary", type=int, default=None, metavar="N",
                        help="rollout: N canary rigs first, smoke + cache proof (overrides rollout_canary)")
    parser.add_argument("--batch", type=int, default=None, metavar="M",
                        help="rollout: then the others M at a time (overrides rollout_batch); with --deploy "
                             f"{ROLLBACK_DEPLOY}: roll back M rigs at a time, each out of the router meanwhile")
    parser.add_argument("--on-failure", default=None, choices=("leave", "rollback"),
                        help="rollout: after a halt, leave or roll back the rigs it upgraded (rollout_on_failure)")
    parser.add_argument("--recheck-canaries", action="store_true", default=None,
                        help="rollout re-run: deploy and prove the canaries again even when they passed")
    parser.add_argument("--all-at-once", action="store_true", default=None,
                        help="every targeted rig in one run, also behind a router (which then still sends them "
                             "requests while they restart); without it, an inventory with a router goes one rig at a "
                             "time, each drained from the router first")


# The same options after INVENTORY, where argparse hands everything to pyinfra_args (REMAINDER).
OWN_OPTIONS = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
add_own_options(OWN_OPTIONS, defaults=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inventory", help="pyinfra inventory file, e.g. inventory/lab.py")
    add_own_options(parser)
    parser.add_argument("pyinfra_args", nargs=argparse.REMAINDER,
                        help="passed to pyinfra as they are (--limit, --data, --fail-percent, -v, ...)")


def own_options_from_remainder(args: argparse.Namespace) -> argparse.Namespace:
    """rigkit deploy's options wherever they stand, pyinfra's arguments without them."""
    own, rest = OWN_OPTIONS.parse_known_args(args.pyinfra_args)
    for name, value in vars(own).items():
        if value is not None:
            setattr(args, name, value)
    args.pyinfra_args = rest
    return args


def run(args: argparse.Namespace) -> int:
    from rigkit.rollout.plan import ALL_AT_ONCE
    from rigkit.rollout.run import rollout_command, rollout_step

    args = own_options_from_remainder(args)
    try:
        rolled_out = rollout_command(args)  # None: no rollout asked, one pyinfra run over every rig
        if rolled_out is not None:
            return rolled_out
        with rollout_step(ALL_AT_ONCE):
            status, outcomes = fleet_deploy(args.inventory, args.deploy, args.pyinfra_args)
    except ConfigError as exc:
        print(f"rigkit deploy: refused before any rig was touched: {exc}", file=sys.stderr)
        return 2
    except RigkitError as exc:  # staging the model failed: no release was started
        print(f"rigkit deploy: no release started: {exc}", file=sys.stderr)
        return 1
    print("\n--> rigkit fleet summary:")
    print(format_table(outcomes))
    bad = [o.rig for o in outcomes if o.status not in (OK, DRY_RUN)]
    dry = is_dry_run(args.pyinfra_args)
    print(f"{len(outcomes) - len(bad)} of {len(outcomes)} rigs "
          + ("checked by a dry run (nothing changed)" if dry else "completed")
          + (f"; not {'checked' if dry else 'completed'}: {', '.join(bad)}" if bad else ""))
    return status
