"""Model weights as a pinned artifact, like the image: a source and a revision, a manifest of sha256 per file.

A model is declared by ``model_source`` (a serving knob), always with a revision that cannot move:
- ``org/name@<40-hex commit>``: a hub repository at a commit (a branch or tag moves: refused with the
  `rigkit resolve-model` command that prints its commit, as `rigkit resolve` does for image tags);
- ``controller:/abs/dir@<manifest sha256>``: a directory on the controller, pinned by the hash of the
  manifest rigkit writes for it (`rigkit resolve-model controller:/abs/dir` writes it and prints the pin);
- ``shared:/abs/dir@<manifest sha256>``: a directory at that path on every rig (an NFS export the rigs
  already mount), pinned the same way. It is never copied: each rig hashes the files where they are
  against the pin (once; later only size and mtime are compared, as for a staged revision), records a
  stamp in its store, and the container mounts the shared directory itself read-only. Copying it would
  put a second copy of what the share already serves to every rig on each NVMe; the engine reads the
  weights once at start (page cache after), so reading them over the share costs a slower start only.

The manifest lists every file with its size and sha256 (the hub lists an LFS file's sha256; rigkit hashes
the others once on the controller); its hash names a directory revision and is recorded in the ledger.
On a rig the revision lives in the model store (``model_store_path``) as ``<store>/<slug>/<revision>``,
next to a stamp ``<revision>.verified.json`` written only after every file matched the manifest, and is
bind-mounted read-only at MODEL_CONTAINER_PATH. Pure: no I/O except reading a local directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional

from rigkit.errors import ConfigError
from rigkit.paths import absolute_path_problem, bind_source_problem

HUB, CONTROLLER, SHARED = "hub", "controller", "shared"
SOURCE_KINDS = (HUB, CONTROLLER, SHARED)
CONTROLLER_PREFIX = "controller:"
SHARED_PREFIX = "shared:"
DIRECTORY_PREFIXES = {CONTROLLER: CONTROLLER_PREFIX, SHARED: SHARED_PREFIX}
# the fixed path the engine loads from in every container (the served name stays the declared one)
MODEL_CONTAINER_PATH = "/model"
# what the container gets instead of a hub token: the hub is never asked from a rig
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
MANIFEST_HASH_RE = re.compile(r"[0-9a-f]{64}")
# the hub's repository id rule (huggingface_hub.utils._validators.REPO_ID_REGEX): namespace/name, at most 96
REPO_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
MANIFEST_SCHEMA = 1
MANIFEST_FILE_NAME = ".rigkit-manifest.json"  # written into a controller directory source
STAMP_SUFFIX = ".verified.json"
PARTIAL_PREFIX = ".partial-"
HASH_CHUNK = 8 << 20


@dataclass(frozen=True)
class ModelSource:
    kind: str  # HUB | CONTROLLER | SHARED
    name: str  # the hub repository id, or the directory (absolute: on the controller, or on every rig)
    revision: str  # the hub commit, or the directory's manifest hash

    @property
    def spec(self) -> str:
        """How model_source declares it (the ledger's and card's model field)."""
        return f"{DIRECTORY_PREFIXES.get(self.kind, '')}{self.name}@{self.revision}"

    @property
    def slug(self) -> str:
        """The store directory of every revision of this model: org--name, or the directory's name."""
        if self.kind == HUB:
            return self.name.replace("/", "--")
        return re.sub(r"[^A-Za-z0-9._-]", "_", posixpath.basename(self.name.rstrip("/"))) or "model"

    @property
    def default_served_name(self) -> str:
        """What vLLM served before the model was staged (the hub id), or the directory's name."""
        return self.name if self.kind == HUB else posixpath.basename(self.name.rstrip("/"))


