"""fstab quoting (fstab(5), getmntent(3)), read back by util-linux's own fstab parser (findmnt --tab-file)."""

import json
import shutil
import subprocess

import pytest

from rigkit.disk import check_account_name, check_mount_options, fstab_field, fstab_line, mount_options_problem

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
    with pytest.raises(ValueError):
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
    assert "newline" in mount_options_problem("noatime\nnofail")


@pytest.mark.parametrize("options", ["", ",noatime", "noatime,", "a,,b"])
def test_empty_options_are_told_the_form(options):
    assert "single commas" in mount_options_problem(options)


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
        with pytest.raises(ValueError):
            check_account_name(name)
