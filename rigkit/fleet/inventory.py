"""A pyinfra inventory as rigkit reads it before any host is touched: its hosts loaded by pyinfra's own code,
the ones a --limit selects, which of them are rigs, and whether each can authenticate."""

from __future__ import annotations

import difflib
import fnmatch
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

from rigkit.errors import ConfigError
from rigkit.paths import REPO_ROOT
from rigkit.settings.connection import connection_values
from rigkit.settings.defaults import KV_STORE_GROUP, MONITORING_GROUP, ROUTER_GROUP, SECRET_SETTINGS
from rigkit.settings.hostdata import rig_settings
from rigkit.settings.variables import REDACTED, SUGGESTION_CUTOFF, closest_name

# pyinfra_cli monkey-patches the whole process with gevent on import: inventories load in a child.
# argv[3]: the run's --data KEY=VALUE pairs (JSON list), parsed and applied as pyinfra applies them.
# Besides the hosts it prints what rigkit checks that pyinfra does not: each group's declared host names (a host
# twice), each group's data (groups of one host that disagree) and, when a file raises, where.
LOAD_INVENTORY = """
import json, sys, traceback
from pathlib import Path
from pyinfra.api import State
from pyinfra.context import ctx_inventory, ctx_state
from pyinfra_cli import inventory as cli_inventory
from pyinfra_cli.util import parse_cli_arg
override = {k: parse_cli_arg(v) for k, _, v in (pair.partition("=") for pair in json.loads(sys.argv[3]))}
try:
    with ctx_state.use(State()):
        inventory = cli_inventory.make_inventory_from_files(sys.argv[1], override_data=override or None,
                                                            cwd=sys.argv[2])
        declared = {}
        if Path(sys.argv[1]).exists():
            with ctx_inventory.use(inventory):
                for group, hosts in cli_inventory._get_groups_from_filename(sys.argv[1]).items():
                    hosts = hosts[0] if isinstance(hosts, tuple) else hosts
                    declared[group] = [host[0] if isinstance(host, tuple) else host for host in hosts]
except Exception as exc:
    # pyinfra wraps what a data file raised as UnexpectedExternalError(the exception, the file)
    if exc.args and isinstance(exc.args[0], BaseException):
        exc = exc.args[0]
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith(".py")
              and "site-packages" not in f.filename and not f.filename.startswith("<")]
    where = frames[-1] if frames else None
    try:
        message = str(exc)
    except Exception:
        message = repr(exc.args)
    print(json.dumps({"error": {"type": type(exc).__name__, "message": message,
                                "file": where.filename if where else None, "line": where.lineno if where else None}}))
    sys.exit(0)
print(json.dumps({"hosts": {h.name: {"data": h.data.dict(), "groups": sorted(h.groups)} for h in inventory},
                  "declared": declared,
                  "group_data": {g: inventory.get_group_data(g) for g in inventory.groups},
                  # the folders pyinfra reads group data from (make_inventory_from_files)
                  "group_files": sorted({p.stem for folder in {Path(sys.argv[2]), Path(sys.argv[1]).resolve().parent}
                                         for p in (folder / "group_data").glob("*.py")})}, default=str))
"""


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
            raise ConfigError(
                f"{name}.ssh_key",
                str(key),
                "the SSH key file does not exist or is not readable",
                "point ssh_key at the private key that opens this rig (inventory or group_data)",
            )
        return
    if data.get("ssh_password"):
        return
    agent = data.get("ssh_allow_agent", True) and environ.get("SSH_AUTH_SOCK")
    default_keys = data.get("ssh_look_for_keys", True) and any(
        Path(os.path.expanduser(f"~/.ssh/{n}")).is_file() for n in ("id_ed25519", "id_ecdsa", "id_rsa")
    )
    if not (agent or default_keys):
        raise ConfigError(
            f"{name}.ssh_key",
            None,
            "no SSH key for this host: no ssh_key, no ssh_password, no agent and no default key "
            "(~/.ssh/id_*) to fall back on",
            f"set ssh_key for {name} in the inventory or its group_data",
        )


def check_inventory_path(inventory: str) -> None:
    """ConfigError unless ``inventory`` is a Python file: pyinfra reads any other text as host names (a missing
    ``inventory/fleet.py`` becomes one host of that name, nothing is reached, and the command exits 0)."""
    path = Path(inventory)
    if path.is_file() and path.suffix == ".py":
        return
    what = "is not a .py file" if path.is_file() else "is a directory" if path.is_dir() else "does not exist"
    near = closest_name(path.name, [p.name for p in path.parent.glob("*.py")]) if path.parent.is_dir() else None
    raise ConfigError(
        "inventory",
        inventory,
        f"{what} (pyinfra would read the text as host names and reach none)",
        f"did you mean {path.parent / near}?"
        if near
        else "give the path of a pyinfra inventory file, e.g. inventory/lab.py",
    )


def load_inventory(inventory: str, cwd: Path = REPO_ROOT, data_args: Sequence[str] = ()) -> dict[str, dict]:
    """host name -> {"data": merged host data, "groups": [...]}, loaded by pyinfra's own code in a child;
    ``data_args``: --data KEY=VALUE pairs, which override the inventory's data as in the pyinfra run."""
    check_inventory_path(inventory)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-c", LOAD_INVENTORY, inventory, str(cwd), json.dumps(list(data_args))],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if result.returncode != 0:
        raise ConfigError(
            "inventory",
            inventory,
            f"pyinfra could not load it: {result.stderr.strip()[-800:]}",
            "fix the inventory file (it is Python) or its group_data",
        )
    loaded = json.loads(result.stdout)
    if "error" in loaded:
        error = loaded["error"]
        where = f"{error['file']}:{error['line']}" if error["file"] else inventory
        raise ConfigError(
            "inventory",
            inventory,
            f"{where} raised {error['type']}: {error['message']}",
            f"fix {where} (inventory and group_data files are Python, run as pyinfra loads them)",
        )
    check_inventory(inventory, loaded["hosts"], loaded["declared"], loaded["group_data"], loaded["group_files"])
    return loaded["hosts"]


