"""The L2 disk's system files: /etc/fstab fields quoted per fstab(5), mount options and owners checked.

fstab separates fields by blanks and getmntent(3) decodes four octal escapes in a field: ``\\040`` (space),
``\\011`` (tab), ``\\012`` (newline) and ``\\134`` (backslash). Every field rigkit writes goes through
``fstab_field``, so a mount point with a space stays one field and a newline cannot start another line.
"""

from __future__ import annotations

import re
from typing import Optional

from rigkit.settings.variables import check_of

FSTAB_ESCAPES = {" ": "\\040", "\t": "\\011", "\n": "\\012", "\\": "\\134"}
_FSTAB_SPECIAL = re.compile("[ \t\n\\\\]")
# A mount option: a flag (noatime) or key=value (commit=60, context="system_u:object_r:x:s0").
_MOUNT_OPTION = re.compile(r"[A-Za-z0-9_.:+\-=/\"@]+")
# A user or group chown takes: the shadow-utils name rule (NAME_REGEX) or a numeric id.
_ACCOUNT_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}|[0-9]+")


def fstab_field(text: str) -> str:
    """``text`` as one /etc/fstab field: blanks, newline and backslash as getmntent's octal escapes."""
    if not text:
        raise ValueError("an fstab field cannot be empty")
    return _FSTAB_SPECIAL.sub(lambda match: FSTAB_ESCAPES[match.group()], text)


def fstab_line(spec: str, mount_point: str, fstype: str, options: str, dump: int = 0, pass_number: int = 2) -> str:
    """One /etc/fstab line (no newline), every field quoted; ValueError for options no fstab can carry."""
    check_mount_options(options)
    fields = [spec, mount_point, fstype, options, str(dump), str(pass_number)]
    return " ".join(fstab_field(field) for field in fields)


def mount_options_problem(options: str) -> Optional[str]:
    """Why ``options`` cannot be an fstab options field, or None."""
    if any(char in options for char in "\n\r"):
        return "contains a newline, which would start another fstab line"
    items = options.split(",")
    if not options or "" in items:
        return "must be options separated by single commas, e.g. noatime,nofail"
    for item in items:
        if not _MOUNT_OPTION.fullmatch(item):
            return f"option {item!r} has a blank, control or shell character (an option is a flag or key=value)"
    return None


check_mount_options = check_of(mount_options_problem, "write options separated by single commas, e.g. noatime,nofail")


def check_account_name(name: str) -> None:
    """Variable check for a user or group that owns the L2 directories (ValueError with the reason)."""
    if not _ACCOUNT_NAME.fullmatch(name):
        raise ValueError(
            "must be a user or group name (lowercase letters, digits, '_', '-'; at most 32) or a numeric id"
        )


check_account_name.fix = "write a user or group name such as root or rigkit, or a numeric id"
