"""Facts for rigkit's firewalls (rigkit.firewall): a firewall's nft table, what of it a host holds, where the
deploy's SSH session comes from, and the host's network namespace (the lab's guard)."""

from __future__ import annotations

import shlex
from typing import Optional

from pyinfra.api import FactBase

from rigkit.firewall import Firewall

TABLE_MARKER = "table"


class NftTableComment(FactBase):
    """The comment of nft table ``inet <table>``: None when the table is not loaded (or nft is absent), ""
    for a table without one."""

    def requires_command(self, *args, **kwargs) -> str:
        return "nft"

    def command(self, table: str) -> str:
        name = shlex.quote(table)
        return (
            f"if t=$(nft list table inet {name} 2>/dev/null); then echo {TABLE_MARKER}; "
            "printf '%s\\n' \"$t\" | sed -n 's/^[[:space:]]*comment \"\\(.*\\)\"$/\\1/p' | head -n 1; fi"
        )

    def process(self, output: list[str]) -> Optional[str]:
        if not output or output[0] != TABLE_MARKER:
            return None
        return output[1] if len(output) > 1 else ""


class FirewallTrace(FactBase):
    """What of one of rigkit's firewalls is on the host: a subset of ["ruleset", "unit", "table"] (empty: none).
    Read with ``trace_kwargs(firewall)``: the fact is keyed by the firewall's table."""

    default = list

    def command(self, table: str, ruleset_path: str, unit_path: str) -> str:
        ruleset, unit, name = shlex.quote(ruleset_path), shlex.quote(unit_path), shlex.quote(table)
        return (
            f"[ -e {ruleset} ] && echo ruleset; [ -e {unit} ] && echo unit; "
            f"command -v nft >/dev/null 2>&1 && nft list table inet {name} >/dev/null 2>&1 && echo table; true"
        )

    def process(self, output: list[str]) -> list[str]:
        return [line for line in output if line in ("ruleset", "unit", "table")]


def trace_kwargs(firewall: Firewall) -> dict[str, str]:
    """FirewallTrace's arguments for ``firewall``."""
    return {"table": firewall.table, "ruleset_path": firewall.ruleset_path, "unit_path": firewall.unit_path}


# The deploy's own SSH session sets SSH_CONNECTION; sudo (pyinfra's _sudo) resets the environment, so the
# command walks up its ancestors to the login shell sshd started, whose environment still holds it.
_SSH_CONNECTION_SCRIPT = (
    "c=${SSH_CONNECTION:-}; p=$$; "
    'while [ -z "$c" ] && [ "${p:-0}" -gt 1 ] 2>/dev/null; do '
    "p=$(sed -n 's/^PPid:[[:space:]]*//p' /proc/$p/status 2>/dev/null); "
    "c=$(tr '\\0' '\\n' 2>/dev/null < /proc/${p:-0}/environ | sed -n 's/^SSH_CONNECTION=//p'); done; "
    'printf "%s\\n" "$c"'
)


class SshConnection(FactBase):
    """$SSH_CONNECTION of the deploy's session on the rig ("client port server port"), None without one."""

    def command(self) -> str:
        return _SSH_CONNECTION_SCRIPT

    def process(self, output: list[str]) -> Optional[str]:
        text = " ".join(output).strip()
        return text or None


class NetworkNamespace(FactBase):
    """The rig's network namespace as the kernel names it (``net:[4026532290]``), None when unreadable."""

    def command(self) -> str:
        return "readlink /proc/self/ns/net 2>/dev/null || true"

    def process(self, output: list[str]) -> Optional[str]:
        text = "".join(output).strip()
        return text or None
