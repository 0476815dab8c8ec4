"""Facts for the API firewall: rigkit's nft table, what of it a rig holds, where the deploy's SSH session comes
from, and the rig's network namespace (the lab's guard)."""

from __future__ import annotations

import shlex
from typing import Optional

from pyinfra.api import FactBase

from rigkit.firewall import RULESET_PATH, TABLE, UNIT_PATH

TABLE_MARKER = "table"


class NftTableComment(FactBase):
    """The comment of nft table ``inet <table>``: None when the table is not loaded (or nft is absent), ""
    for a table without one."""

    def requires_command(self, *args, **kwargs) -> str:
        return "nft"

    def command(self, table: str = TABLE) -> str:
        name = shlex.quote(table)
        return (f"if t=$(nft list table inet {name} 2>/dev/null); then echo {TABLE_MARKER}; "
                "printf '%s\\n' \"$t\" | sed -n 's/^[[:space:]]*comment \"\\(.*\\)\"$/\\1/p' | head -n 1; fi")

    def process(self, output: list[str]) -> Optional[str]:
        if not output or output[0] != TABLE_MARKER:
            return None
        return output[1] if len(output) > 1 else ""


class ApiFirewallTrace(FactBase):
    """What of rigkit's API firewall is on the rig: a subset of ["ruleset", "unit", "table"] (empty: none)."""

    default = list

    def command(self) -> str:
        return (f"[ -e {RULESET_PATH} ] && echo ruleset; [ -e {UNIT_PATH} ] && echo unit; "
                f"command -v nft >/dev/null 2>&1 && nft list table inet {TABLE} >/dev/null 2>&1 && echo table; true")

    def process(self, output: list[str]) -> list[str]:
        return [line for line in output if line in ("ruleset", "unit", "table")]


# The deploy's own SSH session sets SSH_CONNECTION; sudo (pyinfra's _sudo) resets the environment, so the
# command walks up its ancestors to the login shell sshd started, whose environment still holds it.
_SSH_CONNECTION_SCRIPT = (
    'c=${SSH_CONNECTION:-}; p=$$; '
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
