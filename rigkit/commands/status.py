"""`rigkit status`: what every rig of a fleet really runs, against what today's data declares.

    rigkit status inventory/lab.py                        # a table, details per rig under it
    rigkit status inventory/lab.py --limit rig2 --json    # the whole structure
    rigkit status inventory/lab.py --data served_model_name=x   # as a deploy with that --data would see it

Every rig is asked in parallel (threads), in one SSH round trip: one shell script
(``rigkit.status.probe.status_script``) prints sections (the engine, the stack's containers, the stack's
files and release hash, the ledger, nvidia-smi and each GPU's health, the kernel log's Xids, the L2 tier, /dev/shm,
the API on the rig's loopback) that pure functions parse and judge:

- drift: the running image against the declared one; the rig's compose.yml and .env against what today's
  data renders, per knob; the files against the release hash recorded when they were verified (an edit by
  hand); the container's environment against the declared knob values. Secrets are compared, never shown.
- health: the engine answers, the stack's container runs (and is healthy when it has a healthcheck),
  /v1/models answers on the rig's loopback with the served name; the L2 tier is not full and its janitor
  runs. Leftover shared-memory segments of the stack and an L2 store over its budget are warnings.
- GPUs (rigkit.status.gpu): Xids since boot, ECC errors, clock event reasons, temperature, the enforced power
  limit against the declared one, the PCIe link, VRAM held while the stack is stopped, each ok / warn / fail;
  a rig without nvidia-smi and without declared GPUs says "no GPU tooling".

- the router: when the inventory has a gateway (group routers), its router is asked whether it answers, which
  rigs it routes to and which it holds healthy; a rig it does not list is named with the command that adds it
  back (rigkit.status.router).

The exit status is 0 when every rig is reachable, healthy and without drift and every router answers with every
rig healthy, 1 otherwise, 2 when the inventory or its data is refused (before any rig is asked).

By subject: rigkit.status.probe (the script and its sections parsed), rigkit.status.drift (drift),
rigkit.status.rig (one rig judged: health, drift, its state), rigkit.status.fleet (the rigs asked over SSH,
in parallel), rigkit.status.report (the table and each rig's details); this module is the command. The rigs are
picked as every command picks them (rigkit.fleet.targets), --data applied by pyinfra's own code.
"""

from __future__ import annotations

import argparse
import json
import sys

from rigkit.errors import ConfigError
from rigkit.fleet.targets import select
from rigkit.status.fleet import fleet_status
from rigkit.status.report import exit_status, format_report
from rigkit.status.router import UP, router_statuses


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
        help="override host data as pyinfra's --data does (what a deploy with it would render)",
    )
    parser.add_argument("--json", action="store_true", help="print the whole structure as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        targets = select(args.inventory, args.limit, args.data)
        statuses = fleet_status(targets)
    except ConfigError as exc:
        print(f"rigkit status: refused before any rig was asked: {exc}", file=sys.stderr)
        return 2
    routers = router_statuses(targets.hosts)
    if args.json:
        document = {"rigs": [s.as_dict() for s in statuses], "routers": [r.as_dict() for r in routers]}
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        print("\n".join([format_report(statuses)] + [line for router in routers for line in router.lines()]))
    return max(exit_status(statuses), int(any(router.state != UP for router in routers)))