def check_inventory(
    inventory: str,
    hosts: Mapping[str, Mapping],
    declared: Mapping[str, Sequence[str]],
    group_data: Mapping[str, Mapping],
    group_files: Sequence[str] = (),
) -> None:
    """ConfigError for what pyinfra takes silently: no host at all, a host twice in one group, a host in two
    groups whose data set one name to different values (pyinfra picks one by group order), a group_data file
    whose name is a near-miss of a group (``group_files``: their names)."""
    if not hosts:
        raise ConfigError(
            "inventory",
            inventory,
            "declares no hosts",
            'list the rigs in a group of the inventory file, e.g. rigs = [("rig-a", {"ssh_hostname": "10.0.0.11"})]',
        )
    for name, host in hosts.items():
        connection_values(host["data"], name)
    for group, names in declared.items():
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ConfigError(
                f"{inventory}: {group}",
                twice[0],
                f"lists the host {twice[0]} twice",
                "list each host once per group (its data in one place)",
            )
    populated = sorted({g for host in hosts.values() for g in host.get("groups", []) if g != "all"})
    for group in sorted(set(group_files) - set(populated) - {"all"}):
        near = closest_name(group, populated)
        if near:  # group_data/ also holds other inventories' files: only a near-miss is a typo
            raise ConfigError(
                f"group_data/{group}.py",
                None,
                "matches no group of the inventory, so its data reaches no host",
                f"rename it group_data/{near}.py (the group {near!r})",
            )
    for name, host in sorted(hosts.items()):
        groups = [g for g in host.get("groups", []) if g != "all" and group_data.get(g)]
        for index, first in enumerate(groups):
            for other in groups[index + 1 :]:
                for key in sorted(set(group_data[first]) & set(group_data[other])):
                    one, two = (json.dumps(group_data[g][key], default=str) for g in (first, other))
                    if one != two:
                        shown = REDACTED if key in SECRET_SETTINGS else None
                        raise ConfigError(
                            f"{name}.{key}",
                            shown or group_data[other][key],
                            f"host {name} is in groups {first} and {other}, whose data set {key} to "
                            f"{shown or repr(group_data[first][key])} and "
                            f"{shown or repr(group_data[other][key])}: pyinfra would pick one silently",
                            f"set {key} in one of the two groups only, or on the host itself",
                        )


def _matches(name: str, info: Mapping, pattern: str) -> bool:
    return fnmatch.fnmatch(name, pattern) or any(fnmatch.fnmatch(g, pattern) for g in info.get("groups", []))


# How many near host names a --limit refusal suggests, and how near (difflib's ratio: rig7 is 0.75 from rig1).
NEAR_HOSTS = 3


def _limit_fix(hosts: Mapping[str, Mapping], pattern: str) -> str:
    """The nearest host names to a --limit that matches nothing (a host is what a mistyped name most often meant),
    else the nearest group, else every name."""
    folded = {name.casefold(): name for name in hosts}
    ratios = {name: difflib.SequenceMatcher(None, pattern.casefold(), name).ratio() for name in folded}
    # nearest first; equally near ones in inventory order
    near = sorted((name for name, ratio in ratios.items() if ratio >= SUGGESTION_CUTOFF), key=lambda n: -ratios[n])
    near = near[:NEAR_HOSTS]
    if near:
        return "did you mean " + " or ".join(repr(folded[name]) for name in near) + "?"
    groups = sorted({g for info in hosts.values() for g in info.get("groups", []) if g != "all"})
    group = closest_name(pattern, groups)
    if group:
        return f"did you mean the group {group!r}?"
    return f"use host or group names: {', '.join([*sorted(hosts), *groups])}"


def targeted(hosts: dict[str, dict], patterns: Sequence[str]) -> list[str]:
    """Host names a pyinfra --limit selects (names, groups or globs of either); all without a limit. ConfigError
    naming each pattern that matches nothing (a typo among several would otherwise drop its rigs silently)."""
    if not patterns:
        return list(hosts)
    for pattern in patterns:
        if not any(_matches(name, info, pattern) for name, info in hosts.items()):
            raise ConfigError(
                "--limit", pattern, "matches no host or group of the inventory", _limit_fix(hosts, pattern)
            )
    return [name for name, info in hosts.items() if any(_matches(name, info, p) for p in patterns)]


def is_service_host(groups: Iterable[str]) -> bool:
    """A host of the fleet's service groups (the router's gateways, the KV store, monitoring): it serves no stack."""
    return bool({ROUTER_GROUP, KV_STORE_GROUP, MONITORING_GROUP} & set(groups))


def rigs_among(hosts: Mapping[str, Mapping], names: Sequence[str]) -> list[str]:
    """``names`` without the fleet's service hosts (is_service_host)."""
    return [name for name in names if not is_service_host(hosts[name].get("groups", []))]


def inventory_rigs(hosts: Iterable) -> dict[str, tuple[dict, dict]]:
    """Every rig of a pyinfra inventory (``rigs_among``; also the hosts a --limit leaves out), name -> (host data,
    its validated serving knobs): the router's workers and the store firewall's sources. A bad value of any
    rig is a ConfigError before any host is touched."""
    found = {other.name: {"groups": list(other.groups), "data": other.data.dict()} for other in hosts}
    return {
        name: (found[name]["data"], rig_settings(found[name]["data"]).stack.knobs)
        for name in rigs_among(found, list(found))
    }
