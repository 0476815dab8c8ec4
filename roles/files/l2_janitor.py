#!/usr/bin/env python3
"""Runs ON the rig: keeps a KV store directory under its byte budget and its disk above a free-space
floor, deleting the least recently used entries (top-level entries of the store) first.

Usage: l2_janitor.py STORE_DIR BUDGET_BYTES MIN_FREE_BYTES [INTERVAL_S]
Standard library only. Prints one line per eviction round (journald keeps them).
"""

import os
import shutil
import sys
import time


def entry_usage(path: str) -> tuple[float, int]:
    """(last use, bytes) of one store entry: a file, or a directory of files."""
    if os.path.isfile(path):
        stat = os.stat(path)
        return max(stat.st_atime, stat.st_mtime), stat.st_size
    last, total = 0.0, 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                stat = os.stat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            last, total = max(last, stat.st_atime, stat.st_mtime), total + stat.st_size
    return last, total


def remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def evict_once(store: str, budget: int, min_free: int) -> tuple[int, int]:
    """One pass: returns (entries removed, bytes freed)."""
    entries = []
    for name in os.listdir(store):
        path = os.path.join(store, name)
        last, size = entry_usage(path)
        entries.append((last, size, path))
    entries.sort()
    used = sum(size for _, size, _ in entries)
    free = shutil.disk_usage(store).free
    removed = freed = 0
    for _, size, path in entries:
        if used <= budget and free >= min_free:
            break
        remove(path)
        used, free, removed, freed = used - size, free + size, removed + 1, freed + size
    return removed, freed


def main(store: str, budget: int, min_free: int, interval_s: float) -> int:
    while True:
        if os.path.isdir(store):
            removed, freed = evict_once(store, budget, min_free)
            if removed:
                print(f"evicted {removed} entries ({freed} bytes) from {store}", flush=True)
        time.sleep(interval_s)


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(args[0], int(args[1]), int(args[2]), float(args[3]) if len(args) > 3 else 2.0))
