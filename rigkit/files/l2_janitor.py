#!/usr/bin/env python3
"""Runs ON the rig: keeps a KV store directory under its byte budget and its filesystem above a
free-space floor, whatever filled the filesystem (the store itself or another process), by deleting
the store's least recently used entries (its top-level entries) first.

Usage: l2_janitor.py STORE_DIR BUDGET_BYTES MIN_FREE_BYTES [INTERVAL_S [STATUS_FILE]]

It only ever deletes top-level entries of STORE_DIR (never lost+found, never across a mount point,
never a symlink's target), and refuses to work at all when STORE_DIR is itself a mount point or /,
where other files live. Each round it writes STATUS_FILE (JSON: state, numbers, evictions since start)
for validation to read; every eviction is logged with what went and why, and a floor it cannot restore
(the store is empty: something else fills the disk) is logged at error priority (journald reads the
"<3>" prefix) when it starts, every REMINDER_S while it lasts, and when it ends.

The serving role uploads this file alone and runs it under systemd as L2_JANITOR_UNIT; the deploy
and validation import it (rigkit.files.l2_janitor) for what they share with it: the unit, its
arguments' values, the status file and its states, each declared once, here. Standard library
only: nothing else of rigkit is on the rig.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

# Shared with the deploy (the unit runs this file with these values) and with validation (the status file).
L2_JANITOR_UNIT = "rigkit-l2-janitor.service"
STATUS_FILE = "/run/rigkit-l2-janitor.json"
# The store's disk never fills: a failed KV write kills the engine.
L2_JANITOR_MIN_FREE_BYTES = 256 * 2**20
L2_JANITOR_INTERVAL_S = 2

# An entry written this recently may still be written layer by layer by the connector: a half-deleted
# entry would be found by a later lookup and fail its load (which kills the engine).
ENTRY_GRACE_S = 5.0
REMINDER_S = 300.0
# Entries are renamed to this prefix before deletion: a lookup never sees a half-deleted entry.
EVICTING_PREFIX = ".rigkit-evicting-"
NOT_STORE_ENTRIES = frozenset({"lost+found"})
LOGGED_NAMES = 5

STATE_OK = "ok"
STATE_OVER_BUDGET = "over-budget"  # only entries too young to evict are left over the budget
STATE_BELOW_FLOOR = "below-floor"  # nothing left to evict and the filesystem is still under the floor
STATE_REFUSED = "refused"  # the store is a mount point or /: its entries cannot be told from others
STATE_NO_STORE = "no-store"
LOUD_STATES = (STATE_BELOW_FLOOR, STATE_REFUSED)


@dataclass
class Entry:
    name: str
    last_use: float
    last_write: float
    size: int


@dataclass
class Round:
    """One pass over the store: what went, why, and the state it left."""

    state: str
    message: str
    mount: str
    fs_size_bytes: int
    fs_free_bytes: int
    store_bytes: int
    entries: int
    evicted: list[tuple[str, int]] = field(default_factory=list)
    reason: str = ""


def mount_point(path: str) -> str:
    path = os.path.realpath(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def refusal(store: str) -> Optional[str]:
    """Why this store cannot be janitored safely, or None."""
    real = os.path.realpath(store)
    if real == "/" or os.path.ismount(real):
        return (f"{store} is a mount point: its entries cannot be told from other files there; "
                f"set l2_path to a directory of its own on that disk")
    return None


def entry_usage(path: str) -> Optional[Entry]:
    """(last use, last write, bytes) of one store entry: a file, or a directory of files; None when it is
    not the store's to delete (a mount point inside the store) or vanished."""
    try:
        stat = os.lstat(path)
    except FileNotFoundError:
        return None
    name = os.path.basename(path)
    if not os.path.isdir(path) or os.path.islink(path):
        return Entry(name, max(stat.st_atime, stat.st_mtime), stat.st_mtime, stat.st_size)
    if os.path.ismount(path):
        return None
    last_use, last_write, total = stat.st_mtime, stat.st_mtime, 0
    for root, _, files in os.walk(path):
        for file_name in files:
            try:
                file_stat = os.lstat(os.path.join(root, file_name))
            except FileNotFoundError:
                continue
            last_use = max(last_use, file_stat.st_atime, file_stat.st_mtime)
            last_write = max(last_write, file_stat.st_mtime)
            total += file_stat.st_size
    return Entry(name, last_use, last_write, total)


