"""files: a file that holds a secret, uploaded like files.put but never shown in a diff."""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api import operation
from pyinfra.operations import files


@operation()
def secret_file(dest: str, text: str, mode: str = "600", user: str | None = None, group: str | None = None):
    """
    Upload ``text`` to ``dest`` (mode ``mode``) when it differs, as ``files.put``; ``--diff`` says the file
    changes and never prints its lines.

    + dest: the file on the host; its directory exists already
    + text: the whole content (e.g. a .env holding a token)
    + mode: octal mode of the file
    + user, group: owner of the file (None: as uploaded, root)
    """
    config = host.state.config
    show_diff, config.DIFF = config.DIFF, False
    try:
        commands = list(
            files.put._inner(src=StringIO(text), dest=dest, mode=mode, user=user, group=group, create_remote_dir=False)
        )
    finally:
        config.DIFF = show_diff
    if commands and show_diff:
        host.log(f"Will write {dest} (it holds a secret: its contents are not shown)")
    yield from commands
