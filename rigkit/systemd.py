"""systemd unit text: command lines quoted per systemd.syntax(7) and systemd.service(5) "Command lines".

systemd splits ExecStart= at blanks, honours double quotes with C-style escapes inside, expands ``%``
specifiers and ``$NAME``/``${NAME}`` everywhere, even inside quotes: every argument rigkit writes goes
through ``exec_argument``, so a path with a space, ``%`` or ``$`` reaches the program exactly.
"""

from __future__ import annotations

from typing import Iterable

# Inside quotes a backslash starts a C escape and a double quote ends the word; control characters (a newline
# would end the line) go as \xNN, which systemd decodes too.
_C_ESCAPES = {"\\": "\\\\", '"': '\\"'}
# Expanded even inside quotes: doubling them gives the character itself.
_EXPANDED = {"%": "%%", "$": "$$"}


def _escaped(char: str) -> str:
    if char in _C_ESCAPES:
        return _C_ESCAPES[char]
    if char in _EXPANDED:
        return _EXPANDED[char]
    if ord(char) < 0x20 or ord(char) == 0x7F:
        return f"\\x{ord(char):02x}"
    return char


def exec_argument(argument: str) -> str:
    """One ExecStart= argument: in double quotes, with ``\\``, ``"`` and control characters C-escaped,
    ``%`` as ``%%`` and ``$`` as ``$$``. ValueError for a NUL, which no argument can hold."""
    if "\x00" in argument:
        raise ValueError("a command-line argument cannot contain a NUL byte")
    return '"' + "".join(_escaped(char) for char in argument) + '"'


def exec_command_line(argv: Iterable[str]) -> str:
    """The value of ExecStart= for ``argv``: an absolute executable, then every argument quoted."""
    argv = [str(argument) for argument in argv]
    if not argv or not argv[0].startswith("/"):
        raise ValueError("ExecStart= needs an absolute executable path first")
    return " ".join(exec_argument(argument) for argument in argv)
