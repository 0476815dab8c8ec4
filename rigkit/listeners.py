"""The TCP ports rigkit's services listen on, per machine: two services of one machine on one port are refused before
any host is touched, naming both settings (the second would fail at start, or, with SO_REUSEPORT, share the port).

A machine is an SSH address and port: a rig and the KV store declared as two inventory hosts of one box are one
machine. Each service's own ports are refused by its own check (the stack's: rigkit.settings.hostdata; the
router's: rigkit.router); this module compares different services.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from rigkit.errors import ConfigError
from rigkit.remote.tunnel import ssh_address
from rigkit.router import is_gateway
from rigkit.settings.defaults import (
    KV_STORE_GROUP,
    KV_STORE_VARIABLES,
    MONITORING_GROUP,
    MONITORING_VARIABLES,
    NODE_EXPORTER_VARIABLES,
    ROUTER_VARIABLES,
)
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.knobs import PORT_RANGE
from rigkit.settings.variables import resolve


@dataclass(frozen=True)
class Listener:
    host: str
    service: str
    setting: str
    port: int
    addresses: tuple[str, ...]

    def overlaps(self, other: "Listener") -> bool:
        """Both on one port of one address (a wildcard address is every address)."""
        if self.port != other.port or self.service == other.service:
            return False
        every = any(ipaddress.ip_address(a).is_unspecified for a in (*self.addresses, *other.addresses))
        return every or bool(set(self.addresses) & set(other.addresses))


def host_listeners(name: str, groups: Sequence[str], data: Mapping[str, Any]) -> list[Listener]:
    """What host ``name`` listens on, by the role deploy.py gives its groups (one role per host)."""
    if KV_STORE_GROUP in groups:
        store = resolve(KV_STORE_VARIABLES, data)
        return [
            Listener(
                name, "the KV store", "kv_store_port", store["kv_store_port"], tuple(store["kv_store_bind_addresses"])
            )
        ]
    if MONITORING_GROUP in groups:
        prometheus = resolve(MONITORING_VARIABLES, data)
        address = (prometheus["monitoring_bind_address"],)
        return [Listener(name, "Prometheus", "monitoring_port", prometheus["monitoring_port"], address)]
    if is_gateway(groups):
        router = resolve(ROUTER_VARIABLES, data)
        address = (router["router_bind_address"],)
        return [
            Listener(name, "the router", setting, router[setting], address)
            for setting in ("router_port", "router_metrics_port")
        ]
    if not data.get("serving_profile"):
        return []
    stack = settings_for_host(dict(data))
    bind = (stack.knobs["bind_address"],)
    found = [Listener(name, "the serving stack", setting, port, bind) for setting, port in stack.listen_ports.items()]
    exporter = resolve(NODE_EXPORTER_VARIABLES, data)
    if exporter["node_exporter"]:  # it listens on the rig's bind_address (roles/node_exporter.py)
        found.append(Listener(name, "the node exporter", "node_exporter_port", exporter["node_exporter_port"], bind))
    return found


def machine(name: str, data: Mapping[str, Any]) -> tuple[str, str]:
    """The box a host is: where SSH reaches it (two inventory hosts of one address and SSH port are one box)."""
    return ssh_address(name, data), str(data.get("ssh_port") or 22)


def refuse_shared_ports(
    hosts: Iterable[tuple[str, Sequence[str], Mapping[str, Any]]], only: Sequence[str] = ()
) -> None:
    """ConfigError naming both settings when two services of one machine listen on one port; ``only``: check the
    machines of these hosts only (a deploy of one host), else every machine."""
    hosts = list(hosts)
    wanted = {machine(name, data) for name, _, data in hosts if name in only} if only else None
    by_machine: dict[tuple[str, str], list[Listener]] = {}
    for name, groups, data in hosts:
        box = machine(name, data)
        if wanted is None or box in wanted:
            by_machine.setdefault(box, []).extend(host_listeners(name, groups, data))
    for (address, _), listeners in by_machine.items():
        for index, first in enumerate(listeners):
            for second in listeners[index + 1 :]:
                if first.overlaps(second):
                    taken = {listener.port for listener in listeners}
                    free = next(p for p in range(second.port + 1, PORT_RANGE[1] + 1) if p not in taken)
                    raise ConfigError(
                        f"{second.host}.{second.setting}",
                        second.port,
                        f"is also {first.host}.{first.setting}: {second.service} and {first.service} would both "
                        f"listen on port {second.port} of {address}, and the second to start would fail",
                        f"set {second.setting} to another port, e.g. {free}",
                    )
