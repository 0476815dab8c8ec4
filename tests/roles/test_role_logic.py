"""The pure pieces under the roles: fact parsers (on real nvidia-smi output), merges, decisions."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigkit.facts.disk import BlockDeviceProbe, MountedFilesystem
from rigkit.facts.docker import DockerEngine, DockerRunCheck
from rigkit.facts.nvidia import NvidiaModuleVersion, NvidiaSmiGpus
from rigkit.operations.apt import upstream_version
from rigkit.operations.disk import fstab_with_entry, kernel_options
from rigkit.operations.docker import merge_options
from rigkit.operations.nvidia import module_action

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi" / "h200-x2-ubuntu2404"


def test_nvidia_smi_fact_reads_real_query_output():
    lines = (H200 / "query-gpu.csv").read_text().splitlines() + ["exit=0"]
    smi = NvidiaSmiGpus().process(lines)
    assert smi["error"] is None
    assert smi["gpus"] == [
        {"uuid": "GPU-111d1839-5679-16d2-2cef-2b0656a90f70", "driver_version": "580.159.04"},
        {"uuid": "GPU-935f3bed-6d9e-07dd-0c41-992306511ed5", "driver_version": "580.159.04"},
    ]


def test_nvidia_smi_fact_turns_a_failure_into_its_message():
    smi = NvidiaSmiGpus().process(["Failed to initialize NVML: Driver/library version mismatch",
                                   "NVML library version: 580.95", "exit=18"])
    assert smi["gpus"] == []
    assert smi["error"].startswith("Failed to initialize NVML: Driver/library version mismatch")


def test_module_version_fact_reads_the_real_proc_file():
    proc_lines = (H200 / "host.txt").read_text().splitlines()[:2]  # /proc/driver/nvidia/version
    assert NvidiaModuleVersion().process(proc_lines) == "580.159.04"
    assert NvidiaModuleVersion().process([]) is None


@pytest.mark.parametrize("loaded, target, nouveau, expected", [
    ("580.95.05", "580.95.05", False, "none"),
    (None, "580.95.05", False, "load"),
    ("570.172.08", "580.95.05", False, "reboot"),
    ("580.82.07", "580.95.05", False, "reboot"),   # same branch, another build: NVML would refuse
    ("580.82.07", None, False, "none"),            # no exact target known: the branch decides
    ("570.172.08", None, False, "reboot"),
    (None, None, True, "reboot"),                  # nouveau could not be unloaded
])
def test_module_action(loaded, target, nouveau, expected):
    assert module_action(loaded, target, "580", nouveau) == expected


def test_upstream_version_drops_epoch_and_packaging_revision():
    assert upstream_version("580.95.05-0ubuntu0.24.04.2") == "580.95.05"
    assert upstream_version("5:28.3.3-1~ubuntu.24.04~noble") == "28.3.3"


def test_merge_keeps_keys_it_does_not_own_and_merges_nested_objects():
    current = {"bridge": "none", "log-opts": {"max-file": "5"}, "runtimes": {"nvidia": {"path": "x"}}}
    merged = merge_options(current, {"log-opts": {"max-size": "100m"}, "data-root": "/srv/docker"})
    assert merged == {"bridge": "none", "log-opts": {"max-file": "5", "max-size": "100m"},
                      "runtimes": {"nvidia": {"path": "x"}}, "data-root": "/srv/docker"}
    assert current["log-opts"] == {"max-file": "5"}, "the merge must not modify its input"


def test_fstab_entry_replaces_only_its_mount_point_and_keeps_comments():
    fstab = ("# <file system> <mount point> <type>\n"
             "UUID=aaaa / ext4 errors=remount-ro 0 1\n"
             "# UUID=old /mnt/rigkit-l2 ext4 defaults 0 2\n"
             "UUID=old /mnt/rigkit-l2 ext4 defaults 0 2\n"
             "UUID=dup /mnt/rigkit-l2 xfs defaults 0 2\n")
    entry = "UUID=new /mnt/rigkit-l2 ext4 noatime,nofail 0 2"
    assert fstab_with_entry(fstab, "/mnt/rigkit-l2", entry) == (
        "# <file system> <mount point> <type>\n"
        "UUID=aaaa / ext4 errors=remount-ro 0 1\n"
        "# UUID=old /mnt/rigkit-l2 ext4 defaults 0 2\n"
        f"{entry}\n")
    assert fstab_with_entry("UUID=aaaa / ext4 defaults 0 1", "/mnt/x", "UUID=b /mnt/x xfs defaults 0 2") == \
        "UUID=aaaa / ext4 defaults 0 1\nUUID=b /mnt/x xfs defaults 0 2\n"


def test_only_kernel_visible_mount_options_are_compared():
    assert kernel_options("noatime,nofail,x-systemd.device-timeout=5,defaults,discard") == ["noatime", "discard"]


def test_block_device_probe_parses_blkid_export():
    lines = ["path=/dev/loop1", "DEVNAME=/dev/loop1", "LABEL=rigkit-l2",
             "UUID=6bd6e51e-10cb-5d01-9854-66d5cd804388", "TYPE=ext4", "USAGE=filesystem"]
    probe = BlockDeviceProbe().process(lines)
    assert (probe["path"], probe["TYPE"], probe["LABEL"]) == ("/dev/loop1", "ext4", "rigkit-l2")
    assert BlockDeviceProbe().process([]) is None  # not a block device


def test_mount_and_file_and_docker_facts_parse_their_output():
    assert MountedFilesystem().process(["/dev/loop1 ext4   rw,noatime"]) == {
        "source": "/dev/loop1", "fstype": "ext4", "options": ["rw", "noatime"]}
    assert MountedFilesystem().process([]) is None
    assert DockerEngine().process(["28.3.3", "exit=0"]) == {"server_version": "28.3.3", "error": None}
    assert DockerEngine().process(["Cannot connect", "exit=1"])["error"] == "Cannot connect"
    assert DockerRunCheck().process(["oops", "exit=125"]) == {"ok": False, "output": "oops"}
