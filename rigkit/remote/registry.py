"""Digest pinning: refuse image tags, resolve a tag to its digest through the registry v2 API.

``rigkit resolve IMAGE:TAG`` prints ``IMAGE@sha256:...``: the form every profile and host data
must use (a tag is mutable: the same tag bundled a different vLLM a week later).

References are parsed with the distribution reference grammar (what docker accepts):
``[registry[:port]/]path[:tag][@sha256:<64 hex>]``, path components lowercase. ``repo:tag@sha256:...``
is refused: docker would pull the digest and ignore the tag, so the tag could only mislead whoever
reads the reference (the ledger, a profile); the fix is the same reference without the tag.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from rigkit.errors import ConfigError, RigkitError

if TYPE_CHECKING:  # requests loads only when the registry is asked (~35 ms of every deploy's start otherwise)
    import requests

DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
DIGEST_FORM = "sha256:<64 hex>"
# The distribution reference grammar (github.com/distribution/reference, regexp.go).
_ALPHA_NUMERIC = r"[a-z0-9]+"
_PATH_COMPONENT = re.compile(rf"{_ALPHA_NUMERIC}(?:(?:[._]|__|-+){_ALPHA_NUMERIC})*")
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?")
_TAG = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
_ANY_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
# What users paste instead of a reference: a digest alone, an image ID (docker images --no-trunc).
_BARE_DIGEST = re.compile(r"(?:sha256|sha384|sha512):[0-9a-fA-F]{32,}")
_IMAGE_ID = re.compile(r"[0-9a-f]{64}")
NAME_MAX_LENGTH = 255
DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
# Every manifest kind a multi-arch or single image may be stored as: the registry then returns the
# digest `docker pull` would use instead of converting to a legacy schema.
MANIFEST_ACCEPT = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
RESOLVE_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class ImageReference:
    name: str  # as written, without tag or digest: what `rigkit resolve` prints before "@"
    registry: str  # host[:port]; docker.io when the name has none
    repository: str  # path inside the registry (library/x for official Docker Hub images)
    tag: Optional[str]
    digest: Optional[str]


def _looks_like_registry(first: str) -> bool:
    """docker's rule: the first component names a registry when it has a '.' or ':', is localhost, or is not
    lowercase (a repository path never is)."""
    return "." in first or ":" in first or first == "localhost" or first.lower() != first


def parse_reference(image: str, field: str = "image", repository_hint: Optional[str] = None) -> ImageReference:
    """Split an image reference the way docker does (registry, repository, tag, digest); ConfigError naming
    ``field`` when it is not a reference docker would accept."""
    example = f"{repository_hint or 'REPO'}@{DIGEST_FORM}"
    if not isinstance(image, str) or not image.strip():
        raise ConfigError(field, image, "no image given", f"set it to an image by digest: {example}")
    rest, at, digest = image.partition("@")
    bare = digest if not rest else image if _BARE_DIGEST.fullmatch(image) else None
    if bare is not None:
        raise ConfigError(
            field,
            image,
            "a digest without a repository: docker cannot tell which image it is",
            f"put the repository before it: {repository_hint or 'REPO'}@{bare}",
        )
    if _IMAGE_ID.fullmatch(image):
        raise ConfigError(
            field,
            image,
            "an image ID, not a reference (docker refuses it as a repository name)",
            f"name the image by repository and digest: {example}",
        )
    tag = None
    colon = rest.rfind(":")
    if colon > rest.rfind("/"):
        rest, tag = rest[:colon], rest[colon + 1 :]
        if not _TAG.fullmatch(tag):
            raise ConfigError(
                field,
                image,
                f"malformed tag {tag!r} (letters, digits, '_', '.', '-'; at most 128)",
                f"pin it by digest: {rest}@{DIGEST_FORM}",
            )
    if at and not _ANY_DIGEST.fullmatch(digest):
        raise ConfigError(field, image, "malformed digest", f"use the form {rest}@{DIGEST_FORM}")
    first, _, remainder = rest.partition("/")
    if remainder and first.lower() != first and "." not in first and ":" not in first:
        raise ConfigError(
            field,
            image,
            f"repository names must be lowercase (docker would take {first!r} for a registry host)",
            f"write it as {image.replace(first, first.lower(), 1)}, or give the registry host its domain or port",
        )
    if remainder and _looks_like_registry(first):
        registry, repository = first, remainder
        if not _DOMAIN.fullmatch(registry):
            raise ConfigError(field, image, f"malformed registry {registry!r}", "write it as host[:port]")
    else:
        registry, repository = DOCKER_HUB, rest
    components = repository.split("/")
    if repository != repository.lower() and all(_PATH_COMPONENT.fullmatch(c.lower()) for c in components):
        fixed = image.replace(repository, repository.lower(), 1)
        raise ConfigError(
            field, image, "repository names must be lowercase (docker refuses this one)", f"write it as {fixed}"
        )
    if not all(_PATH_COMPONENT.fullmatch(component) for component in components):
        raise ConfigError(
            field,
            image,
            "not an image reference: each part of the repository is lowercase letters "
            "and digits, separated by '.', '_', '__' or dashes",
            f"use the form {example}, e.g. ghcr.io/org/name@sha256:...",
        )
    if len(rest) > NAME_MAX_LENGTH:
        raise ConfigError(
            field, image, f"the name is longer than {NAME_MAX_LENGTH} characters", "use a shorter repository name"
        )
    if registry in (DOCKER_HUB, "index.docker.io"):
        registry = DOCKER_HUB
        if "/" not in repository:
            repository = f"library/{repository}"
    return ImageReference(name=rest, registry=registry, repository=repository, tag=tag or None, digest=digest or None)


def digest_form(image: str) -> str:
    """What a pinned reference looks like for this image, for error messages."""
    return f"{parse_reference(image).name}@{DIGEST_FORM}"


def require_digest(image: str, field: str, repository_hint: Optional[str] = None) -> str:
    """Return ``image`` when it is pinned as ``repo@sha256:<64 hex>``; ConfigError naming ``field`` otherwise.

    ``repo:tag@sha256:...`` is refused (docker ignores the tag; see the module doc). ``repository_hint``
    (e.g. the profile's image_repo) completes the fix for a bare digest.
    """
    reference = parse_reference(image, field, repository_hint)
    if reference.digest is None:
        what = f"a tag ({reference.tag})" if reference.tag else "no digest (an implicit :latest tag)"
        raise ConfigError(
            field,
            image,
            f"image given by {what}; tags are mutable and never deployed",
            f"pin it as {reference.name}@{DIGEST_FORM}: run `rigkit resolve {image}`",
        )
    if not DIGEST_RE.fullmatch(reference.digest):
        raise ConfigError(
            field,
            image,
            "malformed digest (rigkit pins sha256 digests: 64 lowercase hex digits)",
            f"use the form {reference.name}@{DIGEST_FORM}",
        )
    if reference.tag:
        raise ConfigError(
            field,
            image,
            "both a tag and a digest: docker would ignore the tag",
            f"drop the tag: {reference.name}@{reference.digest}",
        )
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


def resolve(image_with_tag: str, timeout: float = RESOLVE_TIMEOUT_S, session: Optional[requests.Session] = None) -> str:
    """``repo:tag`` -> ``repo@sha256:...`` as the registry reports it (Docker-Content-Digest)."""
    reference = parse_reference(image_with_tag)
    if reference.digest:
        return require_digest(image_with_tag, "image")
    tag = reference.tag or "latest"
    url = f"{api_base(reference.registry)}/v2/{reference.repository}/manifests/{tag}"
    import requests

    from rigkit.remote.http_session import server_session

    session = session or server_session()
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


# Why a registry did not give the rig its image, from what docker/containerd print. The strings are theirs:
# Go's net and net/http ("connect: connection refused", "no such host", "dial tcp ...: i/o timeout",
# "net/http: TLS handshake timeout", "Client.Timeout exceeded while awaiting headers"); the registry API's
# error codes as errcode prints them, "<code>: <message>" (distribution registry/api/errcode/register.go:
# "manifest unknown: manifest unknown", "name unknown: repository name not known to registry",
# "unauthorized: authentication required", "denied: requested access to the resource is denied",
# "toomanyrequests: ..."); moby's pull errors (distribution/errors.go: "manifest for X not found",
# "pull access denied for X, repository does not exist or may require 'docker login'"); docker CLI's
# `manifest inspect` ("no such manifest: X" once every endpoint answered manifest unknown, name unknown or
# unauthorized: cli/registry/client/fetcher.go; "error pinging v2 registry: ..." when the first one fails);
# containerd's resolver ("failed to do request: ...", "pull access denied, repository does not exist or may
# require authorization", "unexpected status from HEAD request to ...: 401 Unauthorized", "...: not found").
UNREACHABLE, HUNG, NOT_SERVED, AUTH, TLS, RATE_LIMITED, UNKNOWN = (
    "unreachable",
    "hung",
    "not served",
    "auth",
    "tls",
    "rate limited",
    "unknown",
)
# What the registry probe prints when rigkit's own bound on it ran out (rigkit.facts.docker.ManifestProbe).
PROBE_TIMEOUT_MARK = "rigkit-probe-timeout"

# (kind, what in the answer says so: regular expressions on its lowercased text), first match wins. A DNS
# lookup that timed out is a name that does not resolve and a dial that timed out a host that does not answer
# (unreachable); a timeout once the connection opened (TLS handshake, awaiting headers) is a registry that
# accepts and never answers (hung: a stopped process, overload, a proxy holding it). An HTTP status is a
# number standing alone: the hex of a digest holds "401" too.
_HTTP_STATUS = r"(?<![\w.:/])({})(?![\w.])"
_FAILURE_SIGNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (UNREACHABLE, ("no such host", "server misbehaving", "temporary failure in name resolution")),
    (HUNG, ("tls handshake timeout", "awaiting (response )?headers", PROBE_TIMEOUT_MARK)),
    (
        UNREACHABLE,
        (
            "connection refused",
            "no route to host",
            "network is unreachable",
            "host is unreachable",
            "connection reset by peer",
            "dial tcp",
        ),
    ),
    (HUNG, ("i/o timeout", "context deadline exceeded", "timeout", "timed out")),
    (RATE_LIMITED, ("toomanyrequests", "too many requests", "rate limit", _HTTP_STATUS.format("429"))),
    (
        AUTH,
        (
            "unauthorized",
            "authentication required",
            "denied",
            "no basic auth credentials",
            "insufficient_scope",
            "forbidden",
            "incorrect username or password",
            _HTTP_STATUS.format("401|403"),
        ),
    ),
    (TLS, ("x509:", "certificate", "server gave http response to https client", "tls:")),
    (
        NOT_SERVED,
        (
            "manifest unknown",
            "no such manifest",
            "name unknown",
            "not found",
            "does not exist",
            _HTTP_STATUS.format("404"),
        ),
    ),
)


@dataclass(frozen=True)
class RegistryFailure:
    kind: str  # UNREACHABLE, HUNG, NOT_SERVED, AUTH, TLS, RATE_LIMITED or UNKNOWN
    problem: str  # what happened, in an operator's words (the registry's own answer follows it)
    fix: str


def registry_failure(answer: str, image: Optional[str] = None) -> RegistryFailure:
    """Which of the ways a registry fails ``answer`` (what `docker pull` or `docker manifest inspect` printed
    for ``image``, repo@sha256:...) shows, worded with its fix. Without ``image`` the registry is the one
    the answer's URL names. Pure."""
    text = " ".join(answer.lower().split())
    kind = next((kind for kind, signs in _FAILURE_SIGNS if any(re.search(sign, text) for sign in signs)), UNKNOWN)
    url = re.search(r"https?://([^/\s\"']+)", answer)
    registry, name = (url.group(1) if url else None), None
    if image:
        try:
            reference = parse_reference(image)
            registry, name = reference.registry, reference.name
        except ConfigError:  # the image was checked before any host was touched; this only words a message
            pass
    the_registry = f"registry {registry}" if registry else "the image's registry"
    host = registry or "the registry"
    resolve = f"`rigkit resolve {name}:TAG`" if name else "`rigkit resolve REPO:TAG`"
    keep = "nothing on the rig was stopped: deploy again once it answers, or roll back to a digest the rig keeps"
    words = {
        UNREACHABLE: (
            f"{the_registry} unreachable from the rig: nothing answers (connection refused, no route, "
            "or a name that does not resolve)",
            f"start the registry, or fix the rig's route or DNS to {host}; {keep}",
        ),
        HUNG: (
            f"{the_registry} hung: it accepts connections but does not answer (timed out; a stopped or "
            "overloaded registry, or a proxy holding the connection)",
            f"check that {host} is running and responsive (its process, disk and load); {keep}",
        ),
        NOT_SERVED: (
            f"{the_registry} answered that it does not serve this digest",
            f"check the digest ({resolve} prints the current one) and that the image was pushed to {host}; "
            "a private repository answers the same to a rig without credentials (docker login on the rig)",
        ),
        AUTH: (
            f"{the_registry} refused the rig's credentials (unauthorized or access denied)",
            f"docker login {registry or ''} on the rig with an account that may pull the image (Docker Hub "
            "also says this of a repository that does not exist)".replace("  ", " "),
        ),
        TLS: (
            f"no TLS with {the_registry}: certificate not trusted, or http where https is expected",
            f"give the rig the registry's CA (/etc/docker/certs.d/{host}/ca.crt), or list {host} in "
            "insecure-registries (docker_daemon_options)",
        ),
        RATE_LIMITED: (
            f"{the_registry} refused the pull: rate limit reached",
            f"wait for the limit to reset, docker login on the rig, or pull through a mirror; {keep}",
        ),
        UNKNOWN: (
            f"{the_registry} did not give the rig the image",
            f"read docker's answer; check the digest and that {host} is reachable from the rig",
        ),
    }
    problem, fix = words[kind]
    return RegistryFailure(kind, problem, fix)


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
