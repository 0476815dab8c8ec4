"""The L2 janitor (rigkit/files/l2_janitor.py) on real directories and, as root, on a real small tmpfs that a
foreign file fills: LRU eviction to the budget and to the free-space floor, never a file that is not the store's."""

import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from rigkit.files import l2_janitor as janitor

JANITOR_PATH = Path(janitor.__file__)

OLD = 1_000_000  # an mtime far older than the janitor's grace period
KIB = 1024
ENTRY_BYTES = 64 * KIB
SMALL_FS_BYTES = 2 * 2**20


def make_entry(store: Path, name: str, size: int, used_at: float) -> Path:
    entry = store / name
    entry.mkdir()
    (entry / "layer0.bin").write_bytes(b"\1" * size)
    os.utime(entry / "layer0.bin", (used_at, used_at))
    os.utime(entry, (used_at, used_at))  # a directory's mtime moves when the connector adds a layer file
    return entry


def fill_to_free(mount: Path, free_bytes: int, name: str = "foreign.bin") -> Path:
    """A foreign file (another process's) that leaves `free_bytes` free on the filesystem."""
    foreign = mount / name
    current = foreign.stat().st_size if foreign.exists() else 0
    size = current + shutil.disk_usage(mount).free - free_bytes
    subprocess.run(["fallocate", "-l", str(size), str(foreign)], check=True)
    return foreign


@pytest.fixture
def small_fs(tmp_path):
    """A real 2 MiB tmpfs: the L2 filesystem in miniature (mounting needs root)."""
    mount = tmp_path / "l2"
    mount.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={SMALL_FS_BYTES}", "tmpfs", str(mount)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mount
    finally:
        unmount(mount)


def unmount(mount: Path) -> None:
    """umount, again for a moment while busy (a rig container of the lab may briefly hold a propagated copy),
    then lazily: the tmpfs never outlives the test either way."""
    for _ in range(20):
        result = subprocess.run(["umount", str(mount)], capture_output=True, text=True)
        if result.returncode == 0:
            return
        time.sleep(0.25)
    lazy = subprocess.run(["umount", "--lazy", str(mount)], capture_output=True, text=True)
    assert lazy.returncode == 0, f"umount {mount}: {result.stderr.strip()}; umount --lazy: {lazy.stderr.strip()}"
    warnings.warn(f"umount {mount} was busy ({result.stderr.strip()}): detached lazily")


def test_oldest_entries_go_first_until_under_budget(tmp_path):
    for index in range(5):
        make_entry(tmp_path, f"e{index}", 1000, used_at=OLD + index)
    round_ = janitor.evict_once(str(tmp_path), budget=2500, min_free=0)
    assert [name for name, _ in round_.evicted] == ["e0", "e1", "e2"]
    assert sum(size for _, size in round_.evicted) == 3000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e3", "e4"]
    assert round_.state == janitor.STATE_OK and "over its budget" in round_.reason


def test_nothing_removed_under_budget(tmp_path):
    make_entry(tmp_path, "a", 1000, used_at=OLD)
    round_ = janitor.evict_once(str(tmp_path), budget=5000, min_free=0)
    assert (round_.evicted, round_.state, round_.store_bytes, round_.entries) == ([], janitor.STATE_OK, 1000, 1)


def test_entries_written_within_the_grace_period_are_kept(tmp_path):
    make_entry(tmp_path, "old", 1000, used_at=OLD)
    now = time.time()
    make_entry(tmp_path, "being-written", 1000, used_at=now)
    round_ = janitor.evict_once(str(tmp_path), budget=0, min_free=0, now=now)
    assert [name for name, _ in round_.evicted] == ["old"]
    assert [p.name for p in tmp_path.iterdir()] == ["being-written"]
    assert round_.state == janitor.STATE_OVER_BUDGET


