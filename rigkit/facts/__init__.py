"""pyinfra facts rigkit reads beyond pyinfra's own, one module per subject (as pyinfra.facts).

Commands that may fail on a healthy host (a tool reporting an error, a device that is not there) end
with ``echo "exit=$?"`` or a guard, so a failure becomes data an operation can name in its error
instead of a fact error that hides it.
"""

from __future__ import annotations


def split_exit(output: list[str]) -> tuple[list[str], int]:
    """Separate the trailing ``exit=N`` line the facts' commands print from the tool's own output."""
    lines = list(output)
    if lines and lines[-1].startswith("exit="):
        return lines[:-1], int(lines[-1][len("exit=") :] or 1)
    return lines, 1
