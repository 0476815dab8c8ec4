"""disk: a filesystem made only when the refusal rules allow it, its fstab line, the mount."""

from __future__ import annotations

from io import StringIO
from typing import Callable, Optional

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import FileContents
from pyinfra.operations import files

from rigkit.disk import fstab_field, seal_command
from rigkit.facts.disk import BlockDeviceProbe, MountedFilesystem, MountWritable, UnderMountPoint
from rigkit.operations import fail


@operation()
def filesystem_made(
    device: str, fstype: str, label: str, uuid: str, mount_point: str, decide: Callable[[Optional[dict]], str]
):
    """
    Make a filesystem on ``device`` when ``decide(probe)`` says so.

    + device: the block device
    + fstype / label / uuid: the filesystem to make (the UUID is chosen up front so the
      fstab entry can be written before the filesystem exists)
    + mount_point: unmounted first when the device's current filesystem is mounted there
    + decide: the refusal rules, re-checked against a fresh probe right before formatting;
      returns "use", "format" or "wipe", raises when the device must not be touched
    """
    action = decide(host.get_fact(BlockDeviceProbe, device=device))
    if action == "use":
        host.noop(f"{device} holds the {fstype} filesystem labelled {label}")
        return
    if action == "wipe":
        if host.get_fact(MountedFilesystem, mount_point=mount_point) is not None:
            yield StringCommand("umount", QuoteString(mount_point))
        yield StringCommand("wipefs", "-a", QuoteString(device))
    if fstype == "xfs":
        yield StringCommand(
            "mkfs.xfs", "-f", "-L", QuoteString(label), "-m", QuoteString(f"uuid={uuid}"), QuoteString(device)
        )
    else:
        yield StringCommand(
            QuoteString(f"mkfs.{fstype}"),
            "-q",
            "-F",
            "-L",
            QuoteString(label),
            "-U",
            QuoteString(uuid),
            QuoteString(device),
        )


def fstab_with_entry(fstab: str, mount_point: str, entry: str) -> str:
    """/etc/fstab text with the line for ``mount_point`` replaced by ``entry`` (appended if none)."""
    lines = fstab.splitlines()
    out, placed = [], False
    for line in lines:
        fields = line.split()
        if fields and not fields[0].startswith("#") and len(fields) >= 2 and fields[1] == fstab_field(mount_point):
            if not placed:
                out.append(entry)
                placed = True
            continue
        out.append(line)
    if not placed:
        out.append(entry)
    return "\n".join(out) + "\n"


FSTAB = "/etc/fstab"


@operation()
def fstab_entry(mount_point: str, entry: str):
    """
    Make ``entry`` the only /etc/fstab line for ``mount_point``; other lines stay as they are.

    + mount_point: the second fstab field the entry owns
    + entry: the whole line (``UUID=... /mnt/x ext4 noatime,nofail 0 2``)
    """
    # an empty or absent fstab both read as no lines: the entry is the whole file either way
    current = "\n".join(host.get_fact(FileContents, path=FSTAB) or [])
    wanted = fstab_with_entry(current, mount_point, entry)
    if wanted.rstrip("\n") == current.rstrip("\n"):
        host.noop(f"{FSTAB} mounts {mount_point} as {entry!r}")
        return
    yield from files.put._inner(src=StringIO(wanted), dest=FSTAB, mode="644")


# Options fstab accepts that the kernel never shows in the mount's option list.
USERSPACE_MOUNT_OPTIONS = {
    "defaults",
    "nofail",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "_netdev",
}


def kernel_options(options: str) -> list[str]:
    return [
        o for o in options.split(",") if o and o not in USERSPACE_MOUNT_OPTIONS and not o.startswith(("x-", "comment="))
    ]


@operation()
def mounted(mount_point: str, device: Optional[str], options: str):
    """
    Mount ``mount_point`` from its fstab entry; remount when a wanted option is missing.

    + mount_point: where the filesystem goes
    + device: the device that must be the one mounted there; None for a network export (its fstab entry
      names it)
    + options: the fstab options (userspace-only ones like nofail are not compared)
    """
    mount = host.get_fact(MountedFilesystem, mount_point=mount_point)
    if mount is None:
        yield StringCommand("mount", QuoteString(mount_point))
        return
    probe = host.get_fact(BlockDeviceProbe, device=device) if device else None
    if probe is not None and mount["source"] != probe["path"]:
        raise fail(
            "l2_mount_point",
            mount_point,
            f"{mount['source']} is mounted there, not {probe['path']}",
            "unmount it, or choose another l2_mount_point",
        )
    wanted = kernel_options(options)
    if all(option in mount["options"] for option in wanted):
        host.noop(f"{mount_point} is mounted from {mount['source']} with {','.join(wanted) or 'its defaults'}")
        return
    yield StringCommand("mount", "-o", QuoteString(",".join(["remount", *wanted])), QuoteString(mount_point))


@operation()
def mount_writable(mount_point: str, field: str):
    """
    Check: ``mount_point`` is a mount point (not the directory under it) and this host may write there.

    + mount_point: the mount to check, read while the deploy runs (an earlier operation may mount it)
    + field: the variable that names it, in errors
    """
    yield from ()  # a check: it never yields a command
    if not host.state.is_executing:
        host.noop(f"{mount_point} is checked while the deploy runs")
        return
    found = host.get_fact(MountWritable, path=mount_point)
    if not found["mounted"]:
        raise fail(
            field,
            mount_point,
            "is not a mount point: the store would fill this rig's own disk and no other rig would see it",
            f"mount the shared export there (findmnt {mount_point})",
        )
    if not found["writable"]:
        raise fail(
            field,
            mount_point,
            "is mounted but this rig cannot write there (read-only, or squashed root)",
            "export it read-write to the rigs (e.g. no_root_squash for root engines)",
        )
    host.noop(f"{mount_point} is mounted and writable")


@operation()
def mount_point_sealed(mount_point: str, field: str):
    """
    Ensure: the directory under ``mount_point`` (the rig's own, hidden while the export is mounted) is empty and
    immutable, so no engine can start with its store there while the export is unmounted: docker's making of the
    store directory (the bind's source) fails, and the container with it (rigkit.disk).

    + mount_point: the shared mount
    + field: the variable that names it, in errors
    """
    under = host.get_fact(UnderMountPoint, mount_point=mount_point)
    if under is not None and under["entries"]:
        raise fail(
            field,
            mount_point,
            f"has files under the mount, on this rig's own disk ({', '.join(under['entries'])}): something wrote "
            "there while the export was unmounted, and an engine started then would keep filling that disk",
            f"unmount the export, move what is in {mount_point} away, mount it back and deploy again",
        )
    if under is not None and under["immutable"]:
        host.noop(f"the directory under {mount_point} is empty and immutable")
        return
    yield seal_command(mount_point, field)
