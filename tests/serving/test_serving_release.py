"""The serving role's release commands, run in a real shell where they can be."""

import subprocess

from rigkit.serving.commands import l2_on_disk_command, release_commands, shm_cleanup_command


def run(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True)


def test_l2_guard_refuses_a_path_that_is_not_on_the_l2_disk(tmp_path):
    # tmp_path is not on a filesystem mounted at /mnt/rigkit-l2: a disk that did not mount
    result = run(l2_on_disk_command(str(tmp_path / "lmcache"), "/mnt/rigkit-l2"))
    assert result.returncode == 1
    assert "not on the L2 disk mounted at /mnt/rigkit-l2" in result.stderr and "findmnt" in result.stderr


def test_l2_guard_passes_on_the_disk(tmp_path):
    mount = run(f"findmnt -n -o TARGET --target {tmp_path}").stdout.strip()
    assert run(l2_on_disk_command(str(tmp_path / "lmcache"), mount)).returncode == 0


def test_release_pulls_and_validates_the_files_before_it_stops_anything_and_never_restarts():
    commands = release_commands("docker-compose", "r@sha256:" + "a" * 64, True, "http://127.0.0.1:1/v1/models", 5)
    assert commands[0].startswith("docker pull ")
    assert commands[1].endswith("config -q")
    assert commands[2].endswith("down --remove-orphans") and commands[3] == shm_cleanup_command()
    assert commands[4].endswith("up -d")
    assert not any("restart" in c for c in commands)
