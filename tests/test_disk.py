"""fstab quoting (fstab(5), getmntent(3)), read back by util-linux's own fstab parser (findmnt --tab-file)."""

import json
import os
import re
import shlex
import shutil
import subprocess

import pytest

from rigkit.disk import (
    fstab_field,
    fstab_line,
    seal_command,
    seal_flags_immutable,
    under_mount_point_read,
)
from rigkit.settings.types import check_account_name, check_mount_options, mount_options_problem

FINDMNT = shutil.which("findmnt")


def read_by_util_linux(tmp_path, text: str) -> list[dict]:
    fstab = tmp_path / "fstab"
    fstab.write_text(text)
    result = subprocess.run(
        [FINDMNT, "--tab-file", str(fstab), "--json", "-o", "SOURCE,TARGET,FSTYPE,OPTIONS"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["filesystems"]


@pytest.mark.parametrize(
    "text, field",
    [
        ("/mnt/a b", "/mnt/a\\040b"),
        ("a\tb", "a\\011b"),
        ("a\nb", "a\\012b"),
        ("a\\b", "a\\134b"),
        ("/mnt/plain", "/mnt/plain"),
        ("/mnt/caf\u00e9", "/mnt/caf\u00e9"),
    ],
)
def test_fstab_field_uses_octal_escapes(text, field):
    assert fstab_field(text) == field


def test_empty_field_refused():
    with pytest.raises(ValueError, match="^an fstab field cannot be empty$"):
        fstab_field("")


@pytest.mark.skipif(FINDMNT is None, reason="findmnt (util-linux) not installed")
@pytest.mark.parametrize(
    "mount_point",
    [
        "/mnt/rigkit-l2",
        "/mnt/l2 disk",
        "/mnt/tab\there",
        "/mnt/back\\slash",
        "/mnt/new\nline",
        "/mnt/\U0001f600 caf\u00e9",
        "/mnt/#not-a-comment",
    ],
)
def test_fstab_line_read_back_exactly_by_util_linux(tmp_path, mount_point):
    line = fstab_line("UUID=5d0c3a52-6f0e-4b8e-9a51-7a4f2c0b1e11", mount_point, "ext4", "noatime,nofail")
    assert len(line.split()) == 6 and "\n" not in line
    (entry,) = read_by_util_linux(tmp_path, f"# rigkit\nUUID=other /other xfs defaults 0 0\n{line}\n")[1:]
    assert entry == {
        "source": "UUID=5d0c3a52-6f0e-4b8e-9a51-7a4f2c0b1e11",
        "target": mount_point,
        "fstype": "ext4",
        "options": "noatime,nofail",
    }


@pytest.mark.parametrize(
    "options",
    [
        "noatime,nofail",
        "defaults",
        "commit=60,errors=remount-ro",
        'context="system_u:object_r:container_file_t:s0"',
        "x-systemd.automount",
        "X-mount.mkdir",  # util-linux's own options start with a capital X
    ],
)
def test_good_mount_options(options):
    check_mount_options(options)


@pytest.mark.parametrize(
    "options",
    [
        "noatime\nUUID=x / ext4 defaults 0 0",
        "noatime\r",
        "",
        ",noatime",
        "noatime,",
        "a,,b",
        "noatime nofail",
        "noatime\tx",
        "x;reboot",
        "x$(id)",
        "x`id`",
    ],
)
def test_mount_options_no_fstab_line_or_shell_can_carry(options):
    assert mount_options_problem(options) is not None
    with pytest.raises(ValueError):
        fstab_line("UUID=x", "/mnt/x", "ext4", options)


def test_a_newline_in_the_options_is_named():
    assert mount_options_problem("noatime\nnofail") == "contains a newline, which would start another fstab line"
    assert mount_options_problem("noatime\rnofail") == "contains a newline, which would start another fstab line"


@pytest.mark.parametrize("options", ["", ",noatime", "noatime,", "a,,b"])
def test_empty_options_are_told_the_form(options):
    assert mount_options_problem(options) == "must be options separated by single commas, e.g. noatime,nofail"


@pytest.mark.parametrize(
    "name, ok",
    [
        ("root", True),
        ("rigkit", True),
        ("_apt", True),
        ("1000", True),
        ("Root", False),
        ("a b", False),
        ("", False),
        ("-x", False),
        ("x" * 33, False),
        ("root;rm", False),
    ],
)
def test_account_names(name, ok):
    if ok:
        check_account_name(name)
    else:
        told = "must be a user or group name (lowercase letters, digits, '_', '-'; at most 32) or a numeric id"
        with pytest.raises(ValueError, match=f"^{re.escape(told)}$"):
            check_account_name(name)


def _as_root_with_chattr(path) -> bool:
    probe = path / "probe"
    probe.mkdir()
    ok = os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode == 0
    subprocess.run(["chattr", "-i", str(probe)], capture_output=True)
    probe.rmdir()
    return ok and shutil.which("unshare") is not None


def _under_a_bind_mount(tmp_path, command: str) -> subprocess.CompletedProcess:
    """``command`` run with tmp_path/export bound over tmp_path/mount, in a mount namespace of its own (the
    controller's mount table is never touched)."""
    export, mount = tmp_path / "export", tmp_path / "mount"
    export.mkdir(exist_ok=True)
    mount.mkdir(exist_ok=True)
    script = f"mount --bind {shlex.quote(str(export))} {shlex.quote(str(mount))} && {command}"
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script], capture_output=True, text=True
    )


