"""l2_disk: the fast disk behind LMCache's L2 tier, formatted once and mounted by UUID.

Ensures
- ``l2_device`` carries an ``l2_fstype`` filesystem labelled ``l2_label``: a blank device is
  formatted; a device that already holds a filesystem or a partition table is NEVER formatted
  unless ``l2_format`` is set and its label is rigkit's (to change the filesystem type), or
  ``l2_force_format`` is set. Every refusal happens before the deploy changes anything;
- /etc/fstab mounts it by UUID at ``l2_mount_point`` with ``l2_mount_options`` (other lines kept);
  it is mounted, and remounted when a wanted option is missing;
- the mount point and LMCache's base directory (``l2_cache_dir`` inside it) belong to ``l2_owner``.
A missing device is an error naming the path and what lsblk sees. Hosts without ``l2_device``
skip the role and say so.
"""

from __future__ import annotations

import uuid
from typing import Optional

from pyinfra import host
from pyinfra.api.deploy import deploy
from pyinfra.facts.files import FileContents
from pyinfra.operations import files

from rigkit.disk import fstab_line
from rigkit.errors import ConfigError, PreflightError
from rigkit.facts.batch import FactSpec
from rigkit.facts.disk import BlockDeviceList, BlockDeviceProbe, MountedFilesystem
from rigkit.facts.surveyed import directory_reads
from rigkit.operations import say
from rigkit.operations.disk import FSTAB, filesystem_made, fstab_entry, mounted
from rigkit.settings.defaults import LABEL_LIMITS, l2_cache_path
from rigkit.settings.hostdata import RigSettings
from rigkit.survey import RigState
from roles import Run

# Seeds the UUID of a filesystem rigkit makes, so the fstab entry is known before mkfs runs.
UUID_NAMESPACE = uuid.UUID("5d0c3a52-6f0e-4b8e-9a51-7a4f2c0b1e11")


def format_decision(probe: Optional[dict], settings: dict, lsblk: list[str]) -> str:
    """ "use" the filesystem as it is, "format" a blank device, "wipe" then format; or refuse.

    Raises PreflightError naming the device, what it holds and the knob that would allow it.
    """
    device, fstype, label = settings["l2_device"], settings["l2_fstype"], settings["l2_label"]
    if probe is None:
        seen = "; ".join(lsblk) or "no block devices"
        raise PreflightError(
            "l2_device",
            device,
            f"no block device at this path (lsblk sees: {seen})",
            "set l2_device to the disk meant for the L2 tier, preferably its /dev/disk/by-id/ path",
        )
    found_type, found_label, table = probe.get("TYPE"), probe.get("LABEL", ""), probe.get("PTTYPE")
    if not found_type and not table:
        return "format"
    if found_type == fstype and found_label == label:
        return "use"
    if settings["l2_force_format"]:
        return "wipe"
    if table and not found_type:
        raise PreflightError(
            "l2_device",
            device,
            f"holds a {table} partition table",
            "point l2_device at an empty disk or partition, or set l2_force_format=true "
            "to wipe it (everything on it is lost)",
        )
    if found_label == label:
        if settings["l2_format"]:
            return "wipe"
        raise PreflightError(
            "l2_device",
            device,
            f"holds rigkit's {found_type} filesystem, not {fstype}",
            f"set l2_format=true to reformat it as {fstype} (the L2 cache on it is lost), "
            f"or set l2_fstype={found_type}",
        )
    adopt = f"set l2_label={found_label!r} to use it as it is, or " if found_type == fstype and found_label else ""
    raise PreflightError(
        "l2_device",
        device,
        f"holds a filesystem ({found_type}) labelled {found_label!r}, not rigkit's {label!r}",
        f"{adopt}set l2_force_format=true to wipe it (everything on it is lost)",
    )


def check_label(settings: dict) -> None:
    limit = LABEL_LIMITS[settings["l2_fstype"]]
    if not settings["l2_label"] or len(settings["l2_label"]) > limit:
        raise ConfigError(
            "l2_label",
            settings["l2_label"],
            f"{settings['l2_fstype']} labels are 1 to {limit} characters",
            f"choose a label of at most {limit} characters",
        )


def checked_device(settings: dict, state: RigState) -> tuple[dict, list[str], str]:
    """The device's probe, what lsblk sees and format_decision's action, from the rig survey.

    PreflightError for a device that is missing, must not be formatted, or whose mount point holds another
    device. The preflight role runs this too, before any role changes the rig (the filesystem_made and
    mounted operations read the device again when they run). lsblk is read only for a missing device.
    """
    probe = state.l2_device
    lsblk = host.get_fact(BlockDeviceList) if probe is None else []
    action = format_decision(probe, settings, lsblk)
    mount_point = settings["l2_mount_point"]
    current_mount = state.l2_mount
    if current_mount is not None and current_mount["source"] != probe["path"]:
        raise PreflightError(
            "l2_mount_point",
            mount_point,
            f"{current_mount['source']} is mounted there, not {probe['path']}",
            "unmount it, or choose another l2_mount_point",
        )
    return probe, lsblk, action


def operation_reads(rig: RigSettings) -> list[FactSpec]:
    """What this role's operations read on a rig that is already right."""
    settings = rig.l2_disk
    if not settings["l2_device"]:
        return []
    mount_point = settings["l2_mount_point"]
    return [
        FactSpec.of(BlockDeviceProbe, device=settings["l2_device"]),
        *directory_reads(mount_point),
        FactSpec.of(FileContents, path=FSTAB),
        FactSpec.of(MountedFilesystem, mount_point=mount_point),
        *directory_reads(l2_cache_path(settings)),
    ]


@deploy("l2_disk")
def l2_disk(rig: RigSettings, run: Run) -> None:
    settings = rig.l2_disk
    device = settings["l2_device"]
    if not device:
        say(host, "l2_disk: skipped, no l2_device declared for this host")
        return
    check_label(settings)
    if not device.startswith("/dev/disk/by-"):
        say(
            host,
            f"l2_disk: {device} is a kernel name that may change between boots; a /dev/disk/by-id/ "
            "path is stable (fstab mounts by UUID either way)",
        )

    probe, lsblk, action = checked_device(settings, run.rig_state(rig))
    mount_point = settings["l2_mount_point"]

    if action == "use":
        fs_uuid = probe["UUID"]
    else:
        fs_uuid = str(uuid.uuid5(UUID_NAMESPACE, f"{host.name}:{device}:{settings['l2_fstype']}"))

    def decide(fresh_probe: Optional[dict]) -> str:
        return format_decision(fresh_probe, settings, lsblk)

    filesystem_made(
        name="Filesystem on l2_device (formatted only when allowed)",
        device=device,
        fstype=settings["l2_fstype"],
        label=settings["l2_label"],
        uuid=fs_uuid,
        mount_point=mount_point,
        decide=decide,
    )
    files.directory(name="Mount point", path=mount_point)
    entry = fstab_line(f"UUID={fs_uuid}", mount_point, settings["l2_fstype"], settings["l2_mount_options"])
    fstab_entry(name="fstab entry by UUID", mount_point=mount_point, entry=entry)
    mounted(
        name="L2 disk mounted (remounted on changed options)",
        mount_point=mount_point,
        device=device,
        options=settings["l2_mount_options"],
    )
    owner = {"user": settings["l2_owner"], "group": settings["l2_group"]}
    files.directory(name="Mounted filesystem owned", path=mount_point, **owner)
    files.directory(name="LMCache L2 base directory", path=l2_cache_path(settings), mode="755", **owner)
