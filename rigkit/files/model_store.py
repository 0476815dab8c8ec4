#!/usr/bin/env python3
"""The model store on a rig (put there by rigkit, run with the rig's python3; standard library only).

    model_store.py state   STORE SLUG REVISION          JSON: verified stamp, partial files, free bytes, damage
    model_store.py receive STORE SLUG REVISION          stdin: frames (a JSON header line, then its bytes)
    model_store.py send    STORE SLUG REVISION PLAN     stdout: frames of the verified revision (PLAN: JSON)
    model_store.py finish  STORE SLUG REVISION          stdin: the manifest; verify, stamp, rename
    model_store.py check   STORE SLUG REVISION [deep]   JSON: files differing from the stamp
    model_store.py reopen  STORE SLUG REVISION          a damaged revision back to partial, its bad files gone
    model_store.py remove  STORE SLUG REVISION          retention: the revision and its stamp
    model_store.py list    STORE SLUG                   JSON: verified revisions
    model_store.py hash-dir STORE SLUG REVISION DIR     JSON: every file of DIR (a shared mount) with its sha256
    model_store.py stamp-shared STORE SLUG REVISION DIR stdin: the manifest the controller matched to the pin

A revision is received into SLUG/.partial-REVISION (kept across runs: a second run resumes each file at
its size), verified file by file against the manifest's sha256 (a bad file is deleted, never kept), then
stamped and renamed to SLUG/REVISION: a partial copy is never at the path compose mounts. receive and
finish hold SLUG/.lock (flock): a second staging of the same model on this rig is refused, not interleaved.
A model on a shared mount is not copied: its files are hashed where they are (hash-dir; a file whose size and
mtime match the stamp of an earlier run is not read again) and, once the controller matched them to the pin,
the stamp names the directory (stamp-shared); check and state read that directory instead of SLUG/REVISION.
"""

import fcntl
import hashlib
import json
import os
import shutil
import sys
import time

PARTIAL_PREFIX = ".partial-"
MANIFEST_FILE_NAME = ".rigkit-manifest.json"  # rigkit.settings.model_source's, left out of a directory's files as there
STAMP_SUFFIX = ".verified.json"
CHUNK = 1 << 20
BUSY_EXIT = 75
PROGRESS_EVERY_S = 1.0


def paths(store, slug, revision):
    model = os.path.join(store, slug)
    return (model, os.path.join(model, revision), os.path.join(model, PARTIAL_PREFIX + revision),
            os.path.join(model, revision + STAMP_SUFFIX))


def inside(root, relative):
    full = os.path.normpath(os.path.join(root, relative))
    if relative.startswith("/") or not full.startswith(root.rstrip("/") + "/"):
        raise SystemExit(f"model_store: {relative!r} leaves the model directory")
    return full


