"""The firewalls' settings: each firewall rigkit manages is declared by the setting that turns it on (a Firewall:
its table, ruleset file and boot unit), with the check of its allowed sources and the lab's refusal.
rigkit.firewall turns them into rulesets and boot units; rigkit.kv_store guards the store with KV_STORE_FIREWALL.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Callable, Mapping, Union

from rigkit.errors import ConfigError
from rigkit.settings.types import network_problem

SYSTEMD_UNIT_DIR = "/etc/systemd/system"
VALKEY_SERVICE = "valkey-server.service"


@dataclass(frozen=True)
class Firewall:
    """One firewall rigkit manages: what a ruleset, its boot unit, the role and its refusals are named by."""

    setting: str  # the bool variable turning it on; names it in the ruleset, its comment and refusals
    title: str  # what the unit and the role's operations call it ("API firewall")
    table: str  # nft table inet <table>: this firewall's own, no other is touched
    chain: str  # the chain the guarded ports jump to
    ruleset_path: str  # the nft script on the host
    unit_name: str  # the systemd unit that loads it at boot
    guards: str  # what its ports are, for the unit's description ("the serving ports")
    before: str  # the unit that must not start before the table is loaded (the guarded service)

    @property
    def unit_path(self) -> str:
        return f"{SYSTEMD_UNIT_DIR}/{self.unit_name}"

    @property
    def comment_prefix(self) -> str:
        """The table comment's start; the ruleset's hash follows: which ruleset the loaded table holds."""
        return f"rigkit {self.setting} "


API_FIREWALL = Firewall(
    setting="api_firewall",
    title="API firewall",
    table="rigkit_api",
    chain="api",
    ruleset_path="/etc/rigkit/api-firewall.nft",
    unit_name="rigkit-api-firewall.service",
    guards="the serving ports",
    before="docker.service",
)

# The store's own firewall: independent of the API firewall's table, file and unit (the lab puts the store on a
# rig, so one host may hold both), loaded before valkey starts at boot.
KV_STORE_FIREWALL = Firewall(
    setting="kv_store_firewall",
    title="KV store firewall",
    table="rigkit_kv_store",
    chain="kv_store",
    ruleset_path="/etc/rigkit/kv-store-firewall.nft",
    unit_name="rigkit-kv-store-firewall.service",
    guards="the store's port",
    before=VALKEY_SERVICE,
)

Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]


def parse_source(text: str, firewall: Firewall = API_FIREWALL) -> Network:
    """One allowed source (an address or a network in CIDR form); ValueError naming the fix."""
    problem = network_problem(text)
    if problem:
        raise ValueError(f"{text!r} {problem}")
    try:
        network = ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        if "host bits set" in str(exc):
            loose = ipaddress.ip_network(text, strict=False)
            raise ValueError(
                f"{text!r} has host bits set: write {loose} for the network, or {text.split('/')[0]} for the one host"
            ) from None
        raise ValueError(f"{text!r} is not an IP address or network (10.0.0.5, 10.0.0.0/24, fd00::/64)") from None
    if network.prefixlen == 0:
        raise ValueError(f"{text!r} allows every address: turn {firewall.setting} off instead")
    return network


def sources_check(firewall: Firewall) -> Callable[[list], None]:
    """The variable check of a firewall's allowed sources (api_allowed_sources): a list of addresses or networks."""

    def check(value: list) -> None:
        for item in value:
            if not isinstance(item, str):
                raise ValueError(f"{item!r} is not text: give each source as a string such as '10.0.0.5'")
            parse_source(item, firewall)

    check.fix = 'write a list of addresses or CIDR networks as the host sees them, e.g. ["10.0.0.5", "10.0.1.0/24"]'
    return check


def refuse_on_shared_network(firewall: Firewall, data: Mapping, enabled: bool) -> None:
    """The lab's hard rule: a lab rig on host networking shares this machine's network namespace, so its
    nft rules would be this machine's firewall. Only a lab rig in its own namespace may take one."""
    if enabled and data.get("lab_rig") and not data.get("lab_netns"):
        raise ConfigError(
            firewall.setting,
            True,
            "this lab rig runs on host networking: its network namespace is "
            "the controller's, so the rig's firewall rules would change this machine's firewall",
            f"enable {firewall.setting} only on a lab rig in its own network namespace (lab_netns: "
            f"the netns rigs of `rigkit lab up`), or set {firewall.setting}: false",
        )
