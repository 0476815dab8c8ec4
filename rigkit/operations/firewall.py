"""firewall: one of rigkit's nft tables (rigkit.settings.firewalls.Firewall.table) loaded from its ruleset file, or removed;
no other table is touched."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from rigkit.facts.firewall import NftTableComment


@operation()
def ruleset_loaded(path: str, comment: str, table: str):
    """
    Load the nft script ``path`` unless table ``inet <table>`` already carries ``comment`` (the ruleset's hash).

    + path: the nft script on the rig; it replaces only its own table, in one transaction
    + comment: the comment the wanted ruleset gives its table (rigkit.firewall.ruleset_comment)
    + table: the table the script defines

    ``nft -c`` checks the script first: a script the rig's nft refuses fails here and the loaded table stays
    as it was (``nft -f`` is atomic too).
    """
    loaded = host.get_fact(NftTableComment, table=table)
    if loaded == comment:
        host.noop(f"nft table inet {table} holds the wanted ruleset ({comment})")
        return
    yield StringCommand("nft", "-c", "-f", QuoteString(path))
    yield StringCommand("nft", "-f", QuoteString(path))


@operation()
def table_removed(table: str):
    """
    Delete nft table ``inet <table>`` when it is loaded (every other table stays).

    + table: the firewall's table (rigkit.settings.firewalls.Firewall.table)
    """
    if host.get_fact(NftTableComment, table=table) is None:
        host.noop(f"nft table inet {table} is not loaded")
        return
    yield StringCommand("nft", "delete", "table", "inet", QuoteString(table))