def test_the_seal_makes_the_directory_under_a_mount_immutable_and_refuses_one_with_files(tmp_path):
    """The real commands, on this machine: a directory under a bind mount sealed, then nothing can be made in it;
    one holding files refused, untouched."""
    if not _as_root_with_chattr(tmp_path):
        pytest.skip("needs root, unshare and a filesystem with the immutable attribute")
    mount = tmp_path / "mount"
    (tmp_path / "mount").mkdir()
    (mount / "kv").mkdir()  # a store an engine left while the export was unmounted
    refused = _under_a_bind_mount(tmp_path, seal_command(str(mount), "kv_share_mount_point"))
    assert refused.returncode == 1 and "has files under the mount" in refused.stderr
    (mount / "kv").rmdir()
    try:
        sealed = _under_a_bind_mount(tmp_path, seal_command(str(mount), "kv_share_mount_point"))
        assert sealed.returncode == 0, sealed.stderr
        read = subprocess.run(["sh", "-c", under_mount_point_read(str(mount))], capture_output=True, text=True)
        assert read.stdout.startswith("flags=") and seal_flags_immutable(read.stdout.split("=")[1])
        with pytest.raises(PermissionError):
            (mount / "kv").mkdir()  # what docker's making of a bind source does
        assert not (tmp_path / "export" / "kv").exists()
    finally:
        subprocess.run(["chattr", "-i", str(mount)], capture_output=True)


def test_the_read_under_a_mount_point_lists_its_first_five_entries_hidden_ones_too(tmp_path):
    """No mount needed: a directory that is not a mount point is read as it is."""
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare (root)")
    directory = tmp_path / "mount"
    directory.mkdir()
    empty = subprocess.run(["sh", "-c", under_mount_point_read(str(directory))], capture_output=True, text=True)
    assert [line for line in empty.stdout.splitlines() if line.startswith("entry=")] == []
    names = {".hidden", "..dots", "a b", "*", "link", "c", "d"}
    for name in names - {"link"}:
        (directory / name).write_text("x")
    (directory / "link").symlink_to(tmp_path / "nowhere")  # a dangling link is an entry too
    read = subprocess.run(["sh", "-c", under_mount_point_read(str(directory))], capture_output=True, text=True)
    entries = [line.removeprefix("entry=") for line in read.stdout.splitlines() if line.startswith("entry=")]
    assert len(entries) == 5 and set(entries) <= names, read.stdout
    for name in list(names)[:-1]:
        (directory / name).unlink()
    left = subprocess.run(["sh", "-c", under_mount_point_read(str(directory))], capture_output=True, text=True)
    assert [line for line in left.stdout.splitlines() if line.startswith("entry=")] == [f"entry={list(names)[-1]}"]
    assert (
        subprocess.run(
            ["sh", "-c", under_mount_point_read(str(tmp_path / "none"))], capture_output=True, text=True
        ).stdout
        == "absent\n"
    )


def test_a_dangling_link_alone_under_a_mount_point_is_an_entry(tmp_path):
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare (root)")
    directory = tmp_path / "mount"
    directory.mkdir()
    (directory / "link").symlink_to(tmp_path / "nowhere")
    read = subprocess.run(["sh", "-c", under_mount_point_read(str(directory))], capture_output=True, text=True)
    assert [line for line in read.stdout.splitlines() if line.startswith("entry=")] == ["entry=link"]


def test_a_filesystem_without_the_immutable_attribute_is_refused_with_the_fix(tmp_path):
    """A stand-in chattr (named as such) fails as chattr does where the filesystem lacks the attribute."""
    if not _as_root_with_chattr(tmp_path):
        pytest.skip("needs root, unshare and a filesystem with the immutable attribute")
    stand_in = tmp_path / "bin"
    stand_in.mkdir()
    (stand_in / "chattr").write_text("#!/bin/sh\necho 'chattr: Operation not supported' >&2\nexit 1\n")
    (stand_in / "chattr").chmod(0o755)
    mount = tmp_path / "mount"
    mount.mkdir()
    command = f"PATH={shlex.quote(str(stand_in))}:$PATH; " + seal_command(str(mount), "kv_share_mount_point")
    refused = _under_a_bind_mount(tmp_path, command)
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[-1] == (
        f"refused: kv_share_mount_point {mount}: the directory under the mount cannot be made immutable (its "
        "filesystem has no immutable attribute: lsattr -d), so an engine started while the export is unmounted "
        "would fill the root disk of this rig. Fix: put the mount point on a filesystem that has it (ext4, xfs, btrfs)"
    )


def test_an_fstab_line_is_never_dumped_and_checked_after_the_root_filesystem():
    assert fstab_line("UUID=x", "/mnt/l2 disk", "ext4", "noatime") == "UUID=x /mnt/l2\\040disk ext4 noatime 0 2"
