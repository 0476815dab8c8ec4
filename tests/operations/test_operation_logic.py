"""The pure pieces under the operations: merges, fstab edits, decisions (the facts' parsers: tests/facts/)."""

from __future__ import annotations

import pytest

from rigkit.operations.apt import upstream_version
from rigkit.operations.disk import fstab_with_entry, kernel_options
from rigkit.operations.docker import merge_options
from rigkit.operations.nvidia import module_action


@pytest.mark.parametrize(
    "loaded, target, nouveau, expected",
    [
        ("580.95.05", "580.95.05", False, "none"),
        (None, "580.95.05", False, "load"),
        ("570.172.08", "580.95.05", False, "reboot"),
        ("580.82.07", "580.95.05", False, "reboot"),  # same branch, another build: NVML would refuse
        ("580.82.07", None, False, "none"),  # no exact target known: the branch decides
        ("570.172.08", None, False, "reboot"),
        (None, None, True, "reboot"),  # nouveau could not be unloaded
    ],
)
def test_module_action(loaded, target, nouveau, expected):
    assert module_action(loaded, target, "580", nouveau) == expected


def test_upstream_version_drops_epoch_and_packaging_revision():
    assert upstream_version("580.95.05-0ubuntu0.24.04.2") == "580.95.05"
    assert upstream_version("5:28.3.3-1~ubuntu.24.04~noble") == "28.3.3"


def test_merge_keeps_keys_it_does_not_own_and_merges_nested_objects():
    current = {"bridge": "none", "log-opts": {"max-file": "5"}, "runtimes": {"nvidia": {"path": "x"}}}
    merged = merge_options(current, {"log-opts": {"max-size": "100m"}, "data-root": "/srv/docker"})
    assert merged == {
        "bridge": "none",
        "log-opts": {"max-file": "5", "max-size": "100m"},
        "runtimes": {"nvidia": {"path": "x"}},
        "data-root": "/srv/docker",
    }
    assert current["log-opts"] == {"max-file": "5"}, "the merge must not modify its input"


def test_fstab_entry_replaces_only_its_mount_point_and_keeps_comments():
    fstab = (
        "# <file system> <mount point> <type>\n"
        "UUID=aaaa / ext4 errors=remount-ro 0 1\n"
        "# UUID=old /mnt/rigkit-l2 ext4 defaults 0 2\n"
        "UUID=old /mnt/rigkit-l2 ext4 defaults 0 2\n"
        "UUID=dup /mnt/rigkit-l2 xfs defaults 0 2\n"
    )
    entry = "UUID=new /mnt/rigkit-l2 ext4 noatime,nofail 0 2"
    assert fstab_with_entry(fstab, "/mnt/rigkit-l2", entry) == (
        "# <file system> <mount point> <type>\n"
        "UUID=aaaa / ext4 errors=remount-ro 0 1\n"
        "# UUID=old /mnt/rigkit-l2 ext4 defaults 0 2\n"
        f"{entry}\n"
    )
    assert (
        fstab_with_entry("UUID=aaaa / ext4 defaults 0 1", "/mnt/x", "UUID=b /mnt/x xfs defaults 0 2")
        == "UUID=aaaa / ext4 defaults 0 1\nUUID=b /mnt/x xfs defaults 0 2\n"
    )


def test_only_kernel_visible_mount_options_are_compared():
    assert kernel_options("noatime,nofail,x-systemd.device-timeout=5,defaults,discard") == ["noatime", "discard"]


def test_a_single_refusal_keeps_its_field_value_and_fix_several_are_named_together():
    from rigkit.errors import RigkitError
    from rigkit.operations import REFUSAL_FIX, refusal_of
    from rigkit.preflight import Finding

    ram = Finding(
        "refuse",
        "ram",
        "l1_size_gb",
        64,
        "MemAvailable 80 GiB < L1 64 + reserve 28 = 92 GiB",
        "set l1_size_gb to at most 52 (GiB)",
    )
    port = Finding("refuse", "port", "serving_port", 8101, "TCP port 8101 on the rig is already in use", "free it")
    line = str(RigkitError(**refusal_of([ram])))
    assert line == (
        "l1_size_gb=64: ram: MemAvailable 80 GiB < L1 64 + reserve 28 = 92 GiB. Fix: set l1_size_gb to at most 52 (GiB)"
    )  # one Fix, no "[refuse]" bookkeeping
    both = refusal_of([ram, port])
    assert both["fix"] == REFUSAL_FIX and "Fix: free it" in both["problem"] and "Fix: set l1_size_gb" in both["problem"]
