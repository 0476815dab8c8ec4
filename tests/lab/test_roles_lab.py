"""The provisioning roles against real rigs over SSH: the docker role (distro source) and l2_disk.

Each role runs alone through the pyinfra CLI with a one-rig inventory written here (the lab's SSH
data plus the role data the lab's group data declares), so a test neither depends on nor disturbs
the serving image or the other rigs. GPU roles cannot run here (no GPU): their behaviour is covered
by the role and operation tests in tests/roles/ and tests/operations/.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rigkit.fleet.pyinfra_args import pyinfra_executable
from rigkit.lab.pyinfra_output import parse_results
from rigkit.lab.state import LabState, RigState
from rigkit.paths import REPO_ROOT
from rigkit.settings.defaults import L2_DISK_VARIABLES as L2_VARIABLES

pytestmark = pytest.mark.lab

# What group_data/lab.py declares for the rigs' engine: Debian's packages, never a bridge.
LAB_ROLE_DATA = {
    "gpus": 0,
    "docker_source": "distro",
    "docker_daemon_options": {"bridge": "none", "iptables": False, "ip-forward": False, "ip-masq": False},
}
L2_DEFAULTS = {v.name: v.default for v in L2_VARIABLES}
MOUNT_POINT = L2_DEFAULTS["l2_mount_point"]
CACHE_DIR = f"{MOUNT_POINT}/{L2_DEFAULTS['l2_cache_dir']}"
CHECK_IMAGE = "rigkit-lab/true:1"  # made inside the rig from its own /usr/bin/true: no registry needed
MARKER = f"{CACHE_DIR}/kept-across-runs"


def write_inventory(directory: Path, lab: LabState, rig: RigState) -> Path:
    host_data = {
        "ssh_hostname": rig.ssh_host,
        "ssh_port": rig.ssh_port,
        "ssh_user": "root",
        "ssh_key": lab.ssh_key,
        "ssh_known_hosts_file": lab.known_hosts,
        "ssh_strict_host_key_checking": "yes",
        "ssh_allow_agent": False,
        "ssh_look_for_keys": False,
        "l2_device": rig.nvme_path,
        **LAB_ROLE_DATA,
    }
    path = directory / "inventory.py"
    path.write_text(f"roles_lab = [({rig.name!r}, {host_data!r})]\n")
    return path


def run_role(
    directory: Path, lab: LabState, rig: RigState, role: str, data: dict[str, str] | None = None, dry: bool = False
) -> subprocess.CompletedProcess:
    """The pyinfra CLI running one role on one rig (``--dry`` without ``-y``, so it detects changes)."""
    deploy = directory / f"{role}_deploy.py"
    deploy.write_text(
        "from pyinfra import host\n\nfrom rigkit.settings.hostdata import rig_settings\nfrom roles import Run\n"
        f"from roles.{role} import {role}\n\n"
        f"{role}(rig_settings(host.data.dict(), needs_stack=False), Run())\n"
    )
    inventory = write_inventory(directory, lab, rig)
    data_args = [arg for key, value in (data or {}).items() for arg in ("--data", f"{key}={value}")]
    mode = ["--dry"] if dry else ["-y"]
    # Run outside the repository so only this inventory's data applies (no group_data/ lookup).
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [pyinfra_executable(), *mode, *data_args, str(inventory), str(deploy)],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def totals(result: subprocess.CompletedProcess):
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    # pyinfra logs the results table to stderr when its output is not a terminal
    return parse_results(result.stdout + result.stderr)["Grand total"]


@pytest.fixture(scope="module")
def rig(lab: LabState, run_pyinfra) -> RigState:
    """The last lab rig. These tests stop its engine and wipe its L2 disk: a serving stack the session
    deployed there is converged back by the real deploy afterwards, as an operator would."""
    rig = lab.rigs[-1]
    had_stack = (
        subprocess.run(
            ["docker", "exec", rig.container, "test", "-f", "/etc/rigkit/stack/compose.yml"], capture_output=True
        ).returncode
        == 0
    )
    yield rig
    if had_stack:
        result = run_pyinfra(args=["--limit", rig.name], deploy="deploy.py", timeout=1800)
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]


# ----------------------------------------------------------------------------------------- docker


def test_docker_role_distro_source_gives_a_working_engine_that_runs_a_container(lab, rig, rig_exec, tmp_path):
    # Start from a rig that differs: engine stopped, packages not held, a daemon.json key we do not own.
    # (reset-failed: earlier tests may have used up systemd's start limit for the unit)
    rig_exec(
        rig,
        "systemctl stop docker.service docker.socket; systemctl reset-failed docker.service; "
        "apt-mark unhold docker.io docker-compose >/dev/null",
    )
    rig_exec(rig, """echo '{"bridge": "none", "log-level": "warn"}' > /etc/docker/daemon.json""")

    first = totals(run_role(tmp_path, lab, rig, "docker"))
    assert first.success > 0 and first.error == 0

    assert rig_exec(rig, "systemctl is-active docker.service").stdout.strip() == "active"
    assert rig_exec(rig, "docker info --format '{{.ServerVersion}}'").stdout.strip()
    daemon_text = rig_exec(rig, "cat /etc/docker/daemon.json").stdout
    assert '"log-level": "warn"' in daemon_text, "a key rigkit does not own was dropped"
    assert '"ip-masq": false' in daemon_text and '"bridge": "none"' in daemon_text, daemon_text
    held = rig_exec(rig, "apt-mark showhold").stdout.split()
    assert {"docker.io", "docker-compose"} <= set(held)
    assert "bridge" not in rig_exec(rig, "docker network ls --format '{{.Driver}}'").stdout.split()

    # An image with /bin/true, built in the rig from its own files, so the check runs a real container.
    rig_exec(
        rig,
        f"docker image inspect {CHECK_IMAGE} >/dev/null 2>&1 || ("
        "rm -rf /tmp/rigkit-true && mkdir -p /tmp/rigkit-true && "
        "cp --parents /usr/bin/true $(ldd /usr/bin/true | grep -o '/[^ ]*') /tmp/rigkit-true/ && "
        f"tar -C /tmp/rigkit-true -c . | docker import - {CHECK_IMAGE})",
    )
    since = int(rig_exec(rig, "date +%s").stdout)
    second = run_role(tmp_path, lab, rig, "docker", {"docker_verify_image": CHECK_IMAGE})
    total = totals(second)
    assert (total.success, total.error) == (0, 0) and total.no_change == total.hosts, second.stderr[-3000:]
    until = int(rig_exec(rig, "date +%s").stdout) + 1
    events = rig_exec(
        rig, f"docker events --since {since} --until {until} --filter event=start --format '{{{{.From}}}}'"
    ).stdout.split()
    assert CHECK_IMAGE in events, f"the verification started no container from {CHECK_IMAGE}: {events}"


def test_docker_role_fails_when_the_engine_cannot_run_the_check_image(lab, rig, rig_exec, tmp_path):
    totals(run_role(tmp_path, lab, rig, "docker"))
    absent = f"{lab.registry}/rigkit-absent:none"  # the loopback registry answers "manifest unknown"
    result = run_role(tmp_path, lab, rig, "docker", {"docker_verify_image": absent})
    assert result.returncode != 0
    assert f"docker_verify_image={absent!r}: the engine cannot run a container" in result.stdout + result.stderr


# ---------------------------------------------------------------------------------------- l2_disk


def blank_l2_disk(rig: RigState, rig_exec) -> None:
    """The rig's spare disk as the lab hands it out: no filesystem, not mounted, not in fstab."""
    # a serving stack and the L2 janitor use the disk: stop them first (the module's fixture redeploys)
    rig_exec(rig, "docker rm -f rigkit-serving >/dev/null 2>&1; systemctl stop rigkit-l2-janitor 2>/dev/null; true")
    rig_exec(
        rig,
        f"umount {MOUNT_POINT} 2>/dev/null; sed -i '\\# {MOUNT_POINT} #d' /etc/fstab; "
        f"wipefs -a -q {rig.nvme_path}; rm -rf {MOUNT_POINT}; true",
    )
    assert probe(rig, rig_exec) == {}


