"""A hub model at a commit, fetched once onto the controller with the real huggingface_hub client, every file
verified before anything is staged from it.

The hub lists each file of a commit (``model_info(files_metadata=True)``): an LFS file with its sha256, any
other with its git blob id. ``hf_hub_download`` fetches into the controller's hub cache (a dropped
connection is resumed by the client with a Range request: huggingface_hub 2.4 file_download.http_get);
rigkit then hashes each file against the listing. A file that does not match is deleted and fetched once
more, and refused if it still does not: a corrupt file is never staged. The verified manifest (size, sha256,
and the cached file's mtime, so a re-run reads nothing twice) is kept next to the cache. The hub token is
used here only; the container never gets it (rigkit.serving.render).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import httpx2
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id

from rigkit.errors import ConfigError, RigkitError
from rigkit.settings.model_source import COMMIT_RE, HASH_CHUNK, HUB, ModelSource, check_relative_file, manifest_hash

logger = logging.getLogger("rigkit.model")
FIELD = "model_source"
# What asking the hub raises when it does not answer as a hub: an HTTP status (HfHubHTTPError), or no answer at
# all (huggingface_hub 2.4 talks through httpx2, whose connect and read errors are not OSErrors).
HUB_FAILURES = (HfHubHTTPError, OSError, httpx2.HTTPError)


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    sha256: Optional[str]  # listed by the hub for an LFS file
    blob_id: Optional[str]  # git blob sha1 of any other


@dataclass(frozen=True)
class LocalCopy:
    """A verified revision on the controller: its files under ``root`` and their manifest."""

    root: Path
    files: dict[str, dict]

    @property
    def hash(self) -> str:
        return manifest_hash(self.files)


def _api(endpoint: Optional[str], token: Optional[str]) -> HfApi:
    return HfApi(endpoint=endpoint, token=token or False)


def _hub_error(exc: Exception, spec: str, what: str) -> RigkitError:
    if isinstance(exc, RevisionNotFoundError):
        return RigkitError(
            FIELD,
            spec,
            f"the hub has no revision {what}",
            "check the commit: `rigkit resolve-model ORG/NAME@BRANCH` prints the commit a branch or tag points at",
        )
    if isinstance(exc, GatedRepoError):
        return RigkitError(
            FIELD,
            spec,
            "a gated repository: the hub refused without an accepted token",
            "accept the model's terms on the hub and export RIGKIT_HF_TOKEN on the controller",
        )
    if isinstance(exc, RepositoryNotFoundError):
        return RigkitError(
            FIELD,
            spec,
            "the hub has no such repository (or it is private)",
            "check the repository id; a private one needs RIGKIT_HF_TOKEN on the controller",
        )
    return RigkitError(
        FIELD,
        spec,
        f"the hub did not answer ({type(exc).__name__}: {exc})",
        "check the controller's network and HF_ENDPOINT, then run again (finished files are kept)",
    )


def check_repo_id(repo: str, spec: str) -> None:
    """ConfigError, before the hub is asked, for a repository id huggingface_hub's own validator refuses (a space,
    a ';', '..'): the client would raise it as a traceback."""
    try:
        validate_repo_id(repo)
    except HFValidationError as exc:
        raise ConfigError(
            FIELD, spec, f"not a hub repository id ({exc})", "write it as org/name, as the hub's page shows it"
        ) from None


def resolve_revision(
    repo: str, revision: str = "main", endpoint: Optional[str] = None, token: Optional[str] = None
) -> str:
    """The commit a branch or tag points at now: what `rigkit resolve-model` prints."""
    check_repo_id(repo, f"{repo}@{revision}")
    try:
        info = _api(endpoint, token).model_info(repo, revision=revision)
    except HUB_FAILURES as exc:
        raise _hub_error(exc, f"{repo}@{revision}", revision) from None
    if not COMMIT_RE.fullmatch(info.sha or ""):
        raise RigkitError(
            FIELD,
            f"{repo}@{revision}",
            f"the hub answered no commit ({info.sha!r})",
            "check HF_ENDPOINT points at a hub",
        )
    return info.sha


def hub_listing(source: ModelSource, endpoint: Optional[str] = None, token: Optional[str] = None) -> list[HubFile]:
    """Every file of the commit with what the hub says it hashes to."""
    check_repo_id(source.name, source.spec)
    try:
        info = _api(endpoint, token).model_info(source.name, revision=source.revision, files_metadata=True)
    except HUB_FAILURES as exc:
        raise _hub_error(exc, source.spec, source.revision) from None
    if info.sha and info.sha != source.revision:
        raise RigkitError(
            FIELD,
            source.spec,
            f"the hub answered commit {info.sha} for it",
            "pin the full 40-hex commit (`rigkit resolve-model` prints it)",
        )
    files = []
    for sibling in info.siblings or []:
        lfs = sibling.lfs
        files.append(
            HubFile(
                check_relative_file(sibling.rfilename, FIELD),
                int(lfs.size if lfs else sibling.size or 0),
                lfs.sha256 if lfs else None,
                sibling.blob_id,
            )
        )
    if not files:
        raise RigkitError(FIELD, source.spec, "the hub lists no files at this commit", "check the commit")
    return files


def _hashes(path: Path) -> tuple[str, str]:
    """(sha256, git blob sha1) of a file, read once."""
    size = path.stat().st_size
    sha, blob = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            sha.update(chunk)
            blob.update(chunk)
    return sha.hexdigest(), blob.hexdigest()


def _mismatch(listed: HubFile, path: Path) -> Optional[str]:
    sha, blob = _hashes(path)
    size = path.stat().st_size
    if size != listed.size and listed.sha256:
        return f"{size} bytes, the hub lists {listed.size}"
    if listed.sha256 and sha != listed.sha256:
        return f"sha256 {sha[:12]}…, the hub lists {listed.sha256[:12]}…"
    if not listed.sha256 and listed.blob_id and blob != listed.blob_id:
        return f"git blob {blob[:12]}…, the hub lists {listed.blob_id[:12]}…"
    return None


def _discard(path: Path) -> None:
    """A cached file that failed its hash: the blob and the snapshot's link to it."""
    target = path.resolve()
    path.unlink(missing_ok=True)
    target.unlink(missing_ok=True)