def parse_model_source(value: object, field: str = "model_source") -> ModelSource:
    """A model_source value as a ModelSource; ConfigError naming ``field``, the value and the fix otherwise."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            field,
            value,
            "no model source given",
            "set it to org/name@<40-hex commit>, controller:/dir@<manifest sha256> or shared:/dir@<manifest sha256>",
        )
    for kind, prefix in DIRECTORY_PREFIXES.items():
        if value.startswith(prefix):
            return _parse_directory(value, field, kind)
    if value.startswith("/") or value.startswith("."):
        raise ConfigError(
            field,
            value,
            "a path without saying where the directory is",
            f"write {CONTROLLER_PREFIX}{value} for a directory on the controller (staged onto every rig) or "
            f"{SHARED_PREFIX}{value} for one every rig already mounts (a share: not copied), then pin it: "
            f"run `rigkit resolve-model {CONTROLLER_PREFIX}{value}`",
        )
    repo, at, revision = value.partition("@")
    problem = hub_repo_problem(repo)
    if problem:
        raise ConfigError(field, value, problem, "write it as org/name@<40-hex commit>")
    if not at or not revision:
        raise ConfigError(
            field,
            value,
            "a hub repository without a revision: the hub serves whatever its main branch holds that day",
            f"pin a commit: run `rigkit resolve-model {repo}` and use what it prints ({repo}@<40-hex commit>)",
        )
    if not COMMIT_RE.fullmatch(revision):
        what = (
            "a commit given in capitals"
            if COMMIT_RE.fullmatch(revision.lower())
            else f"revision {revision!r} is a branch, a tag or a short commit: it can move or be ambiguous"
        )
        raise ConfigError(
            field,
            value,
            what,
            f"pin the full commit: run `rigkit resolve-model {repo}@{revision}` "
            f"and use what it prints ({repo}@<40-hex commit>)",
        )
    return ModelSource(HUB, repo, revision)


def check_directory(value: str, kind: str, path: str, field: str = "model_source") -> None:
    """ConfigError naming ``value`` when ``path`` (its directory) cannot be a ``kind`` source: what a deploy refuses,
    and `rigkit resolve-model` before it pins anything."""
    prefix = DIRECTORY_PREFIXES[kind]
    fix = f"write {prefix}/absolute/dir@<manifest sha256>, a directory of its own outside the system's"
    problem = directory_problem(kind, path.rstrip("/"))
    if problem:
        raise ConfigError(field, value, f"the directory {problem}", fix)


def hub_repo_problem(repo: str) -> Optional[str]:
    """Why ``repo`` is not a hub repository id as model_source takes it (namespace/name, the hub's characters), or
    None."""
    if not REPO_ID_RE.fullmatch(repo) or ".." in repo or "--" in repo:
        return "not a hub repository id (namespace/name: letters, digits, '-', '_', '.')"
    if any(part.endswith((".", "-")) for part in repo.split("/")) or repo.endswith(".git"):
        return "not a hub repository id (a part ends with '.' or '-', or it ends with .git)"
    return None


def directory_problem(kind: str, path: str) -> Optional[str]:
    """Why ``path`` cannot be a ``kind`` directory source, or None: a shared one is a host directory bind-mounted into
    the container (the same rule as l2_path and model_store_path); a controller one is read there only, but its
    name must still read as written (no invisible character, normalised)."""
    return bind_source_problem(path) if kind == SHARED else absolute_path_problem(path)


def _parse_directory(value: str, field: str, kind: str = CONTROLLER) -> ModelSource:
    prefix = DIRECTORY_PREFIXES[kind]
    rest = value[len(prefix) :]
    path, at, revision = rest.rpartition("@") if "@" in rest else (rest, "", "")
    check_directory(value, kind, path, field)
    if not at:
        raise ConfigError(
            field,
            value,
            "a directory without its manifest hash: its files could change unseen",
            f"pin it: run `rigkit resolve-model {value}` (writes the manifest, prints the pin)",
        )
    if not MANIFEST_HASH_RE.fullmatch(revision):
        raise ConfigError(
            field,
            value,
            f"{revision!r} is not a manifest hash (64 lowercase hex digits)",
            f"run `rigkit resolve-model {prefix}{path}` and use what it prints",
        )
    return ModelSource(kind, path.rstrip("/"), revision)


# A manifest: relative path -> {"size": bytes, "sha256": hex}. Its hash is over that mapping only.
Manifest = Mapping[str, Mapping[str, object]]


def manifest_hash(files: Manifest) -> str:
    canonical = json.dumps(
        {
            "schema": MANIFEST_SCHEMA,
            "files": {
                path: {"size": int(entry["size"]), "sha256": entry["sha256"]} for path, entry in sorted(files.items())
            },
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def manifest_size(files: Manifest) -> int:
    return sum(int(entry["size"]) for entry in files.values())


def check_relative_file(path: str, field: str = "manifest") -> str:
    """A manifest path stays inside the model directory (a hub listing or manifest is input, not trusted)."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(part in ("", ".", "..") for part in parts) or "\0" in path:
        raise ConfigError(field, path, "a file path leaving the model directory", "fix the manifest")
    return path


def file_sha256(path: Path, progress: Optional[Callable[[int], None]] = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
            if progress:
                progress(len(chunk))
    return digest.hexdigest()


def directory_files(root: Path) -> list[str]:
    """Every regular file under ``root`` (relative, sorted), rigkit's own manifest and dot-directories left out."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(name for name in dirnames if not name.startswith("."))
        for name in filenames:
            relative = os.path.relpath(os.path.join(dirpath, name), root)
            if relative != MANIFEST_FILE_NAME and os.path.isfile(os.path.join(dirpath, name)):
                found.append(relative.replace(os.sep, "/"))
    return sorted(found)


def directory_manifest(
    root: Path, previous: Optional[Mapping] = None, progress: Optional[Callable[[str, int], None]] = None
) -> dict[str, dict]:
    """sha256 of every file of a directory; a file whose size and mtime match ``previous`` (the manifest
    written before, with its mtime_ns) is not read again."""
    previous_files = (previous or {}).get("files", {})
    files = {}
    for relative in directory_files(root):
        stat = (root / relative).stat()
        known = previous_files.get(relative)
        if known and known.get("size") == stat.st_size and known.get("mtime_ns") == stat.st_mtime_ns:
            sha = known["sha256"]
        else:
            sha = file_sha256(root / relative, (lambda n, r=relative: progress(r, n)) if progress else None)
        files[relative] = {"size": stat.st_size, "sha256": sha, "mtime_ns": stat.st_mtime_ns}
    return files


def resolve_directory(path: str, field: str = "model_source") -> ModelSource:
    """Pin a controller directory: hash its files (reusing the manifest written before for unchanged ones),
    write MANIFEST_FILE_NAME into it, return the source with its manifest hash."""
    root = Path(path)
    if not root.is_dir():
        raise ConfigError(
            field,
            f"{CONTROLLER_PREFIX}{path}",
            "no such directory on the controller",
            "give the directory holding the model's config.json and weights",
        )
    manifest_path = root / MANIFEST_FILE_NAME
    try:
        previous = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        previous = None
    files = directory_manifest(root, previous)
    if not files:
        raise ConfigError(
            field,
            f"{CONTROLLER_PREFIX}{path}",
            "the directory holds no files",
            "give the directory holding the model's config.json and weights",
        )
    document = {"schema": MANIFEST_SCHEMA, "files": files, "hash": manifest_hash(files)}
    if previous != document:
        temporary = manifest_path.with_name(MANIFEST_FILE_NAME + ".tmp")
        temporary.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
        os.replace(temporary, manifest_path)
    return ModelSource(CONTROLLER, str(root.resolve()), document["hash"])


def changed_files(pinned: Manifest, found: Manifest) -> list[str]:
    """Each file that differs between the pinned manifest and the directory, with how: changed, added or removed."""
    lines = []
    for path in sorted(set(pinned) | set(found)):
        if path not in found:
            lines.append(f"{path} removed")
        elif path not in pinned:
            lines.append(f"{path} added")
        elif pinned[path]["sha256"] != found[path]["sha256"] or int(pinned[path]["size"]) != int(found[path]["size"]):
            lines.append(f"{path} changed")
    return lines


def read_directory_manifest(source: ModelSource, field: str = "model_source") -> dict[str, dict]:
    """The pinned directory's manifest, refused when the directory's files no longer hash to the pin."""
    root = Path(source.name)
    if not root.is_dir():
        raise ConfigError(
            field, source.spec, "no such directory on the controller", "restore the directory, or pin another source"
        )
    try:
        previous = json.loads((root / MANIFEST_FILE_NAME).read_text())
    except (OSError, ValueError):
        previous = None
    files = directory_manifest(root, previous)
    found = manifest_hash(files)
    if found != source.revision:
        pinned = (previous or {}).get("files", {}) if (previous or {}).get("hash") == source.revision else {}
        changed = changed_files(pinned, files) if pinned else []
        named = f" ({', '.join(changed[:5])}{', …' if len(changed) > 5 else ''})" if changed else ""
        raise ConfigError(
            field,
            source.spec,
            f"the directory's files hash to {found[:12]}…, not the pinned "
            f"{source.revision[:12]}…: they changed since it was pinned{named}",
            f"restore {'them' if len(changed) > 1 else 'it' if changed else 'them'}, or pin what it holds now: "
            f"run `rigkit resolve-model {CONTROLLER_PREFIX}{source.name}`",
        )
    return {path: {"size": entry["size"], "sha256": entry["sha256"]} for path, entry in files.items()}


# ---- the store on a rig: paths and retention ----


def store_model_dir(store: str, source: ModelSource) -> str:
    return posixpath.join(store, source.slug)


def store_revision_dir(store: str, source: ModelSource) -> str:
    """Where a verified revision lives on the rig (what compose mounts read-only)."""
    return posixpath.join(store, source.slug, source.revision)


def store_partial_dir(store: str, source: ModelSource) -> str:
    """Where a revision is staged until every file is verified (then renamed to store_revision_dir)."""
    return posixpath.join(store, source.slug, PARTIAL_PREFIX + source.revision)


def store_stamp(store: str, source: ModelSource) -> str:
    return posixpath.join(store, source.slug, source.revision + STAMP_SUFFIX)


def mounted_dir(store: str, source: ModelSource) -> str:
    """The rig directory the container mounts read-only: the shared directory itself (never copied), else the
    verified revision in the store."""
    return source.name if source.kind == SHARED else store_revision_dir(store, source)


def revisions_to_remove(
    staged: Iterable[str], newest_first: Iterable[str], needed: Iterable[str], keep: int
) -> list[str]:
    """Staged revisions of one model retention removes: all but the ``keep`` most recently deployed, never
    one a recorded release still needs (``needed``: the ledger's current, last known-good, rollback target
    and kept renderings) and never one staged but not yet deployed (``newest_first`` lacks it: it may be the
    release about to happen)."""
    order = list(dict.fromkeys(newest_first))
    kept = set(order[:keep]) | set(needed)
    return [revision for revision in staged if revision in order and revision not in kept]


def source_record(source: ModelSource, files_hash: str) -> dict[str, str]:
    """What the ledger, the stored rendering and the card carry about the model."""
    return {"source": source.name, "kind": source.kind, "revision": source.revision, "manifest": files_hash}