def probe(rig: RigState, rig_exec) -> dict[str, str]:
    out = rig_exec(rig, f"blkid -p -o export {rig.nvme_path}", check=False).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def mount_of(rig: RigState, rig_exec) -> tuple[str, list[str]] | None:
    out = rig_exec(rig, f"findmnt -n -o SOURCE,OPTIONS --mountpoint {MOUNT_POINT}", check=False).stdout.split()
    return (out[0], out[1].split(",")) if len(out) == 2 else None


def fstab_lines(rig: RigState, rig_exec) -> list[str]:
    return [
        line
        for line in rig_exec(rig, "cat /etc/fstab").stdout.splitlines()
        if len(line.split()) > 1 and line.split()[1] == MOUNT_POINT
    ]


def test_l2_disk_dry_run_shows_changes_and_makes_none(lab, rig, rig_exec, tmp_path):
    blank_l2_disk(rig, rig_exec)
    result = run_role(tmp_path, lab, rig, "l2_disk", dry=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Detected changes" in output
    for operation in ("Filesystem on l2_device", "fstab entry by UUID", "L2 disk mounted"):
        row = next(line for line in output.splitlines() if operation in line)
        assert f"1 ({rig.name})" in row, f"--dry does not show {operation!r} would change: {row}"
    assert probe(rig, rig_exec) == {}, "--dry formatted the disk"
    assert fstab_lines(rig, rig_exec) == [] and mount_of(rig, rig_exec) is None


def test_l2_disk_formats_once_mounts_by_uuid_and_survives_a_remount(lab, rig, rig_exec, tmp_path):
    blank_l2_disk(rig, rig_exec)
    first = totals(run_role(tmp_path, lab, rig, "l2_disk"))
    assert first.success > 0 and first.error == 0

    fs = probe(rig, rig_exec)
    assert (fs["TYPE"], fs["LABEL"]) == ("ext4", L2_DEFAULTS["l2_label"])
    assert fstab_lines(rig, rig_exec) == [f"UUID={fs['UUID']} {MOUNT_POINT} ext4 {L2_DEFAULTS['l2_mount_options']} 0 2"]
    source, options = mount_of(rig, rig_exec)
    assert source == rig.loop_device and "noatime" in options
    rig_exec(rig, f"test -d {CACHE_DIR} && echo kept > {MARKER}")

    second = totals(run_role(tmp_path, lab, rig, "l2_disk"))
    assert (second.success, second.error, second.no_change) == (0, 0, second.hosts)

    # By UUID from fstab, as a boot would; then unmounted, the role mounts it back, never reformats.
    rig_exec(rig, f"umount {MOUNT_POINT} && mount {MOUNT_POINT}")
    assert rig_exec(rig, f"cat {MARKER}").stdout == "kept\n"
    rig_exec(rig, f"umount {MOUNT_POINT}")
    third = totals(run_role(tmp_path, lab, rig, "l2_disk"))
    assert third.success == 1, "only the mount should have changed"
    assert mount_of(rig, rig_exec)[0] == rig.loop_device
    assert rig_exec(rig, f"cat {MARKER}").stdout == "kept\n"
    assert probe(rig, rig_exec)["UUID"] == fs["UUID"]


def test_l2_disk_changed_mount_option_remounts(lab, rig, rig_exec, tmp_path):
    totals(run_role(tmp_path, lab, rig, "l2_disk"))
    changed = run_role(tmp_path, lab, rig, "l2_disk", {"l2_mount_options": "noatime,nosuid,nofail"})
    assert totals(changed).success == 2  # the fstab entry and the remount
    assert "nosuid" in mount_of(rig, rig_exec)[1]
    assert fstab_lines(rig, rig_exec)[0].split()[3] == "noatime,nosuid,nofail"
    # Back to the declared options (an option removed applies at the next mount).
    totals(run_role(tmp_path, lab, rig, "l2_disk"))
    rig_exec(rig, f"umount {MOUNT_POINT}")
    totals(run_role(tmp_path, lab, rig, "l2_disk"))
    assert "nosuid" not in mount_of(rig, rig_exec)[1]


def test_l2_disk_refuses_to_reformat_without_opt_in(lab, rig, rig_exec, tmp_path):
    totals(run_role(tmp_path, lab, rig, "l2_disk"))
    rig_exec(rig, f"echo kept > {MARKER}")
    before = probe(rig, rig_exec)

    other_type = run_role(tmp_path, lab, rig, "l2_disk", {"l2_fstype": "xfs"})
    assert other_type.returncode != 0
    assert "holds rigkit's ext4 filesystem, not xfs" in other_type.stdout + other_type.stderr
    assert "l2_format=true" in other_type.stdout + other_type.stderr

    other_label = run_role(tmp_path, lab, rig, "l2_disk", {"l2_label": "not-rigkit"})
    assert other_label.returncode != 0
    assert "l2_force_format=true" in other_label.stdout + other_label.stderr

    assert probe(rig, rig_exec) == before, "a refused run touched the disk"
    assert rig_exec(rig, f"cat {MARKER}").stdout == "kept\n"
    after = totals(run_role(tmp_path, lab, rig, "l2_disk"))
    assert (after.success, after.error) == (0, 0)
