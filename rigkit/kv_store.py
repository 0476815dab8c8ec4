"""The fleet's shared KV store: valkey-server's configuration and LMCache's Valkey L2 adapter, as plain values.

roles/kv_store.py writes ``config_text`` on the store host (a host of rigkit.settings.defaults.KV_STORE_GROUP) and
checks the server answers as declared; rigkit.settings.hostdata points a rig's LMCache at it (``adapter_json``).

Reachable by the rigs only: valkey binds to the declared addresses alone, keeps protected-mode on and
requires the password (requirepass) on every connection, and the store firewall (KV_STORE_FIREWALL, nft table
``inet rigkit_kv_store``, on by default with ``kv_store_firewall``) lets only loopback and ``store_sources``
reach kv_store_port: the rigs of the inventory, resolved to addresses on the controller, or the declared
``kv_store_allowed_sources``.

LMCache's Valkey L2 adapter (lmcache/v1/distributed/l2_adapters/valkey_l2_adapter.py, LMCache commits
22d15507 and d4eb1aa2): ``--l2-adapter '{"type": "valkey", "startup_nodes": "HOST:PORT", "password": ...}'``;
its ``max_capacity_gb`` left at 0 defers eviction to the server, which LMCache recommends unless one writer
owns the store alone. It takes the password only inside that JSON, so the rig's entrypoint splices it in
from the environment at start (profiles.yaml, lmcache-mp): compose.yml and the rendered JSON never hold it.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import socket
from typing import Callable, Mapping, Optional, Sequence

from rigkit.errors import ConfigError
from rigkit.firewall import Network, allowed_sources
from rigkit.settings.firewalls import KV_STORE_FIREWALL
from rigkit.settings.hostdata import ADAPTER_CONNECTION_TIMEOUT_S
from rigkit.settings.knobs import password_problem
from rigkit.settings.sizing import GIB

# valkey-server as Debian 13 packages it (valkey 8.1): the main file includes rigkit's, last, so rigkit's
# directives win over the package's defaults without rigkit owning the package's file.
VALKEY_PACKAGES = ("valkey-server", "valkey-tools")
VALKEY_USER = "valkey"
VALKEY_MAIN_CONF = "/etc/valkey/valkey.conf"
RIGKIT_CONF = "/etc/valkey/rigkit.conf"
# root:valkey 0640: valkey reads it, no other user does (it holds the password).
RIGKIT_CONF_MODE = "640"
INCLUDE_LINE = f"include {RIGKIT_CONF}"

# Valkey's own answer to a command on a connection that has not authenticated.
NOAUTH_REPLY = "NOAUTH"


def config_text(settings: Mapping, password: str) -> str:
    """rigkit's valkey.conf directives for the ``kv_store`` section (validated) and the checked password."""
    problem = password_problem(password)
    if problem:  # hostdata checks it first; this guards the one writer of the file
        raise ValueError(f"kv_store_password {problem}")
    lines = [
        "# rigkit: written by roles/kv_store.py (included last by valkey.conf); edits are overwritten",
        "bind " + " ".join(settings["kv_store_bind_addresses"]),
        f"port {settings['kv_store_port']}",
        # refuses clients from other addresses while no password is set: a second guard behind requirepass
        "protected-mode yes",
        f'requirepass "{password}"',
        f"maxmemory {maxmemory_bytes(settings)}",
        f"maxmemory-policy {settings['kv_store_maxmemory_policy']}",
        # a cache tier: nothing to persist, and a fork for a snapshot would double the store's memory
        'save ""',
        "appendonly no",
    ]
    return "\n".join(lines) + "\n"


def maxmemory_bytes(settings: Mapping) -> int:
    """kv_store_maxmemory_gib in bytes, as valkey's maxmemory reads a bare number."""
    return settings["kv_store_maxmemory_gib"] * GIB


# Prints the password of rigkit.conf: the checks' valkey-cli reads it from the environment (REDISCLI_AUTH,
# VALKEYCLI_AUTH), so it is never in a command line, in ps or in pyinfra's output.
AUTH_FROM_CONFIG = f"sed -n 's/^requirepass \"\\(.*\\)\"$/\\1/p' {RIGKIT_CONF}"


def check_address(settings: Mapping) -> str:
    """The address the role's own checks connect to: loopback when valkey binds it, else its first address."""
    addresses = settings["kv_store_bind_addresses"]
    return next((a for a in addresses if a in ("127.0.0.1", "::1")), addresses[0])


def answers_as_declared(settings: Mapping, answers: Mapping) -> list[str]:
    """What the store answered that differs from its declaration (empty: it answers as declared).

    ``answers``: rigkit.facts.kv_store.StoreAnswers (the unauthenticated PING, then the authenticated PING
    and CONFIG GET maxmemory / maxmemory-policy)."""
    problems = []
    if NOAUTH_REPLY not in answers["unauthenticated"]:
        problems.append(f"a PING without the password got {answers['unauthenticated']!r}, not {NOAUTH_REPLY}")
    if answers["authenticated"] != "PONG":
        problems.append(f"a PING with the password got {answers['authenticated']!r}, not PONG")
    wanted = {"maxmemory": str(maxmemory_bytes(settings)), "maxmemory-policy": settings["kv_store_maxmemory_policy"]}
    for name, value in wanted.items():
        if answers["config"].get(name) != value:
            problems.append(f"CONFIG GET {name} is {answers['config'].get(name)!r}, not {value!r}")
    return problems


def resolve_address(address: str) -> list[str]:
    """Every IP address ``address`` (an IP address or a host name) resolves to on the controller;
    OSError when a name does not resolve."""
    return sorted({info[4][0].split("%", 1)[0] for info in socket.getaddrinfo(address, None, proto=socket.IPPROTO_TCP)})