def manifest_cache_path(cache_dir: Path, source: ModelSource) -> Path:
    return cache_dir / "rigkit-manifests" / f"{source.slug}@{source.revision}.json"


def fetch_to_controller(
    source: ModelSource,
    cache_dir: Path,
    endpoint: Optional[str] = None,
    token: Optional[str] = None,
    progress: Callable[[str], None] = logger.warning,
) -> LocalCopy:
    """Every file of the hub commit in the controller's cache, each verified; the revision's LocalCopy."""
    assert source.kind == HUB
    listing = hub_listing(source, endpoint, token)
    recorded_path = manifest_cache_path(cache_dir, source)
    try:
        recorded = json.loads(recorded_path.read_text())["files"]
    except (OSError, ValueError, KeyError):
        recorded = {}
    files: dict[str, dict] = {}
    root: Optional[Path] = None
    total = sum(item.size for item in listing)
    done = 0
    for item in listing:
        path = None
        for attempt in (1, 2):
            try:
                path = Path(
                    hf_hub_download(
                        source.name,
                        item.path,
                        revision=source.revision,
                        cache_dir=cache_dir,
                        endpoint=endpoint,
                        token=token or False,
                        force_download=attempt > 1,
                    )
                )
            except HUB_FAILURES as exc:
                raise _hub_error(exc, source.spec, source.revision) from None
            known = recorded.get(item.path)
            stat = path.stat()
            if (
                known
                and known["size"] == stat.st_size
                and known["mtime_ns"] == stat.st_mtime_ns
                and (known["sha256"] == item.sha256 or not item.sha256)
            ):
                break
            problem = _mismatch(item, path)
            if problem is None:
                break
            logger.warning(
                f"model {source.spec}: {item.path} fetched from the hub is corrupt ({problem}): "
                f"{'fetching it again' if attempt == 1 else 'refused'}"
            )
            _discard(path)
            if attempt == 2:
                raise RigkitError(
                    FIELD,
                    source.spec,
                    f"{item.path} from the hub does not match its listing twice ({problem})",
                    "check HF_ENDPOINT (a proxy rewriting files?) and run again",
                )
        stat = path.stat()
        known = recorded.get(item.path)
        unchanged = known and known["size"] == stat.st_size and known["mtime_ns"] == stat.st_mtime_ns
        sha = known["sha256"] if unchanged else (item.sha256 or _hashes(path)[0])
        files[item.path] = {"size": stat.st_size, "sha256": sha, "mtime_ns": stat.st_mtime_ns}
        root = Path(str(path)[: -len(item.path)]) if root is None else root
        done += item.size
        progress(f"model {source.name}: {item.path} verified ({done / 1e6:,.0f} of {total / 1e6:,.0f} MB)")
    recorded_path.parent.mkdir(parents=True, exist_ok=True)
    recorded_path.write_text(json.dumps({"files": files}, indent=1, sort_keys=True) + "\n")
    assert root is not None
    return LocalCopy(root, {path: {"size": entry["size"], "sha256": entry["sha256"]} for path, entry in files.items()})


def default_cache_dir() -> Path:
    """The controller's hub cache for rigkit (its own, so the user's HF cache is not shared with rigs' pins)."""
    return Path(os.environ.get("RIGKIT_MODEL_CACHE") or Path.home() / ".cache" / "rigkit" / "models")
