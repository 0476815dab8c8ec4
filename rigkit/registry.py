"""Digest pinning: refuse image tags, resolve a tag to its digest through the registry v2 API.

``rigkit resolve IMAGE:TAG`` prints ``IMAGE@sha256:...``: the form every profile and host data
must use (a tag is mutable: the same tag bundled a different vLLM a week later).
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import re
import sys
from dataclasses import dataclass
from typing import Optional

import requests

from rigkit.errors import ConfigError, RigkitError

DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
# Every manifest kind a multi-arch or single image may be stored as: the registry then returns the
# digest `docker pull` would use instead of converting to a legacy schema.
MANIFEST_ACCEPT = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])
RESOLVE_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class ImageReference:
    name: str  # as written, without tag or digest: what `rigkit resolve` prints before "@"
    registry: str  # host[:port]; docker.io when the name has none
    repository: str  # path inside the registry (library/x for official Docker Hub images)
    tag: Optional[str]
    digest: Optional[str]


def parse_reference(image: str) -> ImageReference:
    """Split an image reference the way docker does (registry, repository, tag, digest)."""
    rest, _, digest = image.partition("@")
    last_slash = rest.rfind("/")
    colon = rest.rfind(":")
    tag = None
    if colon > last_slash:
        rest, tag = rest[:colon], rest[colon + 1:]
    first, _, remainder = rest.partition("/")
    if remainder and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, remainder
    else:
        registry, repository = DOCKER_HUB, rest
        if "/" not in repository:
            repository = f"library/{repository}"
    return ImageReference(name=rest, registry=registry, repository=repository, tag=tag or None,
                          digest=digest or None)


def digest_form(image: str) -> str:
    """What a pinned reference looks like for this image, for error messages."""
    return f"{parse_reference(image).name}@sha256:<64 hex>"


def require_digest(image: str, field: str) -> str:
    """Return ``image`` when it is pinned as ``repo@sha256:<64 hex>``; ConfigError naming ``field`` otherwise."""
    if not isinstance(image, str) or not image.strip():
        raise ConfigError(field, image, "no image given", "set it to an image by digest: repo@sha256:<64 hex>")
    reference = parse_reference(image)
    if reference.digest is None:
        what = f"a tag ({reference.tag})" if reference.tag else "no digest (an implicit :latest tag)"
        raise ConfigError(field, image, f"image given by {what}; tags are mutable and never deployed",
                          f"pin it as {digest_form(image)}: run `rigkit resolve {image}`")
    if not DIGEST_RE.fullmatch(reference.digest):
        raise ConfigError(field, image, "malformed digest", f"use the form {digest_form(image)}")
    if reference.tag:
        raise ConfigError(field, image, "both a tag and a digest: the tag would be ignored",
                          f"drop the tag: {reference.name}@{reference.digest}")
    return image


def api_base(registry: str) -> str:
    """http for loopback registries (implicitly insecure for docker too), https for every other."""
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    host = host.strip("[]")
    if registry == DOCKER_HUB:
        return f"https://{DOCKER_HUB_API}"
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    return f"{'http' if loopback else 'https'}://{registry}"


def _bearer_token(session: requests.Session, challenge: str, timeout: float) -> Optional[str]:
    """Anonymous token for a `WWW-Authenticate: Bearer realm=...,service=...,scope=...` challenge."""
    if not challenge.lower().startswith("bearer "):
        return None
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", None)
    if not realm:
        return None
    reply = session.get(realm, params=params, timeout=timeout)
    reply.raise_for_status()
    body = reply.json()
    return body.get("token") or body.get("access_token")


def resolve(image_with_tag: str, timeout: float = RESOLVE_TIMEOUT_S,
            session: Optional[requests.Session] = None) -> str:
    """``repo:tag`` -> ``repo@sha256:...`` as the registry reports it (Docker-Content-Digest)."""
    reference = parse_reference(image_with_tag)
    if reference.digest:
        return require_digest(image_with_tag, "image")
    tag = reference.tag or "latest"
    url = f"{api_base(reference.registry)}/v2/{reference.repository}/manifests/{tag}"
    session = session or requests.Session()
    headers = {"Accept": MANIFEST_ACCEPT}
    fix = f"check the name and tag, and that {reference.registry} is reachable"
    try:
        reply = session.head(url, headers=headers, timeout=timeout)
        if reply.status_code == 401:
            token = _bearer_token(session, reply.headers.get("WWW-Authenticate", ""), timeout)
            if token:
                headers["Authorization"] = f"Bearer {token}"
                reply = session.head(url, headers=headers, timeout=timeout)
        digest = reply.headers.get("Docker-Content-Digest")
        if reply.ok and not digest:
            # Some registries omit the header on HEAD: the digest is the sha256 of the manifest bytes.
            body = session.get(url, headers=headers, timeout=timeout)
            body.raise_for_status()
            digest = body.headers.get("Docker-Content-Digest") or "sha256:" + hashlib.sha256(body.content).hexdigest()
    except requests.RequestException as exc:
        raise RigkitError("image", image_with_tag, f"registry request failed ({exc})", fix) from None
    if reply.status_code == 404:
        raise RigkitError("image", image_with_tag, f"{url} answered 404 (no such repository or tag)", fix)
    if not reply.ok:
        raise RigkitError("image", image_with_tag, f"{url} answered HTTP {reply.status_code}", fix)
    if not DIGEST_RE.fullmatch(digest or ""):
        raise RigkitError("image", image_with_tag, f"registry returned a malformed digest {digest!r}", fix)
    return f"{reference.name}@{digest}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("images", nargs="+", metavar="IMAGE:TAG", help="image reference(s) to pin")
    parser.add_argument("--timeout", type=float, default=RESOLVE_TIMEOUT_S, help="seconds per request")


def run(args: argparse.Namespace) -> int:
    status = 0
    for image in args.images:
        try:
            print(resolve(image, timeout=args.timeout))
        except RigkitError as exc:
            print(f"rigkit resolve: {exc}", file=sys.stderr)
            status = 1
    return status
