"""Facts about the fleet's Valkey store (roles/kv_store.py)."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from rigkit.kv_store import AUTH_FROM_CONFIG

_SECTIONS = ("unauthenticated", "authenticated", "config")


class StoreAnswers(FactBase):
    """What valkey at ``address``:``port`` answers: a PING without the password, a PING with it and
    CONFIG GET maxmemory / maxmemory-policy with it. The password is read on the host from rigkit's config
    file into valkey-cli's environment: it is in no command line."""

    def requires_command(self, address: str, port: int) -> str:
        return "valkey-cli"

    def command(self, address: str, port: int) -> str:
        cli = f"valkey-cli --no-auth-warning -h {shlex.quote(address)} -p {int(port)}"
        return "\n".join(
            [
                f"auth=$({AUTH_FROM_CONFIG})",
                "echo '--unauthenticated'",
                f"env -u REDISCLI_AUTH -u VALKEYCLI_AUTH {cli} PING 2>&1",
                'export REDISCLI_AUTH="$auth" VALKEYCLI_AUTH="$auth"',
                "echo '--authenticated'",
                f"{cli} PING 2>&1",
                "echo '--config'",
                f"{cli} CONFIG GET maxmemory 2>&1",
                f"{cli} CONFIG GET maxmemory-policy 2>&1",
            ]
        )

    def process(self, output: list[str]) -> dict:
        sections: dict[str, list[str]] = {name: [] for name in _SECTIONS}
        current = None
        for line in output:
            if line.startswith("--") and line[2:] in sections:
                current = line[2:]
            elif current is not None and line.strip():
                sections[current].append(line.strip())
        config_lines = sections["config"]
        # valkey-cli without a terminal prints CONFIG GET's reply as name and value on lines of their own
        config = dict(zip(config_lines[0::2], config_lines[1::2]))
        return {
            "unauthenticated": " ".join(sections["unauthenticated"]),
            "authenticated": " ".join(sections["authenticated"]),
            "config": config,
        }
