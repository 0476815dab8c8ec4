"""`rigkit status`: what every rig of a fleet really runs, against what today's data declares.

    rigkit status inventory/lab.py                        # a table, details per rig under it
    rigkit status inventory/lab.py --limit rig2 --json    # the whole structure
    rigkit status inventory/lab.py --data served_model_name=x   # as a deploy with that --data would see it

Every rig is asked in parallel (threads), in one SSH round trip: one shell script (``status_script``)
prints sections (the engine, the stack's containers, the stack's files and release hash, the ledger,
nvidia-smi, the L2 tier, /dev/shm, the API on the rig's loopback) that pure functions parse and judge:

- drift: the running image against the declared one; the rig's compose.yml and .env against what today's
  data renders, per knob; the files against the release hash recorded when they were verified (an edit by
  hand); the container's environment against the declared knob values. Secrets are compared, never shown.
- health: the engine answers, the stack's container runs (and is healthy when it has a healthcheck),
  /v1/models answers on the rig's loopback with the served name; the L2 tier is not full and its janitor
  runs. Leftover shared-memory segments of the stack and an L2 store over its budget are warnings.

The exit status is 0 when every rig is reachable, healthy and without drift, 1 otherwise, 2 when the
inventory or its data is refused (before any rig is asked).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional, Sequence

from rigkit.errors import ConfigError
from rigkit.status_fleet import fleet_status
from rigkit.status_rig import OK, RigStatus

TABLE_WIDTH = 100
LAST_COLUMN_MIN = 16


def cli_value(text: str) -> Any:
    """A ``--data`` value as pyinfra reads it (pyinfra_cli.util.parse_cli_arg): true/false, an int, JSON, else
    the text. Not imported from there: importing pyinfra_cli patches the whole process with gevent."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_data(pairs: Sequence[str]) -> dict[str, Any]:
    data = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise ConfigError("--data", pair, "is not KEY=VALUE", "write --data name=value, as pyinfra takes it")
        data[key] = cli_value(value)
    return data


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(width - 1, 0)] + "…"


def fit_table(rows: Sequence[Sequence[str]], width: int = TABLE_WIDTH, gap: int = 2) -> list[str]:
    """Rows as aligned lines no longer than ``width``: the last column (the one the details repeat in full)
    gives up characters first, down to LAST_COLUMN_MIN, then the widest others."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    floor = [min(w, max(len(rows[0][i]), 4)) for i, w in enumerate(widths)]
    floor[-1] = min(widths[-1], max(floor[-1], LAST_COLUMN_MIN))
    while sum(widths) + gap * (len(widths) - 1) > width and widths != floor:
        if widths[-1] > floor[-1]:
            widths[-1] -= 1
            continue
        i = max(range(len(widths)), key=lambda k: widths[k] - floor[k])
        widths[i] -= 1
    return [(" " * gap).join(_cut(cell, widths[i]).ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
            for row in rows]


def _digest(image: Optional[str]) -> str:
    return image.rpartition("@")[2].removeprefix("sha256:")[:12] if image else "-"


def _release_cell(ledger: Optional[dict]) -> str:
    if not ledger:
        return "-"
    if "error" in ledger:
        return "unreadable"
    when = (ledger.get("deployed_at") or "")[5:16].replace("T", " ")
    return f"{ledger['kind']} {ledger.get('smoke') or '-'} {when}".strip()


def _l2_cell(l2: Optional[dict]) -> str:
    if not l2:
        return "-"
    if l2.get("store_bytes") is None:
        return l2["state"]
    used = f"{100 * l2['store_bytes'] / l2['budget_bytes']:.0f}%"
    return used if l2["state"] == "ok" else f"{used} {l2['state']}"


def _gpu_cell(status: RigStatus) -> str:
    if status.driver in (None, "none"):
        return status.driver or "?"
    return f"{status.driver}/{status.cuda or '?'}"


def _problems_cell(status: RigStatus) -> str:
    """What is wrong, shortest first: unhealthy parts, then the knobs that drifted (details name them all)."""
    if not status.reachable:
        return " ".join(status.error.split())
    bad = [f"{what} down" for what, text in status.health.items() if not text.startswith("ok")]
    if status.l2 and status.l2["level"] == "fail":
        bad.append(f"L2 {status.l2['state']}")
    knobs = list(dict.fromkeys(d.knob for d in status.drift))
    return ", ".join(bad + knobs) or "-"


def format_report(statuses: Sequence[RigStatus], width: int = TABLE_WIDTH) -> str:
    """The table (at most ``width`` columns), then each rig's details: every drift, problem and warning."""
    header = ("rig", "state", "image", "last release", "gpu", "L2", "what")
    rows = [header] + [(s.rig, s.state, _digest(s.image), _release_cell(s.ledger), _gpu_cell(s), _l2_cell(s.l2),
                        _problems_cell(s)) for s in statuses]
    lines = fit_table(rows, width)
    for status in statuses:
        details = ([f"unreachable: {status.error}"] if not status.reachable else [])
        details += [f"drift {d.line()}" for d in status.drift]
        details += [f"unhealthy {problem}" for problem in status.unhealthy]
        details += [f"warning {warning}" for warning in status.warnings]
        if status.ledger and status.ledger.get("note") and status.state != OK:
            details.append(f"last release note: {status.ledger['note']}")
        if details:
            lines.append(f"{status.rig}:")
            lines += [f"  {line}" for line in details]
    bad = [s.rig for s in statuses if s.state != OK]
    lines.append(f"{len(statuses) - len(bad)} of {len(statuses)} rigs ok"
                 + (f"; not ok: {', '.join(bad)}" if bad else ""))
    return "\n".join(lines)


def exit_status(statuses: Sequence[RigStatus]) -> int:
    return 0 if all(s.state == OK for s in statuses) else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inventory", help="pyinfra inventory file, e.g. inventory/lab.py")
    parser.add_argument("--limit", action="append", default=[],
                        help="host or group names or globs, as pyinfra's --limit (a comma list is split)")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                        help="override host data as pyinfra's --data does (what a deploy with it would render)")
    parser.add_argument("--json", action="store_true", help="print the whole structure as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        statuses = fleet_status(args.inventory, args.limit, parse_data(args.data))
    except ConfigError as exc:
        print(f"rigkit status: refused before any rig was asked: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"rigs": [s.as_dict() for s in statuses]}, indent=2, sort_keys=True))
    else:
        print(format_report(statuses))
    return exit_status(statuses)
