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


def test_the_restarts_cleanup_removes_every_stopped_engines_file_and_keeps_the_rest(tmp_path):
    """Issue 43: each engine start left a sem.mp-* in /dev/shm that nothing cleaned. The cleanup removes a file of
    each STALE_SHM_GLOBS pattern that no process maps, keeps a mapped one and any other file."""
    import mmap

    for name in ("vllm_offload_old.mmap", "sem.mp-old", "sem.mp-inuse", "someone-elses"):
        (tmp_path / name).write_bytes(b"\0" * 4096)
    with open(tmp_path / "sem.mp-inuse", "r+b") as f, mmap.mmap(f.fileno(), 4096):
        result = run(shm_cleanup_command().replace("/dev/shm", str(tmp_path)))
    assert result.returncode == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["sem.mp-inuse", "someone-elses"]
    assert result.stdout.count("removed stale") == 2
