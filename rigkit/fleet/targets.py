"""The one way a command picks its hosts: the inventory loaded as the pyinfra run will see it (--data applied
by pyinfra's own code), the hosts a --limit selects, the fleet's service hosts left out where only rigs are
wanted, and what can be refused before any host is touched (rigs sharing a KV store that disagree, a host with
no way to authenticate)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rigkit.errors import ConfigError
from rigkit.fleet.inventory import check_connection_data, load_inventory, rigs_among, targeted
from rigkit.fleet.pyinfra_args import check_data_pairs
from rigkit.kv_share import check_inventory
from rigkit.listeners import refuse_shared_ports


@dataclass(frozen=True)
class Targets:
    inventory: str
    hosts: dict[str, dict]  # every host of the inventory: {"data": ..., "groups": [...]}, --data applied
    names: list[str]  # the targeted hosts, in inventory order

    def data(self, name: str) -> dict:
        return dict(self.hosts[name]["data"])


def select(inventory: str, limits: Sequence[str] = (), data: Sequence[str] = (), rigs_only: bool = True) -> Targets:
    """The targeted hosts of ``inventory``: ``limits`` as pyinfra's --limit patterns (a comma list split), ``data``
    as its --data KEY=VALUE pairs; ``rigs_only`` leaves out the gateways and the KV store. ConfigError before any
    host is touched."""
    check_data_pairs(data)
    patterns = [pattern for limit in limits for pattern in limit.split(",") if pattern]
    hosts = load_inventory(inventory, data_args=data)
    check_inventory((name, host["groups"], host["data"]) for name, host in hosts.items())
    refuse_shared_ports((name, host["groups"], host["data"]) for name, host in hosts.items())
    names = targeted(hosts, patterns)
    if rigs_only:
        names = rigs_among(hosts, names)
    if not names:
        raise _nothing_targeted(inventory, hosts, patterns, rigs_only)
    for name in names:
        check_connection_data(name, hosts[name]["data"])
    return Targets(inventory, hosts, names)


def _nothing_targeted(inventory: str, hosts: dict[str, dict], patterns: list[str], rigs_only: bool) -> ConfigError:
    kind = "rig" if rigs_only else "host"
    if not hosts:
        return ConfigError("inventory", inventory, "has no hosts", "add the rigs to the inventory file")
    if not patterns:
        return ConfigError(
            "inventory",
            inventory,
            f"has no {kind} (only {', '.join(sorted(hosts))})",
            "add the rigs to the inventory file",
        )
    return ConfigError(
        "--limit",
        ",".join(patterns),
        f"matches no {kind} of {inventory}",
        f"use host or group names from the inventory: {', '.join(sorted(hosts))}",
    )
