"""Facts about block devices, mounts and free space."""

from __future__ import annotations

import shlex
from typing import Optional

from pyinfra.api import FactBase

from rigkit.disk import seal_flags_immutable, under_mount_point_read


class BlockDeviceProbe(FactBase):
    """What is on a block device, read from the device itself (``blkid -p``, no udev cache).

    {"path": resolved /dev path, "TYPE", "LABEL", "UUID", "PTTYPE" (when present)},
    or None when the path is not a block device.
    """

    def command(self, device: str) -> str:
        quoted = shlex.quote(device)
        return (
            f"if [ -b {quoted} ]; then echo path=$(readlink -f {quoted}); "
            f"blkid -p -o export {quoted} 2>/dev/null; true; fi"
        )

    def process(self, output: list[str]) -> Optional[dict]:
        probe = {}
        for line in output:
            key, sep, value = line.partition("=")
            if sep:
                probe[key.strip()] = value.strip()
        return probe if "path" in probe else None


class BlockDeviceList(FactBase):
    """`lsblk` one line per disk and partition ("PATH SIZE TYPE"), for error messages."""

    default = list

    def command(self) -> str:
        return "lsblk -n -o PATH,SIZE,TYPE,FSTYPE 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str]:
        return [" ".join(line.split()) for line in output if line.strip()]


class MountedFilesystem(FactBase):
    """What is mounted at a path: {"source", "fstype", "options": [..]}, or None."""

    def command(self, mount_point: str) -> str:
        return f"findmnt -n -o SOURCE,FSTYPE,OPTIONS --mountpoint {shlex.quote(mount_point)} 2>/dev/null || true"

    def process(self, output: list[str]) -> Optional[dict]:
        fields = " ".join(output).split()
        if len(fields) < 3:
            return None
        return {"source": fields[0], "fstype": fields[1], "options": fields[2].split(",")}


class DiskFree(FactBase):
    """Free bytes on the filesystem holding ``path`` (its nearest existing parent), or None."""

    def command(self, path: str) -> str:
        quoted = shlex.quote(path)
        return (
            f'p={quoted}; while [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname "$p"); done; '
            'df -B1 --output=avail "$p" | tail -n 1'
        )

    def process(self, output):
        text = "".join(output).strip()
        return int(text) if text.isdigit() else None


class MountWritable(FactBase):
    """Whether ``path`` is a mount point and whether this host may write there: {"mounted", "writable"}."""

    def command(self, path: str) -> str:
        quoted = shlex.quote(path)
        return (
            f"if mountpoint -q {quoted}; then echo mounted; else echo not-mounted; fi; "
            f"if [ -w {quoted} ]; then echo writable; else echo read-only; fi"
        )

    def process(self, output: list[str]) -> dict:
        words = [line.strip() for line in output]
        return {"mounted": "mounted" in words, "writable": "writable" in words}


class UnderMountPoint(FactBase):
    """The directory under a mount point, as the rig's own filesystem has it (read in a private mount namespace,
    the mount detached there only): {"immutable", "entries": its first names}, or None when it does not exist."""

    def command(self, mount_point: str) -> str:
        return under_mount_point_read(mount_point)

    def process(self, output: list[str]) -> Optional[dict]:
        lines = [line.strip() for line in output]
        if "absent" in lines:
            return None
        flags = next((line.removeprefix("flags=") for line in lines if line.startswith("flags=")), "")
        return {
            "immutable": seal_flags_immutable(flags),
            "entries": [line.removeprefix("entry=") for line in lines if line.startswith("entry=")],
        }
