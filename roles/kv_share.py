"""kv_share: the shared KV mount, the client side of the export the rigs' connector stores share.

Ensures, on a rig whose data declares ``kv_share_source``:
- nfs4/nfs: ``nfs-common`` installed; /etc/fstab mounts ``kv_share_source`` at ``kv_share_mount_point`` with
  ``kv_share_mount_options`` (one line, every field quoted by fstab rules, other lines kept); it is mounted,
  and remounted when a wanted option is missing;
- none (a directory the rig already shares, the lab's bind mount): nothing is mounted or written;
- either way, at the end: ``kv_share_mount_point`` is a mount point and the rig may write there, and the directory
  under it (the rig's own, hidden by the mount) is empty and immutable (``chattr +i``): with the export unmounted
  (a reboot before the NAS answers, a stack restarted by hand or by docker) no engine can start with its store
  on the rig's own disk, as docker's making of the store directory there fails. Removing that directory takes
  ``chattr -i`` first.
With the ``kv_share`` knob on, the serving role then puts the connector's store in
``kv_share_mount_point/kv_share_store_dir`` and mounts it into the container (rigkit.kv_share). Hosts
without ``kv_share_source`` skip the role and say so.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api.deploy import deploy
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import FileContents
from pyinfra.operations import files

from rigkit.facts.batch import FactSpec
from rigkit.facts.disk import MountedFilesystem, MountWritable, UnderMountPoint
from rigkit.facts.surveyed import directory_reads
from rigkit.kv_share import fstab_entry_line
from rigkit.operations import say
from rigkit.operations.apt import packages_installed
from rigkit.operations.disk import FSTAB, fstab_entry, mount_point_sealed, mount_writable, mounted
from rigkit.settings.defaults import KV_SHARE_NFS_CLIENT_PACKAGE
from rigkit.settings.hostdata import NFS_FSTYPES, RigSettings
from roles import Run


def operation_reads(rig: RigSettings) -> list[FactSpec]:
    """What this role's operations read on a rig that is already right."""
    settings = rig.kv_share
    if settings["kv_share_source"] is None:
        return []
    mount_point = settings["kv_share_mount_point"]
    mount = []
    if settings["kv_share_fstype"] in NFS_FSTYPES:
        mount = [
            FactSpec.of(DebPackages),
            *directory_reads(mount_point),
            FactSpec.of(FileContents, path=FSTAB),
            FactSpec.of(MountedFilesystem, mount_point=mount_point),
        ]
    return mount + [FactSpec.of(MountWritable, path=mount_point), FactSpec.of(UnderMountPoint, mount_point=mount_point)]


@deploy("kv_share")
def kv_share(rig: RigSettings, run: Run) -> None:
    settings = rig.kv_share
    if settings["kv_share_source"] is None:
        say(host, "kv_share: skipped, no kv_share_source declared for this host")
        return
    mount_point = settings["kv_share_mount_point"]
    if settings["kv_share_fstype"] in NFS_FSTYPES:
        packages_installed(name="NFS client", packages=[KV_SHARE_NFS_CLIENT_PACKAGE])
        files.directory(name="Shared KV mount point", path=mount_point)
        fstab_entry(
            name="fstab entry of the shared KV export", mount_point=mount_point, entry=fstab_entry_line(settings)
        )
        mounted(
            name="Shared KV export mounted (remounted on changed options)",
            mount_point=mount_point,
            device=None,
            options=settings["kv_share_mount_options"],
        )
    mount_writable(
        name="Shared KV mount is a mount point and writable", mount_point=mount_point, field="kv_share_mount_point"
    )
    mount_point_sealed(
        name="Directory under the shared KV mount empty and immutable",
        mount_point=mount_point,
        field="kv_share_mount_point",
    )
