"""`rigkit validate-shared`: the warm-shared tier, KV one rig prefilled served to another from the tier they share.

    rigkit validate-shared inventory/lab.py                                   # every ordered pair of sharing rigs
    rigkit validate-shared inventory/lab.py --limit rig1,rig2 --run-dir results/<run-id>   # into a validate.py run

For each ordered pair (A, B) of the targeted rigs whose connector store is the same shared one (their `kv_share`
knob on, the same `kv_share_source`: rigkit.kv_share):
fresh salted prompts (validate_sessions of them, sized and seeded by A's validate_* settings) are prefilled on A,
each labelled by A's counters (it must be cold there: a warm prefill means the salt was not fresh); then the same
prompts are sent to B and each is labelled by B's own /metrics window (rigkit.validation.tiers.label_shared): warm-shared when
B's GPU prefix hits stay flat and its external hits grow, retrieved-but-unused when nothing hit, not-shared when B's
own GPU pool served (B already had it). B's greedy output must be A's for the same prompt (else served-but-wrong:
both rigs serve the same release). Every completion streams from the rig itself (the TTFT probe over SSH, as
validate.py does), so TTFT on B is what B's own clients see; the card sets it beside B's cold figure (B's own
prefills as the A of another pair, same sizes). The pairs are written into B's card (results/<run-id>/<B>.card.json,
created when validate.py wrote none for B in that run) and the fleet card shows one row per pair.

Exit status: 0 when every pair is warm-shared, 1 otherwise, 2 when the input is refused before any rig is asked.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rigkit.errors import ConfigError, RigkitError
from rigkit.fleet.targets import select
from rigkit.paths import REPO_ROOT
from rigkit.validation.card import RESULTS_DIR, new_run_id
from rigkit.validation.card.store import RUN_ID_ENV
from rigkit.validation.warm_shared import pair_line, validate_shared


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inventory", help="pyinfra inventory file, e.g. inventory/lab.py")
    parser.add_argument(
        "--limit",
        action="append",
        default=[],
        help="host or group names or globs, as pyinfra's --limit (a comma list is split)",
    )
    parser.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override host data as pyinfra's --data does (e.g. kv_share=true, validate_sessions=1)",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="results/<run-id> to add the pairs to (a validate.py run); default: a new run (RIGKIT_RUN_ID when set)",
    )


def run(args: argparse.Namespace) -> int:
    run_dir = args.run_dir or REPO_ROOT / RESULTS_DIR / (os.environ.get(RUN_ID_ENV) or new_run_id())
    try:
        pairs = validate_shared(select(args.inventory, args.limit, args.data), run_dir)
    except ConfigError as exc:
        print(f"rigkit validate-shared: refused: {exc}", file=sys.stderr)
        return 2
    except RigkitError as exc:  # a rig unreachable or its API down: said, not a traceback
        print(f"rigkit validate-shared: {exc}", file=sys.stderr)
        return 1
    for pair in pairs:
        print(pair_line(pair))
    print(f"-> {run_dir / 'fleet.md'}")
    return 0 if all(pair.passed for pair in pairs) else 1
