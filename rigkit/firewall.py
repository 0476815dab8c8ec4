"""rigkit's firewalls: which sources may reach some TCP ports of a host, each as an nftables table of rigkit's own.

Each firewall is one ``Firewall`` declaration (its table, ruleset file, boot unit and the setting that turns it
on, rigkit.settings.firewalls): API_FIREWALL (the rigs' API, roles/api_firewall.py), KV_STORE_FIREWALL (the store's
port, roles/kv_store.py). They share everything else, so a host holding both keeps two independent tables.

Pure: the ruleset text, the systemd unit that loads it at boot, the allowed sources (validated with ipaddress)
and the lab's refusal; roles/firewall.py puts them on the host. A table hooks input and looks only at TCP
packets to its ports (for the API: serving_port, the LMCache ports of a profile that runs LMCache):
loopback, established connections and the allowed sources pass, the rest is dropped and counted.
Every other packet leaves the table at its first rule, so SSH and all other traffic are exactly as the host's
own firewall (if any) has them: an accept in one nftables table never overrides a drop in another.

A connection the rig makes to its own non-loopback address comes from that address, not from loopback:
it is dropped unless that address is allowed (the lab test uses this as "another host").
"""

from __future__ import annotations

import hashlib
import ipaddress
from typing import Iterable, Optional, Sequence

from rigkit.errors import PreflightError
from rigkit.settings.firewalls import API_FIREWALL, Firewall, Network, parse_source
from rigkit.systemd import exec_command_line

NFT = "/usr/sbin/nft"


