"""`rigkit deploy`: run a pyinfra deploy over a fleet and say, per rig, what happened.

    rigkit deploy inventory/lab.py                          # deploy.py on every rig
    rigkit deploy inventory/lab.py --limit rig4,rig5 --fail-percent 50   # a comma list is split for pyinfra
    rigkit deploy inventory/lab.py --deploy rollback.py
    rigkit deploy inventory/lab.py --canary 1 --batch 2   # a rollout (rigkit.rollout): canaries, then batches

Before pyinfra starts, every targeted host's connection data is checked (a host with no usable SSH key
is refused, naming the field and the fix: no host is touched). pyinfra then runs as usual (its output
streams through; any pyinfra option passes through, --fail-percent included); afterwards each reachable
rig's release ledger is read, and a table names every rig with its status, the step that failed, the
reason and the release it serves now. The exit status is non-zero when any rig did not complete.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

from rigkit.errors import ConfigError
from rigkit.operations import REFUSED_PREFIX
from rigkit.operations.stack import PULL_STEP
from rigkit.paths import REPO_ROOT
from rigkit.registry import registry_failure

DEFAULT_DEPLOY = "deploy.py"
REASON_CHARS = 1200  # a reason is kept whole up to this (under the table); the table's column is cut
# The summary table: the terminal's width (this when it has none, e.g. output to a pipe), the step column
# cut to STEP_CHARS, the reason column at least REASON_MIN_CHARS wide and at most REASON_LINES lines.
TABLE_WIDTH_FALLBACK = 100
STEP_CHARS = 32
REASON_MIN_CHARS = 24
REASON_LINES = 2
OK, FAILED, UNREACHABLE, ABORTED, NOT_RUN = "ok", "failed", "unreachable", "aborted", "not run"

ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
HOST_LINE_RE = re.compile(r"^\s*\[(?P<host>[^\]\s]+)\]\s*(?P<text>.*)$")
RAISED_RE = re.compile(r"^(?:[\w.]+\.)?(?P<type>\w*(?:Error|Exception)): (?P<msg>.+)$")
# pyinfra's own line for an error that stopped the run (a rigkit refusal while preparing is one)
RUN_ERROR_RE = re.compile(r"^--> pyinfra error(?: in .*? line \d+)?: (?P<msg>.+)$")
OPERATION_RE = re.compile(r"^--> Starting operation: (?P<name>.*?)\s*$")
CALLBACK_ERROR_RE = re.compile(r"Unexpected error in Python callback: (?P<type>\w+)\((?P<quote>['\"])(?P<msg>.*)(?P=quote),?\)$")
# a rigkit error's text: field=value: problem. Fix: fix
RIGKIT_ERROR_RE = re.compile(r"^(?P<field>[^\s=]+)=(?P<value>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\S+): "
                             r"(?P<problem>.*?)(?:\. Fix: (?P<fix>.*))?$")
# pyinfra's own line for a failed operation ("Error" or "Error: executed N commands"), not a command's
# output that starts with the word (docker's "Error response from daemon: ...")
PYINFRA_ERROR_RE = re.compile(r"^Error(?::|$)")
# Lines pyinfra prints per host that are bookkeeping, not the reason for a failure.
NOT_A_REASON = ("Connected", "Ready:", "Success", "No changes", "Error:", "Error (ignored)", "Loaded fact",
                "Traceback", "File ", "^", "Unexpected error in Python callback")

# pyinfra_cli monkey-patches the whole process with gevent on import: inventories load in a child.
# argv[3]: the run's --data KEY=VALUE pairs (JSON list), parsed and applied as pyinfra applies them.
LOAD_INVENTORY = """
import json, sys
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory_from_files
from pyinfra_cli.util import parse_cli_arg
override = {k: parse_cli_arg(v) for k, _, v in (pair.partition("=") for pair in json.loads(sys.argv[3]))}
with ctx_state.use(State()):
    inventory = make_inventory_from_files(sys.argv[1], override_data=override or None, cwd=sys.argv[2])
