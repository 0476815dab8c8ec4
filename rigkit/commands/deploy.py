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
once. Through an inventory that declares no router, a run that would restart every rig of the router they were last
deployed behind (their own record, rigkit.rollout.router_record) all at once is refused unless told --all-at-once.
The router role is refused on the controller (@local) unless its data says router_on_controller: true.

Before pyinfra starts, every targeted host's connection data is checked (a host with no usable SSH key
is refused, naming the field and the fix: no host is touched). pyinfra then runs as usual (its output
streams through; any pyinfra option passes through, --fail-percent included); afterwards each reachable
rig's release ledger is read, and a table names every rig with its status, the step that failed, the
reason and the release it serves now. The exit status is non-zero when any rig did not complete. A dry run
(--dry) runs pyinfra without -y, so it shows its table of what would change; with a rollout asked, it first says
the stages the rollout would run, then checks every targeted rig at once: nothing is drained or recorded.

This module is the command: its options, which run they ask for, the summary. The hosts are picked once
(rigkit.fleet.targets); the run is rigkit.fleet.deploy (every rig at once), rigkit.rollout.run (a rollout) or
rigkit.rollout.rollback (a rolling rollback).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rigkit.errors import ConfigError, RigkitError
from rigkit.fleet.deploy import fleet_deploy
from rigkit.fleet.inventory import rigs_among
from rigkit.fleet.outcome import DRY_RUN, OK
from rigkit.fleet.pyinfra_args import data_pairs, is_dry_run, limit_from, split_limits
from rigkit.fleet.table import format_table
from rigkit.fleet.targets import select
from rigkit.paths import DEFAULT_DEPLOY, ROLLBACK_DEPLOY
from rigkit.rollout.drain import plain_run_note
from rigkit.rollout.plan import ALL_AT_ONCE
from rigkit.rollout.rollback import rolling_rollback_command
from rigkit.rollout.router_record import read_records, refuse_taking_a_whole_router_down
from rigkit.rollout.run import refuse_rollout_flags, rollout_command
from rigkit.rollout.stage_runner import rollout_step


def add_own_options(parser: argparse.ArgumentParser, defaults: bool = True) -> None:
    """rigkit deploy's own options (the rest goes to pyinfra)."""
    parser.add_argument(
        "--deploy",
        default=DEFAULT_DEPLOY if defaults else None,
        help=f"deploy file (default {DEFAULT_DEPLOY}; {ROLLBACK_DEPLOY} rolls back)",
    )
    parser.add_argument(
        "--canary",
        type=int,
        default=None,
        metavar="N",
        help="rollout: N canary rigs first, smoke + cache proof (overrides rollout_canary)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        metavar="M",
        help="rollout: then the others M at a time (overrides rollout_batch); with --deploy "
        f"{ROLLBACK_DEPLOY}: roll back M rigs at a time, each out of the router meanwhile",
    )
    parser.add_argument(
        "--on-failure",
        default=None,
        choices=("leave", "rollback"),
        help="rollout: after a halt, leave or roll back the rigs it upgraded (rollout_on_failure)",
    )
    parser.add_argument(
        "--recheck-canaries",
        action="store_true",
        default=None,
        help="rollout re-run: deploy and prove the canaries again even when they passed",
    )
    parser.add_argument(
        "--all-at-once",
        action="store_true",
        default=None,
        help="every targeted rig in one run, also behind a router (which then still sends them "
        "requests while they restart); without it, an inventory with a router goes one rig at a "
        "time, each drained from the router first",
    )


# The same options after INVENTORY, where argparse hands everything to pyinfra_args (REMAINDER).
OWN_OPTIONS = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
add_own_options(OWN_OPTIONS, defaults=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inventory", help="pyinfra inventory file, e.g. inventory/lab.py")
    add_own_options(parser)
    parser.add_argument(
        "pyinfra_args",
        nargs=argparse.REMAINDER,
        help="passed to pyinfra as they are (--limit, --data, --fail-percent, -v, ...)",
    )


def own_options_from_remainder(args: argparse.Namespace) -> argparse.Namespace:
    """rigkit deploy's options wherever they stand, pyinfra's arguments without them."""
    own, rest = OWN_OPTIONS.parse_known_args(args.pyinfra_args)
    for name, value in vars(own).items():
        if value is not None:
            setattr(args, name, value)
    args.pyinfra_args = rest
    return args


def run(args: argparse.Namespace) -> int:
    args = own_options_from_remainder(args)
    try:
        return _run(args)
    except ConfigError as exc:
        print(f"rigkit deploy: refused before any rig was touched: {exc}", file=sys.stderr)
        return 2
    except RigkitError as exc:  # staging the model failed: no release was started
        print(f"rigkit deploy: no release started: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    deploy = Path(args.deploy).name
    refuse_rollout_flags(args)  # before the inventory is read
    pyinfra_args = split_limits(args.pyinfra_args)
    targets = select(args.inventory, limit_from(pyinfra_args), data_pairs(pyinfra_args), rigs_only=False)
    if deploy == ROLLBACK_DEPLOY:
        rolled = rolling_rollback_command(args, targets)
    elif deploy == DEFAULT_DEPLOY:
        rolled = rollout_command(args, targets)
    else:
        rolled = None  # rollout data applies to deploy.py and rollback.py only
    if rolled is not None:
        return rolled
    dry = is_dry_run(pyinfra_args)
    if deploy in (DEFAULT_DEPLOY, ROLLBACK_DEPLOY) and not dry and not args.all_at_once:
        # the rigs' own record of the router they were last deployed behind: this inventory may not declare it
        rigs = rigs_among(targets.hosts, targets.names)
        refuse_taking_a_whole_router_down(read_records(targets.hosts, rigs), rigs)
    if (
        deploy in (DEFAULT_DEPLOY, ROLLBACK_DEPLOY)
        and not dry
        and (note := plain_run_note(targets.hosts, targets.names))
    ):
        print(f"--> rigkit deploy: {note}", flush=True)
    with rollout_step(ALL_AT_ONCE):
        status, outcomes = fleet_deploy(targets, args.deploy, pyinfra_args)
    print("\n--> rigkit fleet summary:")
    print(format_table(outcomes))
    bad = [o.rig for o in outcomes if o.status not in (OK, DRY_RUN)]
    print(
        f"{len(outcomes) - len(bad)} of {len(outcomes)} rigs "
        + ("checked by a dry run (nothing changed)" if dry else "completed")
        + (f"; not {'checked' if dry else 'completed'}: {', '.join(bad)}" if bad else "")
    )
    return status