def controller_address(ssh_connection: Optional[str]) -> Optional[Network]:
    """The controller as the rig sees it, from the first field of $SSH_CONNECTION (``client port server
    port``); None when the session carries none. An IPv4-mapped IPv6 address is its IPv4 address; a
    link-local zone (``%eth0``) is dropped (nft matches the address)."""
    fields = (ssh_connection or "").split()
    if not fields:
        return None
    try:
        address = ipaddress.ip_address(fields[0].split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return ipaddress.ip_network(address)


def controller_source(allow: bool, ssh_connection: Optional[str]) -> Optional[Network]:
    """The controller's address to allow (api_allow_controller), read from the deploy's SSH session;
    PreflightError when it is wanted but the session does not say where it comes from."""
    if not allow:
        return None
    address = controller_address(ssh_connection)
    if address is None:
        raise PreflightError(
            "api_allow_controller",
            True,
            "the deploy's SSH session on the rig carries no "
            f"SSH_CONNECTION address ({ssh_connection!r}), so the controller's address is unknown",
            "add the controller's address as the rig sees it to api_allowed_sources and set "
            "api_allow_controller: false",
        )
    return address


def allowed_sources(
    declared: Iterable[str], controller: Optional[Network] = None, firewall: Firewall = API_FIREWALL
) -> list[Network]:
    """Every source besides loopback, each once, in a stable order (the ruleset's hash depends on it)."""
    networks = {parse_source(text, firewall) for text in declared}
    if controller is not None:
        networks.add(controller)
    return sorted(networks, key=lambda network: (network.version, network))


def source_text(network: Network) -> str:
    """nft's spelling: a single host as its address, a network as address/prefix."""
    return str(network.network_address) if network.prefixlen == network.max_prefixlen else str(network)


def _set(items: Sequence[str]) -> str:
    return "{ " + ", ".join(items) + " }"


def _rules(firewall: Firewall, ports: Sequence[int], sources: Sequence[Network]) -> list[str]:
    """The table's body lines (without its comment)."""
    for port in ports:
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise ValueError(f"not a TCP port: {port!r}")
    v4 = [source_text(n) for n in sources if n.version == 4]
    v6 = [source_text(n) for n in sources if n.version == 6]
    lines = [
        "\tchain input {",
        "\t\ttype filter hook input priority filter; policy accept;",
        f"\t\ttcp dport {_set([str(port) for port in sorted(set(ports))])} jump {firewall.chain}",
        "\t}",
        "",
        f"\tchain {firewall.chain} {{",
        "\t\tct state established,related accept",
        '\t\tiif "lo" ip saddr 127.0.0.0/8 accept',
        '\t\tiif "lo" ip6 saddr ::1 accept',
    ]
    if v4:
        lines.append(f"\t\tip saddr {_set(v4)} accept")
    if v6:
        lines.append(f"\t\tip6 saddr {_set(v6)} accept")
    lines += ["\t\tcounter drop", "\t}"]
    return lines


def ruleset_comment(firewall: Firewall, ports: Sequence[int], sources: Sequence[Network]) -> str:
    """The table's comment: names the ruleset by its hash, so a deploy tells whether the loaded table is
    the one it wants (a table flushed by hand, or a file whose load failed, is loaded again)."""
    digest = hashlib.sha256("\n".join(_rules(firewall, ports, sources)).encode()).hexdigest()[:16]
    return f"{firewall.comment_prefix}{digest}"


def ruleset(firewall: Firewall, ports: Sequence[int], sources: Sequence[Network]) -> str:
    """The nft script: creates the table if absent, deletes it, defines it anew, in one transaction
    (``nft -f`` is atomic), so only this firewall's table is replaced and a bad script changes nothing."""
    table = firewall.table
    return "\n".join(
        [
            "#!/usr/sbin/nft -f",
            f"# Rendered by rigkit (rigkit/firewall.py, {firewall.setting}): change host or group data, not this file.",
            f"# TCP ports {', '.join(str(port) for port in sorted(set(ports)))} only from loopback and the sources below;",
            "# every other packet passes this table untouched.",
            f"table inet {table}",
            f"delete table inet {table}",
            f"table inet {table} {{",
            f'\tcomment "{ruleset_comment(firewall, ports, sources)}"',
            *_rules(firewall, ports, sources),
            "}",
            "",
        ]
    )


def unit_text(firewall: Firewall) -> str:
    """Loads the ruleset at boot, before the network is up (as Debian's nftables.service) and before the
    guarded service, after nftables.service, whose ``flush ruleset`` would otherwise drop rigkit's table."""
    return (
        "[Unit]\n"
        f"Description=rigkit {firewall.title}: {firewall.guards} from the allowed sources only "
        f"(nft table inet {firewall.table})\n"
        "DefaultDependencies=no\n"
        "Wants=network-pre.target\n"
        "After=nftables.service\n"
        f"Before=network-pre.target shutdown.target {firewall.before}\n"
        "Conflicts=shutdown.target\n\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        f"ExecStart={exec_command_line([NFT, '-f', firewall.ruleset_path])}\n\n"
        "[Install]\n"
        "WantedBy=sysinit.target\n"
    )


def exposure_notice(enabled: bool, bind_address: str, port: int) -> Optional[str]:
    """What the deploy says about who can reach the API, or None when there is nothing to say."""
    loopback = ipaddress.ip_address(bind_address).is_loopback
    if enabled and loopback:
        return (
            f"api_firewall: bind_address {bind_address} is loopback: only the rig itself reaches port {port} "
            "(the firewall matters once bind_address is not loopback, e.g. 0.0.0.0 for a router)"
        )
    if not enabled and not loopback:
        return (
            f"api_firewall: off, and the API listens on {bind_address}:{port}: every host that can route to "
            "the rig reaches it; set api_firewall: true and api_allowed_sources to limit it"
        )
    return None


def wildcard_exposure_notice(
    service: str, setting: str, addresses: Sequence[str], port: int, firewall: Optional[str] = None
) -> Optional[str]:
    """What the deploy says when ``service`` listens on a wildcard address (0.0.0.0, ::) with no firewall of rigkit's
    in front (``firewall``: the setting that would put one there, off; None: the service has none), or None."""
    wildcard = [address for address in addresses if ipaddress.ip_address(address).is_unspecified]
    if not wildcard:
        return None
    limit = (
        f"set {firewall}: true to let only the rigs in, or" if firewall else "rigkit puts no firewall in front of it:"
    )
    return (
        f"{service}: {setting} {wildcard[0]} listens on every address, port {port}, with no firewall in front: "
        f"every host that can route here reaches it; {limit} bind it to one address on a trusted network"
    )


def refuse_same_namespace(firewall: Firewall, rig_namespace: Optional[str], controller_namespace: str) -> None:
    """The same rule checked on the rig itself when it is deployed (a lab inventory that set lab_netns
    wrongly): the rig's network namespace (``readlink /proc/self/ns/net``) must not be the controller's.
    Meaningful only inside the lab, where both run on one kernel (every machine's first namespace has the
    same number)."""
    if rig_namespace and rig_namespace == controller_namespace:
        raise PreflightError(
            firewall.setting,
            True,
            f"the rig's network namespace {rig_namespace} is the "
            "controller's own: its firewall rules would change this machine's firewall",
            f"run this lab rig in its own network namespace, or set {firewall.setting}: false",
        )
