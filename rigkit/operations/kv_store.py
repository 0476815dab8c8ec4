"""kv_store: the check that the fleet's Valkey store answers as declared."""

from __future__ import annotations

from typing import Mapping

from pyinfra import host
from pyinfra.api import operation

from rigkit.facts.kv_store import StoreAnswers
from rigkit.kv_store import answers_as_declared, check_address, maxmemory_bytes
from rigkit.operations import fail


@operation()
def store_verified(store: Mapping):
    """
    Check: valkey refuses a command without the password (NOAUTH), answers PING with it, and reports the
    declared maxmemory (bytes) and maxmemory-policy.

    + store: the host's kv_store section (rigkit.settings.defaults.KV_STORE_VARIABLES), validated
    """
    yield from ()  # a check: it never yields a command
    if not host.state.is_executing:
        host.noop("the store is checked while the deploy runs")
        return
    address, port = check_address(store), store["kv_store_port"]
    problems = answers_as_declared(store, host.get_fact(StoreAnswers, address=address, port=port))
    if problems:
        raise fail(
            "kv_store",
            f"{address}:{port}",
            "; ".join(problems),
            "see `journalctl -u valkey-server` on the host and /etc/valkey/rigkit.conf",
        )
    host.noop(
        f"valkey at {address}:{port} refuses a client without the password and holds maxmemory "
        f"{maxmemory_bytes(store)} bytes, {store['kv_store_maxmemory_policy']}"
    )