def test_foreign_file_filling_the_disk_evicts_just_enough_store_entries(small_fs):
    store = small_fs / "kv"
    store.mkdir()
    for index in range(8):
        make_entry(store, f"e{index}", ENTRY_BYTES, used_at=OLD + index)
    floor = 512 * KIB
    foreign = fill_to_free(small_fs, floor - 150 * KIB)
    foreign_size = foreign.stat().st_size

    round_ = janitor.evict_once(str(store), budget=10 * 2**20, min_free=floor)

    assert [name for name, _ in round_.evicted] == ["e0", "e1", "e2"]  # 192 KiB >= the 150 KiB missing
    assert sorted(p.name for p in store.iterdir()) == [f"e{i}" for i in range(3, 8)]
    assert foreign.stat().st_size == foreign_size
    assert round_.state == janitor.STATE_OK and round_.fs_free_bytes >= floor
    assert "below the floor" in round_.reason and str(small_fs) in round_.reason
    assert round_.mount == str(small_fs)


def test_floor_the_store_cannot_restore_empties_it_and_says_so(small_fs):
    store = small_fs / "kv"
    store.mkdir()
    for index in range(4):
        make_entry(store, f"e{index}", ENTRY_BYTES, used_at=OLD + index)
    (small_fs / "lost+found").mkdir()
    floor = 1 * 2**20
    foreign = fill_to_free(small_fs, floor - 600 * KIB)  # the store's 256 KiB cannot close the gap

    round_ = janitor.evict_once(str(store), budget=10 * 2**20, min_free=floor)

    assert len(round_.evicted) == 4 and list(store.iterdir()) == []
    assert foreign.exists() and (small_fs / "lost+found").is_dir()
    assert round_.state == janitor.STATE_BELOW_FLOOR
    assert f"free space on {small_fs} or lower l2_budget_gb" in round_.message
    assert "the store is empty" in round_.message and round_.fs_free_bytes < floor


def test_store_that_is_a_mount_point_is_refused_untouched(small_fs):
    make_entry(small_fs, "someone-elses", ENTRY_BYTES, used_at=OLD)
    round_ = janitor.evict_once(str(small_fs), budget=0, min_free=SMALL_FS_BYTES)
    assert round_.state == janitor.STATE_REFUSED and round_.evicted == []
    assert (small_fs / "someone-elses" / "layer0.bin").stat().st_size == ENTRY_BYTES
    assert "set l2_path to a directory of its own" in round_.message


def test_never_deletes_through_links_nor_lost_found(tmp_path):
    store, outside = tmp_path / "kv", tmp_path / "outside"
    store.mkdir()
    outside.mkdir()
    (outside / "precious.bin").write_bytes(b"x" * 1000)
    (store / "link-to-dir").symlink_to(outside)
    os.utime(store / "link-to-dir", (OLD, OLD), follow_symlinks=False)
    # as old as the entry that goes: the grace period does not save it, only the lost+found guard does
    make_entry(store, "lost+found", 1000, used_at=OLD)
    make_entry(store, "entry", 1000, used_at=OLD)

    round_ = janitor.evict_once(str(store), budget=0, min_free=0)

    assert sorted(name for name, _ in round_.evicted) == ["entry", "link-to-dir"]
    assert (outside / "precious.bin").read_bytes() == b"x" * 1000
    assert (store / "lost+found" / "layer0.bin").exists()
    assert (round_.store_bytes, round_.entries) == (0, 0)  # not counted against the budget either


def test_never_deletes_a_filesystem_mounted_inside_the_store(small_fs):
    # a store entry that is a mount point (another disk mounted into l2_path): not the store's to delete,
    # however old its files; the round still evicts the store's own entries
    store = small_fs / "kv"
    store.mkdir()
    make_entry(store, "entry", ENTRY_BYTES, used_at=OLD)
    nested = store / "other-disk"
    nested.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(nested)], check=True)
    try:
        (nested / "precious.bin").write_bytes(b"z" * KIB)
        os.utime(nested / "precious.bin", (OLD, OLD))
        os.utime(nested, (OLD, OLD))

        round_ = janitor.evict_once(str(store), budget=0, min_free=0)

        assert [name for name, _ in round_.evicted] == ["entry"]
        assert os.path.ismount(nested) and (nested / "precious.bin").read_bytes() == b"z" * KIB
        assert round_.state == janitor.STATE_OK and round_.entries == 0
    finally:
        subprocess.run(["umount", str(nested)], check=True)


