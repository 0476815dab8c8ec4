"""The firewall roles' shared steps (no role of its own): one of rigkit's firewalls (a rigkit.settings.firewalls.Firewall)
put on the host, or taken off it. roles/api_firewall.py and roles/kv_store.py each call them with their own
declaration, so their tables, ruleset files and boot units never touch each other.
"""

from __future__ import annotations

import os
from io import StringIO
from typing import Sequence

from pyinfra import host
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import files, systemd

from rigkit.facts.batch import FactSpec
from rigkit.facts.firewall import NftTableComment
from rigkit.facts.surveyed import put_reads, service_reads
from rigkit.firewall import Firewall, Network, ruleset, ruleset_comment, source_text, unit_text
from rigkit.operations import say
from rigkit.operations.apt import packages_installed
from rigkit.operations.firewall import ruleset_loaded, table_removed

PACKAGES = ["nftables"]


def controller_namespace() -> str:
    """This machine's network namespace, as the host's NetworkNamespace fact names one (the lab's guard)."""
    return os.readlink("/proc/self/ns/net")


def applied_reads(firewall: Firewall) -> list[FactSpec]:
    """What firewall_applied's operations read on a host that already holds the firewall."""
    return [
        FactSpec.of(DebPackages),
        *put_reads(firewall.ruleset_path),
        *put_reads(firewall.unit_path),
        FactSpec.of(NftTableComment, table=firewall.table),
        *service_reads(firewall.unit_name),
    ]


def firewall_applied(firewall: Firewall, ports: Sequence[int], sources: Sequence[Network]) -> None:
    """nftables installed, the ruleset and its boot unit written, the table loaded when it does not hold the
    wanted ruleset's hash (``nft -c`` first), the unit enabled; the deploy says who may reach the ports."""
    title = firewall.title
    packages_installed(name="Install nftables", packages=PACKAGES)
    files.put(
        name=f"{title} ruleset", src=StringIO(ruleset(firewall, ports, sources)), dest=firewall.ruleset_path, mode="644"
    )
    unit = files.put(
        name=f"{title} unit (loads the ruleset at boot)",
        src=StringIO(unit_text(firewall)),
        dest=firewall.unit_path,
        mode="644",
    )
    systemd.daemon_reload(name=f"systemd reads the {title} unit", _if=unit.did_change)
    ruleset_loaded(
        name=f"nft table inet {firewall.table} holds the ruleset",
        path=firewall.ruleset_path,
        comment=ruleset_comment(firewall, ports, sources),
        table=firewall.table,
    )
    systemd.service(name=f"{title} unit enabled", service=firewall.unit_name, running=True, enabled=True)
    allowed = ", ".join(["loopback", *(source_text(source) for source in sources)])
    say(host, f"{firewall.setting}: TCP {', '.join(map(str, sorted(set(ports))))} from {allowed} only")


def firewall_removed(firewall: Firewall, trace: Sequence[str]) -> None:
    """What an earlier deploy left (``trace``: rigkit.facts.firewall.FirewallTrace): the unit stopped and
    disabled, the table deleted, the files gone. Nothing left: no operation."""
    if not trace:
        return
    title = firewall.title
    if "unit" in trace:
        systemd.service(
            name=f"{title} unit stopped and disabled", service=firewall.unit_name, running=False, enabled=False
        )
    if "table" in trace:
        table_removed(name=f"nft table inet {firewall.table} removed", table=firewall.table)
    files.file(name=f"{title} unit file removed", path=firewall.unit_path, present=False)
    files.file(name=f"{title} ruleset removed", path=firewall.ruleset_path, present=False)
    if "unit" in trace:
        systemd.daemon_reload(name=f"systemd forgets the {title} unit")