print(json.dumps({h.name: {"data": h.data.dict(), "groups": sorted(h.groups)} for h in inventory}, default=str))
"""


@dataclass
class RigOutcome:
    rig: str
    status: str = OK
    step: str = ""
    reason: str = ""
    release: str = ""
    notes: list[str] = field(default_factory=list)


def _clean(line: str) -> str:
    return ANSI_RE.sub("", line).rstrip()


def _short(text: str, limit: int = REASON_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _reason_from(lines: list[str], operation: Optional[str] = None) -> str:
    """The most telling of a host's lines before its Error: a rigkit refusal's line, a raised RigkitError's
    message (pyinfra's "Unexpected error in Python callback"), else the last output line; a failed pull's
    docker error is worded by what it says of the registry (rigkit.registry.registry_failure)."""
    for text in reversed(lines):
        if text.startswith(REFUSED_PREFIX):
            return text[len(REFUSED_PREFIX):]
        match = CALLBACK_ERROR_RE.search(text)
        if match:
            return match.group("msg").replace("\\n", " ").replace("\\r", " ")  # repr's escapes
    for text in reversed(lines):
        if text and not text.startswith(NOT_A_REASON) and not text.startswith("noop:"):
            if operation and operation.endswith(PULL_STEP):
                failure = registry_failure(text)
                return f"{failure.problem}. Fix: {failure.fix} (docker: {text})"
            return text
    return ""


def summarize(output: str, hosts: Iterable[str] = ()) -> dict[str, RigOutcome]:
    """Per-rig outcome from pyinfra's output (stdout and stderr together, in order).

    ``hosts`` are the rigs the run targeted: one that never shows up is reported as not reached.
    """
    outcomes: dict[str, RigOutcome] = {name: RigOutcome(name) for name in hosts}
    recent: dict[str, list[str]] = {}
    operation: Optional[str] = None
    run_error = last_exception = ""
    finished = False
    for raw in output.splitlines():
        line = _clean(raw)
        op = OPERATION_RE.match(line)
        if op:
            operation = op.group("name")
            continue
        if line.startswith("--> Results:"):
            finished = True
        stopped = RUN_ERROR_RE.match(line)
        if stopped:
            run_error = stopped.group("msg").strip()
        exception = RAISED_RE.match(line)
        if exception:  # the run's own end when nothing follows (bad input while preparing); else a host's
            last_exception = f"{exception.group('type')}: {exception.group('msg')}"
        match = HOST_LINE_RE.match(line)
        if not match:
            continue
        name, text = match.group("host"), match.group("text").strip()
        outcome = outcomes.setdefault(name, RigOutcome(name))
        history = recent.setdefault(name, [])
        if operation is None and text.startswith(("Could not connect", "Connection", "Host key", "Authentication")):
            outcome.status, outcome.step, outcome.reason = UNREACHABLE, "connect", _short(text)
        elif text.startswith("Error (ignored)"):
            outcome.notes.append(f"{operation}: {_short(_reason_from(history, operation))}")
        elif PYINFRA_ERROR_RE.match(text) and outcome.status == OK:
            outcome.status, outcome.step = FAILED, operation or "prepare"
            own = text.partition(":")[2].strip()
            telling = own and not own.startswith("executed ")
            outcome.reason = _short(own if telling else _reason_from(history, operation) or text)
        history.append(text)
        del history[:-40]
    if not finished and not run_error:
        run_error = last_exception
    for name, outcome in outcomes.items():
        if name not in recent:
            outcome.status, outcome.step = NOT_RUN, "-"
            outcome.reason = _short(run_error or "pyinfra never reported this rig (check --limit and the inventory)")
        elif outcome.status == OK and (run_error or not finished):
            outcome.status, outcome.step = ABORTED, operation or "prepare"
            outcome.reason = _short(run_error or "the run stopped before this rig finished")
    return outcomes


def ledger_release(ledger_text: str) -> str:
    """'<digest prefix> <kind> smoke=<verdict>' of a ledger's newest release ('' without one)."""
    if not ledger_text.strip():
        return ""
    releases = json.loads(ledger_text).get("releases") or []
    if not releases:
        return ""
    current = releases[-1]
    digest = current["image"].rpartition("@")[2].removeprefix("sha256:")[:12]
    return f"{digest} {current.get('kind', 'deploy')} smoke={current.get('smoke') or '-'}"


def table_width() -> int:
    """The terminal's width (COLUMNS first, as shutil reads it), TABLE_WIDTH_FALLBACK without a terminal."""
    return shutil.get_terminal_size((TABLE_WIDTH_FALLBACK, 24)).columns


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _wrap(text: str, width: int, **indents) -> list[str]:
    """Lines of at most ``width``; an image reference is cut only where it is longer than a line."""
    return textwrap.wrap(text, width, break_on_hyphens=False, **indents)


def reason_headline(reason: str) -> str:
    """What the table shows of a reason: a rigkit error's problem without its field=value (a digest is 80
    characters) and fix, which the full reason under the table gives; any other reason as it is."""
    match = RIGKIT_ERROR_RE.match(reason)
    return match.group("problem") if match else reason


def format_table(outcomes: Sequence[RigOutcome], width: Optional[int] = None) -> str:
    """One row per rig in ``width`` columns (default: the terminal's): the step cut, the reason last, wrapped
    in its column (under the row when the terminal leaves it less than REASON_MIN_CHARS) and cut after
    REASON_LINES lines; every reason the table does not show whole follows it in full, as do the notes."""
    width = width or table_width()
    header = ("rig", "status", "step", "release", "reason")
    rows = [header] + [(o.rig, o.status, _cut(o.step or "-", STEP_CHARS), o.release or "-",
                        reason_headline(o.reason) or "-") for o in outcomes]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    column = sum(widths) + 2 * len(widths)  # where the reason column starts
    beside = width - column >= REASON_MIN_CHARS
    room = width - column if beside else width - 4
    indent = " " * (column if beside else 4)
    lines, shown_whole = [], set()
    for index, row in enumerate(rows):
        wrapped = _wrap(row[-1], room) or ["-"]
        if index and len(wrapped) <= REASON_LINES and row[-1] == outcomes[index - 1].reason:
            shown_whole.add(row[0])
        if len(wrapped) > REASON_LINES:
            wrapped = wrapped[:REASON_LINES - 1] + [_cut(" ".join(wrapped[REASON_LINES - 1:]), room)]
        cells = "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:-1]))
        if beside:
            lines += [f"{cells}  {wrapped[0]}".rstrip()] + [indent + more for more in wrapped[1:]]
        else:
            lines += [cells.rstrip()] + [indent + more for more in wrapped]
    for outcome in outcomes:
        if outcome.reason and outcome.rig not in shown_whole:
            lines += _wrap(f"{outcome.rig}: {outcome.reason}", width, subsequent_indent="    ")
        for note in outcome.notes:
            lines += _wrap(f"{outcome.rig}: note: {note}", width, initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines)


# Connection data: each targeted host must have a way to authenticate before anything runs.

def check_connection_data(name: str, data: dict, environ: Optional[dict] = None) -> None:
    """ConfigError when the host has no usable SSH key (a missing key file, or no key/agent/password at all)."""
    environ = os.environ if environ is None else environ
    if data.get("ssh_connector", "ssh") != "ssh" or name.startswith("@"):
        return
    key = data.get("ssh_key")
    if key:
        path = Path(os.path.expanduser(str(key)))
        if not path.is_file() or not os.access(path, os.R_OK):
            raise ConfigError(f"{name}.ssh_key", str(key), "the SSH key file does not exist or is not readable",
                              "point ssh_key at the private key that opens this rig (inventory or group_data)")
        return
    if data.get("ssh_password"):
        return
    agent = data.get("ssh_allow_agent", True) and environ.get("SSH_AUTH_SOCK")
    default_keys = data.get("ssh_look_for_keys", True) and any(
        Path(os.path.expanduser(f"~/.ssh/{n}")).is_file() for n in ("id_ed25519", "id_ecdsa", "id_rsa"))
    if not (agent or default_keys):
        raise ConfigError(f"{name}.ssh_key", None,
                          "no SSH key for this host: no ssh_key, no ssh_password, no agent and no default key "
                          "(~/.ssh/id_*) to fall back on",
                          f"set ssh_key for {name} in the inventory or its group_data")


def load_inventory(inventory: str, cwd: Path = REPO_ROOT, data_args: Sequence[str] = ()) -> dict[str, dict]:
    """host name -> {"data": merged host data, "groups": [...]}, loaded by pyinfra's own code in a child;
    ``data_args``: --data KEY=VALUE pairs, which override the inventory's data as in the pyinfra run."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", LOAD_INVENTORY, inventory, str(cwd), json.dumps(list(data_args))],
                            env=env,
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise ConfigError("inventory", inventory, f"pyinfra could not load it: {result.stderr.strip()[-800:]}",
                          "fix the inventory file (it is Python) or its group_data")
    return json.loads(result.stdout)


def limit_from(pyinfra_args: Sequence[str]) -> list[str]:
    patterns: list[str] = []
    for i, arg in enumerate(pyinfra_args):
        if arg == "--limit" and i + 1 < len(pyinfra_args):
            patterns += pyinfra_args[i + 1].split(",")
        elif arg.startswith("--limit="):
            patterns += arg.split("=", 1)[1].split(",")
    return [p for p in patterns if p]


def split_limits(pyinfra_args: Sequence[str]) -> list[str]:
    """`--limit a,b` as `--limit a --limit b`: pyinfra 3 takes one pattern per --limit, and a comma
    list silently matches no host (the run then deploys nothing and exits 0)."""
    out: list[str] = []
    args = list(pyinfra_args)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--limit" and i + 1 < len(args):
            value, i = args[i + 1], i + 2
        elif arg.startswith("--limit="):
            value, i = arg.split("=", 1)[1], i + 1
        else:
            out.append(arg)
            i += 1
            continue
        for pattern in (p for p in value.split(",") if p):
            out += ["--limit", pattern]
    return out


def targeted(hosts: dict[str, dict], patterns: Sequence[str]) -> list[str]:
    """Host names a pyinfra --limit selects (names, groups or globs of either); all without a limit."""
    if not patterns:
        return list(hosts)
    return [name for name, info in hosts.items()
            if any(fnmatch.fnmatch(name, p) or any(fnmatch.fnmatch(g, p) for g in info.get("groups", []))
                   for p in patterns)]


def rigs_among(hosts: dict[str, dict], names: Sequence[str]) -> list[str]:
    """``names`` without the fleet's service hosts (the router's gateways, the KV store): they serve no stack."""
    from rigkit.defaults import KV_STORE_GROUP, ROUTER_GROUP

    return [name for name in names
            if not {ROUTER_GROUP, KV_STORE_GROUP} & set(hosts[name].get("groups", []))]


def inventory_rigs(hosts: Iterable) -> dict[str, tuple[dict, dict]]:
    """Every rig of a pyinfra inventory (``rigs_among``; also the hosts a --limit leaves out), name -> (host data,
    its validated serving knobs): the router's workers and the store firewall's sources. A bad value of any
    rig is a ConfigError before any host is touched."""
    from rigkit.hostdata import rig_settings

    found = {other.name: {"groups": list(other.groups), "data": other.data.dict()} for other in hosts}
    return {name: (found[name]["data"], rig_settings(found[name]["data"]).stack.knobs)
            for name in rigs_among(found, list(found))}


def read_release(name: str, data: dict) -> str:
    from rigkit.ledger import LEDGER_PATH
    from rigkit.tunnel import connect_ssh

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


def pyinfra_executable() -> str:
    candidate = Path(sys.executable).with_name("pyinfra")
    return str(candidate if candidate.exists() else "pyinfra")


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
    from rigkit.rollout import data_pairs

    pyinfra_args = split_limits(pyinfra_args)
    hosts = load_inventory(inventory, data_args=data_pairs(pyinfra_args))  # the data the pyinfra run will see
    check_inventory((name, host["groups"], host["data"]) for name, host in hosts.items())
    names = targeted(hosts, limit_from(pyinfra_args))
    if not names:
        raise ConfigError("--limit", " ".join(limit_from(pyinfra_args)), f"matches no host of {inventory}",
                          f"use host or group names from the inventory: {', '.join(sorted(hosts))}")
    for name in names:  # refused here: nothing has run on any rig yet
        check_connection_data(name, hosts[name]["data"])
    status, output = run_pyinfra_streaming([pyinfra_executable(), "-y", *pyinfra_args, inventory, deploy])
    outcomes = summarize(output, names)
    for outcome in outcomes.values():
        if outcome.status != UNREACHABLE and outcome.rig in hosts:
            outcome.release = read_release(outcome.rig, hosts[outcome.rig]["data"])
    ordered = [outcomes[n] for n in names] + [o for n, o in outcomes.items() if n not in names]
    failed = any(o.status != OK for o in ordered)
    return (1 if failed or status != 0 else 0), ordered


def add_own_options(parser: argparse.ArgumentParser, defaults: bool = True) -> None:
    """rigkit deploy's own options (the rest goes to pyinfra)."""
    parser.add_argument("--deploy", default=DEFAULT_DEPLOY if defaults else None,
                        help=f"deploy file (default {DEFAULT_DEPLOY}; rollback.py rolls back)")
    parser.add_argument("--canary", type=int, default=None, metavar="N",
                        help="rollout: N canary rigs first, smoke + cache proof (overrides rollout_canary)")
    parser.add_argument("--batch", type=int, default=None, metavar="M",
                        help="rollout: then the others M at a time (overrides rollout_batch)")
    parser.add_argument("--on-failure", default=None, choices=("leave", "rollback"),
                        help="rollout: after a halt, leave or roll back the rigs it upgraded (rollout_on_failure)")
    parser.add_argument("--recheck-canaries", action="store_true", default=None,
                        help="rollout re-run: deploy and prove the canaries again even when they passed")


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
    from rigkit.rollout import rollout_command, rollout_step
    from rigkit.rollout_plan import ALL_AT_ONCE

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
    print("\n--> rigkit fleet summary:")
    print(format_table(outcomes))
    bad = [o.rig for o in outcomes if o.status != OK]
    print(f"{len(outcomes) - len(bad)} of {len(outcomes)} rigs completed" + (f"; not completed: {', '.join(bad)}"
                                                                             if bad else ""))
    return status