def test_entries_half_deleted_by_a_stopped_janitor_are_finished(tmp_path):
    make_entry(tmp_path, janitor.EVICTING_PREFIX + "abc", 1000, used_at=OLD)
    make_entry(tmp_path, "kept", 1000, used_at=OLD)
    round_ = janitor.evict_once(str(tmp_path), budget=10**9, min_free=0)
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and round_.store_bytes == 1000


def test_status_counts_evictions_across_rounds(tmp_path):
    for index in range(3):
        make_entry(tmp_path, f"e{index}", 1000, used_at=OLD + index)
    status = janitor.Status(str(tmp_path), budget_bytes=2000, min_free_bytes=0, started_at=0.0)
    status.record(janitor.evict_once(str(tmp_path), budget=2000, min_free=0), now=10.0)
    make_entry(tmp_path, "e3", 1000, used_at=OLD + 3)
    status.record(janitor.evict_once(str(tmp_path), budget=2000, min_free=0), now=20.0)
    path = tmp_path.parent / "status.json"
    janitor.write_status(str(path), status)
    saved = json.loads(path.read_text())
    assert (saved["evicted_entries"], saved["evicted_bytes"], saved["store_bytes"]) == (2, 2000, 2000)
    assert saved["last_eviction"]["at"] == 20.0 and "over its budget" in saved["last_eviction"]["reason"]


def test_running_janitor_logs_evictions_and_a_floor_it_cannot_restore_loudly(small_fs, tmp_path):
    store, status_file = small_fs / "kv", tmp_path / "status.json"
    store.mkdir()
    make_entry(store, "e0", ENTRY_BYTES, used_at=OLD)
    floor = 1 * 2**20
    foreign = fill_to_free(small_fs, floor // 2)
    process = subprocess.Popen(
        [sys.executable, str(JANITOR_PATH), str(store), str(10 * 2**20), str(floor), "0.1", str(status_file)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not status_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        status = json.loads(status_file.read_text())
    finally:
        process.terminate()
        output = process.communicate(timeout=10)[0]
    assert status["state"] == janitor.STATE_BELOW_FLOOR and status["evicted_entries"] == 1
    assert status["fs_free_bytes"] < floor and status["min_free_bytes"] == floor
    assert foreign.exists()
    lines = output.splitlines()
    assert any(
        line.startswith("<5>evicted 1 entries") and "e0" in line and "below the floor" in line for line in lines
    ), output
    assert any(line.startswith("<3>L2 BELOW-FLOOR") and str(small_fs) in line for line in lines), output


def test_the_uploaded_file_runs_alone_with_the_standard_library_only(tmp_path):
    """The rig gets this one file: a copy outside the checkout, run without site-packages (-S: no rigkit
    installed) and without the current directory (-I), still runs its rounds and writes its status."""
    alone, status_file = tmp_path / "alone" / "l2_janitor.py", tmp_path / "status.json"
    alone.parent.mkdir()
    shutil.copy(JANITOR_PATH, alone)
    process = subprocess.Popen(
        [sys.executable, "-I", "-S", str(alone), str(tmp_path / "no-store"), "1000", "0", "0.1", str(status_file)],
        cwd=alone.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not status_file.exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
    finally:
        process.terminate()
        output, errors = process.communicate(timeout=10)
    assert status_file.exists(), errors
    assert json.loads(status_file.read_text())["state"] == janitor.STATE_NO_STORE
    assert output.startswith("<6>janitor for ")
