"""The L2 janitor (roles/files/l2_janitor.py) on a real directory: LRU eviction to budget and free floor."""

import importlib.util
import os
import shutil
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("l2_janitor", Path(__file__).parents[1] / "roles/files/l2_janitor.py")
janitor = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(janitor)


def make_entry(store: Path, name: str, size: int, used_at: float) -> Path:
    entry = store / name
    entry.mkdir()
    (entry / "layer0.bin").write_bytes(b"\0" * size)
    os.utime(entry / "layer0.bin", (used_at, used_at))
    return entry


def test_oldest_entries_go_first_until_under_budget(tmp_path):
    for index in range(5):
        make_entry(tmp_path, f"e{index}", 1000, used_at=1_000_000 + index)
    removed, freed = janitor.evict_once(str(tmp_path), budget=2500, min_free=0)
    assert (removed, freed) == (3, 3000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e3", "e4"]


def test_nothing_removed_under_budget(tmp_path):
    make_entry(tmp_path, "a", 1000, used_at=1_000_000)
    assert janitor.evict_once(str(tmp_path), budget=5000, min_free=0) == (0, 0)


def test_free_space_floor_evicts_even_under_budget(tmp_path):
    make_entry(tmp_path, "old", 1000, used_at=1_000_000)
    make_entry(tmp_path, "new", 1000, used_at=2_000_000)
    floor = shutil.disk_usage(tmp_path).free + 1500  # more free space than there is: evict what helps
    removed, _ = janitor.evict_once(str(tmp_path), budget=10**12, min_free=floor)
    assert removed == 2 and list(tmp_path.iterdir()) == []
