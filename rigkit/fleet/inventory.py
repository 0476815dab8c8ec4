"""A pyinfra inventory as rigkit reads it before any host is touched: its hosts loaded by pyinfra's own code,
the ones a --limit selects, which of them are rigs, and whether each can authenticate."""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

from rigkit.errors import ConfigError
from rigkit.paths import REPO_ROOT
from rigkit.settings.defaults import KV_STORE_GROUP, ROUTER_GROUP
from rigkit.settings.hostdata import rig_settings

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


def targeted(hosts: dict[str, dict], patterns: Sequence[str]) -> list[str]:
    """Host names a pyinfra --limit selects (names, groups or globs of either); all without a limit."""
    if not patterns:
        return list(hosts)
    return [name for name, info in hosts.items()
            if any(fnmatch.fnmatch(name, p) or any(fnmatch.fnmatch(g, p) for g in info.get("groups", []))
                   for p in patterns)]


def is_service_host(groups: Iterable[str]) -> bool:
    """A host of the fleet's service groups (the router's gateways, the KV store): it serves no stack."""
    return bool({ROUTER_GROUP, KV_STORE_GROUP} & set(groups))


def rigs_among(hosts: Mapping[str, Mapping], names: Sequence[str]) -> list[str]:
    """``names`` without the fleet's service hosts (is_service_host)."""
    return [name for name in names if not is_service_host(hosts[name].get("groups", []))]


def inventory_rigs(hosts: Iterable) -> dict[str, tuple[dict, dict]]:
    """Every rig of a pyinfra inventory (``rigs_among``; also the hosts a --limit leaves out), name -> (host data,
    its validated serving knobs): the router's workers and the store firewall's sources. A bad value of any
    rig is a ConfigError before any host is touched."""
    found = {other.name: {"groups": list(other.groups), "data": other.data.dict()} for other in hosts}
    return {name: (found[name]["data"], rig_settings(found[name]["data"]).stack.knobs)
            for name in rigs_among(found, list(found))}
