"""The L2 disk's system files: /etc/fstab fields quoted per fstab(5), mount options and owners checked.

fstab separates fields by blanks and getmntent(3) decodes four octal escapes in a field: ``\\040`` (space),
``\\011`` (tab), ``\\012`` (newline) and ``\\134`` (backslash). Every field rigkit writes goes through
``fstab_field``, so a mount point with a space stays one field and a newline cannot start another line.
"""

from __future__ import annotations

import re
import shlex

from rigkit.settings.types import check_mount_options

FSTAB_ESCAPES = {" ": "\\040", "\t": "\\011", "\n": "\\012", "\\": "\\134"}
_FSTAB_SPECIAL = re.compile("[ \t\n\\\\]")


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


# The directory under a mount point: the rig's own, hidden while something is mounted there. A store under a shared
# mount must never land there: docker makes a missing bind source on a container's (re)start (a short-syntax bind,
# and compose v2's long syntax unless create_host_path is false), so a rig that boots with the export unmounted
# would fill its own disk. Sealed (empty, immutable: mkdir there fails with EPERM), nothing can create anything in it.


def under_mount_point(mount_point: str, script: str) -> str:
    """``script`` run where ``mount_point`` shows the directory under it: a private mount namespace with whatever is
    mounted there lazily detached (in that namespace only; ``-i``: no umount.nfs helper, no server contacted).
    ``$p`` is the mount point inside the script."""
    inner = f'p={shlex.quote(mount_point)}; while mountpoint -q "$p"; do umount -l -i "$p" || exit 1; done; {script}'
    return f"unshare --mount --propagation private sh -c {shlex.quote(inner)}"


def under_mount_point_read(mount_point: str) -> str:
    """Prints ``absent``, or the directory's attribute flags (``flags=----i----``) and its first five entries
    (``entry=NAME``, hidden ones too). The shell's own globs and expansions list them: each deploy reads this,
    and ``ls | head | sed`` and ``cut`` were four processes more on the rig."""
    return under_mount_point(
        mount_point,
        '[ -d "$p" ] || { echo absent; exit 0; }; '
        'f=$(lsattr -d "$p" 2>/dev/null); echo "flags=${f%% *}"; n=0; '
        'for e in "$p"/* "$p"/.[!.]* "$p"/..?*; do { [ -e "$e" ] || [ -L "$e" ]; } || continue; '
        'echo "entry=${e##*/}"; n=$((n + 1)); [ "$n" -lt 5 ] || break; done',
    )


def seal_command(mount_point: str, field: str) -> str:
    """Makes the empty directory under ``mount_point`` immutable; a filesystem without the attribute is refused."""
    refusal = (
        f"refused: {field} {mount_point}: the directory under the mount cannot be made immutable "
        "(its filesystem has no immutable attribute: lsattr -d), so an engine started while the export is "
        "unmounted would fill the root disk of this rig. Fix: put the mount point on a filesystem that has it "
        "(ext4, xfs, btrfs)"
    )
    crowded = f"refused: {field} {mount_point} has files under the mount, on the root disk of this rig"
    return under_mount_point(
        mount_point,
        f'[ -z "$(ls -A "$p")" ] || {{ echo {shlex.quote(crowded)} >&2; exit 1; }}; '
        f'chattr +i "$p" || {{ echo {shlex.quote(refusal)} >&2; exit 1; }}',
    )


def seal_flags_immutable(flags: str) -> bool:
    """lsattr's flags field (``----i---------e-------``) has the immutable attribute."""
    return "i" in flags
