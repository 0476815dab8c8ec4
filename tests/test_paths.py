"""Host path settings: absolute, normalised, never a system directory, no character a target would change."""

import pytest

from rigkit.errors import ConfigError
from rigkit.paths import (
    SYSTEM_DIRECTORIES,
    SYSTEM_TREES,
    device_path_problem,
    host_path_problem,
    relative_path_problem,
)
from rigkit.settings.knobs import KNOBS_BY_NAME
from rigkit.settings.types import check_device_path, check_host_path, check_relative_path

GOOD = [
    "/mnt/rigkit-l2",
    "/mnt/rigkit-l2/lmcache",
    "/var/lib/rigkit/kv",
    "/data/kv store",
    "/srv/kv/\u00e9t\u00e9",
    "/mnt/\U0001f600",
    "/home/alice/kv",
    "/mnt/" + "a" * 255,
]


@pytest.mark.parametrize("path", GOOD)
def test_good_host_paths(path):
    assert host_path_problem(path) is None
    check_host_path(path)


@pytest.mark.parametrize("path", ["relative/dir", "", "~/kv", "./kv"])
def test_host_paths_are_absolute(path):
    assert "absolute" in host_path_problem(path)


@pytest.mark.parametrize(
    "path", ["/mnt//kv", "//mnt/kv", "/mnt/kv/", "/mnt/./kv", "/mnt/kv/.", "/mnt/../etc", "/mnt/kv/.."]
)
def test_host_paths_are_normalised(path):
    assert "normalised" in host_path_problem(path)


@pytest.mark.parametrize(
    "path",
    [
        "/",
        *SYSTEM_TREES,
        *SYSTEM_DIRECTORIES,
        "/etc/rigkit",
        "/usr/local/kv",
        "/var/lib/docker/volumes/kv",
        "/boot/efi",
        "/proc/self",
    ],
)
def test_system_directories_refused(path):
    assert "system directory" in host_path_problem(path)


@pytest.mark.parametrize(
    "char", ["\n", "\r", "\t", "\x00", "\x7f", "\x85", "\u2028", "\u2029", "\u200b", "\ufeff", "\u00a0", "\u3000", "$"]
)
def test_characters_no_target_carries_unchanged(char):
    assert host_path_problem(f"/mnt/a{char}b") is not None
    assert relative_path_problem(f"a{char}b") is not None


@pytest.mark.parametrize("path", ["/mnt/kv ", "/mnt/ kv", "/mnt/kv /x", "/ mnt"])
def test_leading_or_trailing_space_refused(path):
    assert host_path_problem(path) is not None


def test_a_path_part_longer_than_a_filesystem_stores():
    assert "255 bytes" in host_path_problem("/mnt/" + "\u00e9" * 128)


@pytest.mark.parametrize("path", ["lmcache", "kv/lmcache", "l2 cache"])
def test_good_relative_paths(path):
    check_relative_path(path)


@pytest.mark.parametrize("path", ["/etc", "../etc", "a/../../etc", "a//b", "a/", ".", "", "a/./b"])
def test_relative_paths_stay_inside(path):
    with pytest.raises(ValueError):
        check_relative_path(path)


@pytest.mark.parametrize(
    "path, ok",
    [
        ("/dev/disk/by-id/nvme-x", True),
        ("/dev/nvme0n1", True),
        ("/mnt/x", False),
        ("/dev/../etc/passwd", False),
        ("/dev/disk/by-id/a b\n", False),
        ("/dev/", False),
    ],
)
def test_device_paths(path, ok):
    assert (device_path_problem(path) is None) is ok
    if not ok:
        with pytest.raises(ValueError):
            check_device_path(path)


@pytest.mark.parametrize("path", ["/", "/etc", "/var/lib/docker", "/mnt/a/../b", "/mnt/$HOME", "/a:b", "rel"])
def test_l2_path_knob_refuses_naming_the_knob(path):
    with pytest.raises(ConfigError) as caught:
        KNOBS_BY_NAME["l2_path"].coerce(path)
    assert caught.value.field == "l2_path"


def test_an_absolute_relative_path_is_told_why():
    assert "must be relative" in relative_path_problem("/etc")  # joined, it would replace the mount point