def lock(model_dir):
    os.makedirs(model_dir, exist_ok=True)
    handle = open(os.path.join(model_dir, ".lock"), "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"model_store: another staging of {model_dir} is running on this rig", file=sys.stderr)
        raise SystemExit(BUSY_EXIT)
    return handle


def mount_of(path):
    """The mount point holding ``path`` (or where it would be made): a store staged before its disk is mounted
    would be hidden under the mount."""
    while not os.path.exists(path):
        path = os.path.dirname(path) or "/"
    path = os.path.realpath(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def free_bytes(path):
    while not os.path.exists(path):
        path = os.path.dirname(path) or "/"
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def sizes(root):
    found = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            full = os.path.join(dirpath, name)
            found[os.path.relpath(full, root)] = os.path.getsize(full)
    return found


def read_stamp(stamp):
    try:
        with open(stamp) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(8 * CHUNK)
            if not chunk:
                return digest.hexdigest()
            digest.update(chunk)


def damage(final, stamp_doc, deep=False):
    """Files of a verified revision that no longer match its stamp: missing, resized, rewritten (mtime), or,
    with ``deep``, whose bytes no longer hash to the manifest."""
    damaged = []
    for relative, entry in sorted(stamp_doc["files"].items()):
        full = os.path.join(final, relative)
        try:
            stat = os.stat(full)
        except OSError:
            damaged.append({"path": relative, "why": "missing"})
            continue
        if stat.st_size != entry["size"]:
            damaged.append({"path": relative, "why": f"size {stat.st_size}, manifest {entry['size']}"})
        elif (stat.st_mtime_ns != entry["mtime_ns"] or deep) and sha256(full) != entry["sha256"]:
            damaged.append({"path": relative, "why": "sha256 differs from the manifest"})
    return damaged


def stamped_dir(final, stamp):
    """The verified directory and its stamp: the store's revision, or the shared directory the stamp names."""
    stamp_doc = read_stamp(stamp)
    if stamp_doc and stamp_doc.get("directory"):
        return stamp_doc["directory"], stamp_doc
    return final, (stamp_doc if os.path.isdir(final) else None)


def state(store, slug, revision):
    _, final, partial, stamp = paths(store, slug, revision)
    final, stamp_doc = stamped_dir(final, stamp)
    report = {"verified": stamp_doc["manifest"] if stamp_doc else None,
              "partial": sizes(partial) if os.path.isdir(partial) else {},
              "free": free_bytes(os.path.join(store, slug)),
              "store_mount": mount_of(store)}
    if stamp_doc:
        report["damaged"] = damage(final, stamp_doc)
    return report


class Progress:
    def __init__(self, total):
        self.total, self.done, self.shown = total, 0, 0.0

    def add(self, count):
        self.done += count
        now = time.monotonic()
        if now - self.shown >= PROGRESS_EVERY_S or self.done >= self.total:
            self.shown = now
            print(f"progress {self.done} {self.total}", file=sys.stderr, flush=True)


def receive(store, slug, revision):
    model, _, partial, _ = paths(store, slug, revision)
    held = lock(model)
    os.makedirs(partial, exist_ok=True)
    stream = sys.stdin.buffer
    total = int(stream.readline().decode() or 0)  # the first line: bytes to come in all (progress)
    progress = Progress(total)
    while True:
        line = stream.readline()
        if not line.strip():
            break
        header = json.loads(line)
        target = inside(partial, header["path"])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "ab") as handle:
            handle.truncate(header["offset"])
            handle.seek(header["offset"])
            left = header["size"]
            while left:
                chunk = stream.read(min(CHUNK, left))
                if not chunk:
                    raise SystemExit(f"model_store: the stream ended inside {header['path']}")
                handle.write(chunk)
                left -= len(chunk)
                progress.add(len(chunk))
    held.close()
    print(json.dumps({"received": progress.done}))


def send(store, slug, revision, plan_text):
    _, final, _, _ = paths(store, slug, revision)
    plan = json.loads(plan_text)
    out = sys.stdout.buffer
    out.write(f"{sum(item['size'] - item['offset'] for item in plan)}\n".encode())
    for item in plan:
        length = item["size"] - item["offset"]
        out.write((json.dumps({"path": item["path"], "offset": item["offset"], "size": length}) + "\n").encode())
        with open(inside(final, item["path"]), "rb") as handle:
            handle.seek(item["offset"])
            left = length
            while left:
                chunk = handle.read(min(CHUNK, left))
                if not chunk:
                    raise SystemExit(f"model_store: {item['path']} is shorter than its manifest")
                out.write(chunk)
                left -= len(chunk)
    out.write(b"\n")
    out.flush()


def finish(store, slug, revision):
    model, final, partial, stamp = paths(store, slug, revision)
    held = lock(model)
    manifest = json.load(sys.stdin)
    files = manifest["files"]
    present = sizes(partial) if os.path.isdir(partial) else {}
    for extra in set(present) - set(files):
        os.remove(inside(partial, extra))
    missing, bad, stamped = [], [], {}
    for relative, entry in sorted(files.items()):
        full = inside(partial, relative)
        if present.get(relative) != entry["size"]:
            missing.append(relative)
            continue
        if sha256(full) != entry["sha256"]:
            os.remove(full)  # never kept: fetched again
            bad.append(relative)
            continue
        os.chmod(full, 0o444)
        stamped[relative] = {**entry, "mtime_ns": os.stat(full).st_mtime_ns}
    if missing or bad:
        held.close()
        print(json.dumps({"ok": False, "missing": missing, "bad": bad}))
        return
    document = {"source": manifest.get("source"), "revision": revision, "manifest": manifest["hash"],
                "files": stamped, "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if os.path.isdir(final):
        shutil.rmtree(final)
    os.rename(partial, final)
    with open(stamp + ".tmp", "w") as handle:
        json.dump(document, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(stamp + ".tmp", stamp)
    held.close()
    print(json.dumps({"ok": True}))


def check(store, slug, revision, deep=False):
    _, final, _, stamp = paths(store, slug, revision)
    final, stamp_doc = stamped_dir(final, stamp)
    if stamp_doc is None:
        print(json.dumps({"staged": False, "damaged": []}))
        return
    if not os.path.isdir(final):
        damaged = [{"path": final, "why": "the shared directory is not there (the share not mounted?)"}]
    else:
        damaged = damage(final, stamp_doc, deep)
    print(json.dumps({"staged": True, "manifest": stamp_doc["manifest"], "damaged": damaged}))


def directory_files(root):
    """As rigkit.settings.model_source.directory_files: every regular file, dot-directories and the manifest left out."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(name for name in dirnames if not name.startswith("."))
        for name in filenames:
            full = os.path.join(dirpath, name)
            relative = os.path.relpath(full, root)
            if relative != MANIFEST_FILE_NAME and os.path.isfile(full):
                found.append(relative)
    return sorted(found)


def hash_dir(store, slug, revision, directory):
    _, _, _, stamp = paths(store, slug, revision)
    if not os.path.isdir(directory):
        print(json.dumps({"exists": False, "files": {}}))
        return
    known = read_stamp(stamp) or {}
    known_files = known.get("files", {}) if known.get("directory") == directory else {}
    names = directory_files(directory)
    progress = Progress(sum(os.path.getsize(os.path.join(directory, name)) for name in names))
    files = {}
    for relative in names:
        full = os.path.join(directory, relative)
        stat = os.stat(full)
        entry = known_files.get(relative)
        if entry and entry["size"] == stat.st_size and entry["mtime_ns"] == stat.st_mtime_ns:
            sha = entry["sha256"]
        else:
            sha = sha256(full)
        progress.add(stat.st_size)
        files[relative] = {"size": stat.st_size, "sha256": sha, "mtime_ns": stat.st_mtime_ns}
    print(json.dumps({"exists": True, "files": files}))


def stamp_shared(store, slug, revision, directory):
    model, _, _, stamp = paths(store, slug, revision)
    held = lock(model)
    manifest = json.load(sys.stdin)
    document = {"source": manifest.get("source"), "revision": revision, "manifest": manifest["hash"],
                "directory": directory, "files": manifest["files"],
                "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with open(stamp + ".tmp", "w") as handle:
        json.dump(document, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(stamp + ".tmp", stamp)
    held.close()
    print(json.dumps({"ok": True}))


def reopen(store, slug, revision):
    model, final, partial, stamp = paths(store, slug, revision)
    held = lock(model)
    stamp_doc = read_stamp(stamp)
    damaged = damage(final, stamp_doc) if stamp_doc and os.path.isdir(final) else []
    if os.path.exists(stamp):
        os.remove(stamp)
    if os.path.isdir(final):
        if os.path.isdir(partial):
            shutil.rmtree(partial)
        os.rename(final, partial)
    for item in damaged:
        full = inside(partial, item["path"])
        if os.path.exists(full):
            os.remove(full)
    held.close()
    print(json.dumps({"reopened": [item["path"] for item in damaged]}))


def remove(store, slug, revision):
    model, final, partial, stamp = paths(store, slug, revision)
    held = lock(model)
    for path in (stamp,):
        if os.path.exists(path):
            os.remove(path)
    for path in (final, partial):
        if os.path.isdir(path):
            shutil.rmtree(path)
    held.close()
    print(json.dumps({"removed": revision}))


def list_revisions(store, slug, *_):
    model = os.path.join(store, slug)
    names = os.listdir(model) if os.path.isdir(model) else []
    print(json.dumps(sorted(name[:-len(STAMP_SUFFIX)] for name in names if name.endswith(STAMP_SUFFIX))))


def main(argv):
    command, args = argv[1], argv[2:]
    if command == "state":
        print(json.dumps(state(*args)))
    elif command == "receive":
        receive(*args)
    elif command == "send":
        send(*args)
    elif command == "finish":
        finish(*args)
    elif command == "check":
        check(args[0], args[1], args[2], deep=len(args) > 3 and args[3] == "deep")
    elif command == "reopen":
        reopen(*args)
    elif command == "remove":
        remove(*args)
    elif command == "list":
        list_revisions(*args)
    elif command == "hash-dir":
        hash_dir(*args)
    elif command == "stamp-shared":
        stamp_shared(*args)
    else:
        raise SystemExit(f"model_store: unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv)