def remove(store: str, name: str) -> None:
    path = os.path.join(store, name)
    if os.path.isdir(path) and not os.path.islink(path):
        doomed = os.path.join(store, EVICTING_PREFIX + name)
        try:
            os.rename(path, doomed)
        except FileNotFoundError:
            return
        shutil.rmtree(doomed, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def store_entries(store: str) -> list[Entry]:
    entries = []
    for name in os.listdir(store):
        if name in NOT_STORE_ENTRIES:
            continue
        if name.startswith(EVICTING_PREFIX):  # left by a janitor stopped mid-delete
            shutil.rmtree(os.path.join(store, name), ignore_errors=True)
            continue
        entry = entry_usage(os.path.join(store, name))
        if entry is not None:
            entries.append(entry)
    return entries


def fmt_bytes(value: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(value) < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def evict_once(store: str, budget: int, min_free: int, now: Optional[float] = None,
               grace_s: float = ENTRY_GRACE_S) -> Round:
    """One pass: delete the least recently used entries (older than grace_s) until the store is within
    its budget and the filesystem has min_free bytes free, then report the state it left."""
    mount = mount_point(store)
    if not os.path.isdir(store):
        usage = shutil.disk_usage(mount)
        return Round(STATE_NO_STORE, f"{store} does not exist", mount, usage.total, usage.free, 0, 0)
    refused = refusal(store)
    if refused:
        usage = shutil.disk_usage(store)
        return Round(STATE_REFUSED, refused, mount, usage.total, usage.free, 0, 0)
    now = time.time() if now is None else now
    entries = sorted(store_entries(store), key=lambda e: e.last_use)
    used = sum(e.size for e in entries)
    free = shutil.disk_usage(store).free
    reasons = []
    if used > budget:
        reasons.append(f"store {fmt_bytes(used)} over its budget {fmt_bytes(budget)}")
    if free < min_free:
        reasons.append(f"free {fmt_bytes(free)} below the floor {fmt_bytes(min_free)} on {mount}")
    evicted = []
    for entry in entries:
        if used <= budget and free >= min_free:
            break
        if now - entry.last_write < grace_s:
            continue
        remove(store, entry.name)
        evicted.append((entry.name, entry.size))
        used, free = used - entry.size, free + entry.size
    usage = shutil.disk_usage(store)  # measured again: deleted files still open elsewhere free nothing
    left = len(entries) - len(evicted)
    state, message = STATE_OK, f"store {fmt_bytes(used)} of budget {fmt_bytes(budget)}, {mount} {fmt_bytes(usage.free)} free"
    if usage.free < min_free:
        state = STATE_BELOW_FLOOR
        store_left = (f"only {left} entries ({fmt_bytes(used)}) written in the last {grace_s:g} s are left" if left
                      else "the store is empty")
        message = (f"{mount} has {fmt_bytes(usage.free)} free, below the floor {fmt_bytes(min_free)}, and "
                   f"{store_left}: something else fills {mount}; free space on {mount} or lower l2_budget_gb")
    elif used > budget:
        state = STATE_OVER_BUDGET
        message = (f"store {fmt_bytes(used)} over its budget {fmt_bytes(budget)}: {left} entries left, all written "
                   f"in the last {grace_s:g} s")
    return Round(state, message, mount, usage.total, usage.free, used, left, evicted, "; ".join(reasons))


def eviction_line(store: str, round_: Round) -> str:
    names = [name for name, _ in round_.evicted]
    shown = ", ".join(names[:LOGGED_NAMES]) + (f" (+{len(names) - LOGGED_NAMES} more)" if len(names) > LOGGED_NAMES
                                               else "")
    freed = sum(size for _, size in round_.evicted)
    return f"evicted {len(names)} entries ({fmt_bytes(freed)}) from {store} because {round_.reason}: {shown}"


@dataclass
class Status:
    """What the status file holds: the last round and the evictions since the janitor started."""

    store: str
    budget_bytes: int
    min_free_bytes: int
    started_at: float
    state: str = STATE_OK
    message: str = ""
    mount: str = ""
    fs_size_bytes: int = 0
    fs_free_bytes: int = 0
    store_bytes: int = 0
    entries: int = 0
    evicted_entries: int = 0
    evicted_bytes: int = 0
    last_eviction: Optional[dict] = None
    updated_at: float = 0.0

    def record(self, round_: Round, now: float) -> None:
        for name in ("state", "message", "mount", "fs_size_bytes", "fs_free_bytes", "store_bytes", "entries"):
            setattr(self, name, getattr(round_, name))
        if round_.evicted:
            freed = sum(size for _, size in round_.evicted)
            self.evicted_entries += len(round_.evicted)
            self.evicted_bytes += freed
            self.last_eviction = {"at": now, "entries": len(round_.evicted), "bytes": freed, "reason": round_.reason}
        self.updated_at = now


def write_status(path: str, status: Status) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "w") as out:
        json.dump(asdict(status), out)
    os.replace(temporary, path)


def log(line: str, priority: int = 6) -> None:
    print(f"<{priority}>{line}", flush=True)


def main(store: str, budget: int, min_free: int, interval_s: float, status_file: str) -> int:
    status = Status(store, budget, min_free, started_at=time.time())
    log(f"janitor for {store}: budget {fmt_bytes(budget)}, free-space floor {fmt_bytes(min_free)}, "
        f"every {interval_s:g} s, status in {status_file}")
    last_loud = 0.0
    while True:
        now = time.time()
        try:
            round_ = evict_once(store, budget, min_free, now=now)
        except OSError as exc:  # one bad round (a store being replaced, a transient I/O error) is not fatal
            log(f"round failed: {exc}", 4)
        else:
            if round_.evicted:
                log(eviction_line(store, round_), 5)
            if round_.state in LOUD_STATES and (round_.state != status.state or now - last_loud >= REMINDER_S):
                log(f"L2 {round_.state.upper()}: {round_.message}", 3)
                last_loud = now
            elif status.state in LOUD_STATES and round_.state not in LOUD_STATES:
                log(f"L2 {status.state} is over: {round_.message}", 5)
            status.record(round_, now)
            try:
                write_status(status_file, status)
            except OSError as exc:
                log(f"cannot write {status_file}: {exc}", 4)
        time.sleep(interval_s)


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(args[0], int(args[1]), int(args[2]), float(args[3]) if len(args) > 3 else L2_JANITOR_INTERVAL_S,
                  args[4] if len(args) > 4 else STATUS_FILE))