def _loopback(addresses: Sequence[str]) -> bool:
    return any(ipaddress.ip_address(address).is_loopback for address in addresses)


def store_sources(
    settings: Mapping,
    store: tuple[str, str],
    rigs: Mapping[str, str],
    resolve: Callable[[str], list[str]] = resolve_address,
) -> list[Network]:
    """The sources the store firewall allows besides loopback, each once and ordered (rigkit.firewall).

    ``kv_store_allowed_sources`` when declared; else every rig of the inventory at its address (``rigs``: rig
    name -> rigkit.router.rig_address), resolved here on the controller. ``store``: (the store host's name, its
    SSH address). ConfigError, naming the rig and the fix, for an address that does not resolve, or that is
    loopback while the store is elsewhere (the rig would come from an address nobody declared); a loopback rig
    on the store's own loopback needs no source. Plus the address the role's own check connects to when it is
    not loopback: a connection to the host's own address comes from that address."""
    declared = settings["kv_store_allowed_sources"]
    texts = list(declared) if declared is not None else _rig_sources(settings, store, rigs, resolve)
    own = check_address(settings)
    if own not in ("0.0.0.0", "::") and not ipaddress.ip_address(own).is_loopback:
        texts.append(own)
    return allowed_sources(texts, None, KV_STORE_FIREWALL)


def _rig_sources(
    settings: Mapping, store: tuple[str, str], rigs: Mapping[str, str], resolve: Callable[[str], list[str]]
) -> list[str]:
    store_name, store_address = store
    fix = "or declare kv_store_allowed_sources on the store host: the rigs' addresses as the store sees them"
    if not rigs and any(not ipaddress.ip_address(a).is_loopback for a in settings["kv_store_bind_addresses"]):
        raise ConfigError(
            "kv_store_allowed_sources",
            None,
            f"kv_store_firewall is on and the inventory has no rig "
            f"to allow: {store_name} would take connections to kv_store_port from its own loopback only",
            f"deploy the store in the same inventory as its rigs, {fix}",
        )
    store_ips = _resolved(store_name, store_address, resolve, "the store host", fix)
    sources: list[str] = []
    for name, address in rigs.items():
        ips = _resolved(
            name, address, resolve, "rig", f"set an IP ssh_hostname or router_worker_address for {name}, " + fix
        )
        if _loopback(ips):
            if _loopback(store_ips):
                continue  # the rig shares the store's loopback (the lab's host network): loopback passes already
            raise ConfigError(
                "kv_store_allowed_sources",
                address,
                f"rig {name}'s address {address} is loopback while "
                f"the store {store_name} is at {store_address}: the rig reaches the store from an "
                "address the inventory does not name",
                f"set router_worker_address for {name} to its address on the store's network, {fix}",
            )
        sources += ips
    return sources


def _resolved(name: str, address: str, resolve: Callable[[str], list[str]], what: str, fix: str) -> list[str]:
    try:
        return resolve(address)
    except OSError as exc:
        raise ConfigError(
            "kv_store_allowed_sources",
            address,
            f"{what} {name}'s address {address} does not resolve on the controller ({exc})",
            fix,
        ) from None


# `rigkit status` asks the store from each rig that uses it, as that rig's LMCache reaches it: the rig's python3
# (standard library only) connects, sends AUTH with the password of the stack's .env and PING, within
# ADAPTER_CONNECTION_TIMEOUT_S, and prints one line that never holds the password: "store=up" or "store=down: WHY".
STORE_PROBE = r"""
import socket, sys
host, port, timeout, env_file, env_name = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
password = ""
try:
    with open(env_file) as env:
        for line in env:
            if line.startswith(env_name + "="):
                password = line.split("=", 1)[1].strip().strip("'")
except OSError as exc:
    print("store=down: the stack's .env cannot be read (%s)" % type(exc).__name__)
    sys.exit(0)
def command(*words):
    words = [word.encode() for word in words]
    return b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(word), word) for word in words)
reply = b""
try:
    with socket.create_connection((host, port), timeout=timeout) as connection:
        connection.sendall(command("AUTH", password) + command("PING"))
        while reply.count(b"\r\n") < 2:
            chunk = connection.recv(4096)
            if not chunk:
                break
            reply += chunk
except socket.timeout:
    print("store=down: no answer within %g s" % timeout)
except OSError as exc:
    print("store=down: %s" % (exc.strerror or type(exc).__name__))
else:
    answers = reply.decode(errors="replace").split("\r\n")[:2]
    print("store=up" if answers == ["+OK", "+PONG"] else "store=down: it answered %s" % " ".join(answers)[:200])
"""


def store_node(adapter: str) -> tuple[str, int]:
    """(address, port) of the store a rendered Valkey adapter JSON points at (its startup_nodes)."""
    address, _, port = json.loads(adapter)["startup_nodes"].rpartition(":")
    return address, int(port)


def store_probe_command(adapter: str, env_path: str, password_env: str) -> str:
    address, port = store_node(adapter)
    args = [address, str(port), f"{ADAPTER_CONNECTION_TIMEOUT_S:g}", env_path, password_env]
    return (
        f"if command -v python3 >/dev/null 2>&1; then python3 -c {shlex.quote(STORE_PROBE)} "
        f"{' '.join(shlex.quote(arg) for arg in args)}; else echo 'store=down: python3 is not on the rig'; fi"
    )


def parse_store_probe(output: Optional[str]) -> Optional[str]:
    """None when the store answered, else why not."""
    line = next((line for line in (output or "").splitlines() if line.startswith("store=")), "store=down: no answer")
    value = line.removeprefix("store=")
    return None if value == "up" else value.removeprefix("down: ")
