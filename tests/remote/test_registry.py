"""Digest pinning: tags refused with the fix; `resolve` against a registry-like HTTP server on loopback.

The lab registry (Debian's docker-registry on 127.0.0.1:5000) is exercised by tests/lab/test_resolve.py;
this server only stands in for the parts it cannot show: a token-auth challenge, a registry that omits
Docker-Content-Digest on HEAD, and one that answers a legacy digest when the Accept header is incomplete.
"""

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rigkit.cli import main as rigkit_main
from rigkit.errors import ConfigError, RigkitError
from rigkit.remote.registry import MANIFEST_ACCEPT, api_base, parse_reference, require_digest, resolve

MANIFEST = json.dumps(
    {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []}
).encode()
MANIFEST_DIGEST = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()
LEGACY_DIGEST = "sha256:" + "0" * 64
TOKEN = "t0ken"


class FakeRegistry(BaseHTTPRequestHandler):
    requests_seen: list = []

    def log_message(self, *args):
        pass

    def _reply(self, status, headers=None, body=b""):
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    def _manifest(self):
        self.requests_seen.append((self.command, self.path, dict(self.headers)))
        accept = self.headers.get("Accept", "")
        complete = all(kind.strip() in accept for kind in MANIFEST_ACCEPT.split(","))
        if self.path.startswith("/token"):
            return self._reply(200, {"Content-Type": "application/json"}, json.dumps({"token": TOKEN}).encode())
        if self.path == "/v2/rigkit/app/manifests/v1":
            return self._reply(200, {"Docker-Content-Digest": MANIFEST_DIGEST if complete else LEGACY_DIGEST}, MANIFEST)
        if self.path == "/v2/rigkit/nohead/manifests/v1":
            return self._reply(200, {}, MANIFEST)
        if self.path == "/v2/private/app/manifests/v1":
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                realm = f"http://127.0.0.1:{self.server.server_port}/token"
                return self._reply(
                    401,
                    {"WWW-Authenticate": f'Bearer realm="{realm}",service="test",scope="repository:private/app:pull"'},
                )
            return self._reply(200, {"Docker-Content-Digest": MANIFEST_DIGEST}, MANIFEST)
        return self._reply(404, {}, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')

    do_HEAD = do_GET = _manifest


@pytest.fixture
def registry():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeRegistry)
    FakeRegistry.requests_seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    "image", ["lmcache/vllm-openai:latest", "127.0.0.1:5000/rigkit/vllm-cpu-tiny:release-1", "ubuntu"]
)
def test_tag_refused_with_digest_form_and_resolve(image):
    with pytest.raises(ConfigError) as caught:
        require_digest(image, "serving_image")
    error = caught.value
    assert error.field == "serving_image"
    assert f"{parse_reference(image).name}@sha256:<64 hex>" in error.fix
    assert f"rigkit resolve {image}" in error.fix


def test_digest_accepted_and_malformed_refused():
    good = "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "a" * 64
    assert require_digest(good, "serving_image") == good
    for bad in ["x@sha256:abc", "x@sha256:" + "A" * 64, "x:tag@sha256:" + "a" * 64, ""]:
        with pytest.raises(ConfigError) as caught:
            require_digest(bad, "serving_image")
        assert caught.value.field == "serving_image"


def test_parse_reference():
    ref = parse_reference("127.0.0.1:5000/rigkit/vllm-cpu-tiny:release-1")
    assert (ref.registry, ref.repository, ref.tag) == ("127.0.0.1:5000", "rigkit/vllm-cpu-tiny", "release-1")
    assert parse_reference("ubuntu").repository == "library/ubuntu"
    hub = parse_reference("lmcache/vllm-openai@sha256:" + "b" * 64)
    assert (hub.registry, hub.repository, hub.tag) == ("docker.io", "lmcache/vllm-openai", None)
    assert parse_reference("localhost/app:1").registry == "localhost"


def test_api_base_http_only_on_loopback():
    assert api_base("127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert api_base("127.3.2.1") == "http://127.3.2.1"
    assert api_base("ghcr.io") == "https://ghcr.io"
    assert api_base("10.0.0.5:5000") == "https://10.0.0.5:5000"
    assert api_base("docker.io") == "https://registry-1.docker.io"


def test_resolve_asks_for_every_manifest_kind(registry):
    assert resolve(f"{registry}/rigkit/app:v1") == f"{registry}/rigkit/app@{MANIFEST_DIGEST}"
    method, path, headers = FakeRegistry.requests_seen[0]
    assert (method, path) == ("HEAD", "/v2/rigkit/app/manifests/v1")


def test_resolve_hashes_the_manifest_when_head_has_no_digest(registry):
    assert resolve(f"{registry}/rigkit/nohead:v1") == f"{registry}/rigkit/nohead@{MANIFEST_DIGEST}"


def test_resolve_follows_a_bearer_challenge(registry):
    assert resolve(f"{registry}/private/app:v1") == f"{registry}/private/app@{MANIFEST_DIGEST}"


def test_resolve_unknown_tag_names_the_image(registry):
    with pytest.raises(RigkitError, match="404") as caught:
        resolve(f"{registry}/rigkit/app:nope")
    assert caught.value.field == "image"


def test_resolve_unreachable_registry():
    with pytest.raises(RigkitError, match="registry request failed"):
        resolve("127.0.0.1:9/rigkit/app:v1", timeout=2)


def test_cli_prints_the_pinned_form(registry, capsys):
    assert rigkit_main(["resolve", f"{registry}/rigkit/app:v1"]) == 0
    assert capsys.readouterr().out.strip() == f"{registry}/rigkit/app@{MANIFEST_DIGEST}"
    assert rigkit_main(["resolve", f"{registry}/rigkit/app:nope"]) == 1


H = "a" * 64


@pytest.mark.parametrize("image", ["@sha256:" + H, "sha256:" + H])
def test_a_digest_without_a_repository_gets_a_fix_that_names_one(image):
    with pytest.raises(ConfigError) as caught:
        require_digest(image, "serving_image", repository_hint="lmcache/vllm-openai")
    assert caught.value.field == "serving_image" and "without a repository" in caught.value.problem
    assert caught.value.fix == f"put the repository before it: lmcache/vllm-openai@sha256:{H}"


def test_an_image_id_is_not_a_reference():
    with pytest.raises(ConfigError, match="image ID"):
        require_digest(H, "serving_image")


@pytest.mark.parametrize(
    "image, fixed",
    [
        ("Lmcache/vllm-openai@sha256:" + H, "lmcache/vllm-openai@sha256:" + H),
        ("ghcr.io/Org/App@sha256:" + H, "ghcr.io/org/app@sha256:" + H),
        ("UBUNTU@sha256:" + H, "ubuntu@sha256:" + H),
    ],
)
def test_uppercase_repository_refused_with_the_lowercase_form(image, fixed):
    with pytest.raises(ConfigError, match="lowercase") as caught:
        require_digest(image, "serving_image")
    assert fixed in caught.value.fix


@pytest.mark.parametrize(
    "image",
    [
        "a//b",
        "/a",
        "a/",
        "a b",
        "a_",
        "-a",
        "a..b",
        "a/b/",
        "caf\u00e9",
        "a:",
        "a:-x",
        "a:" + "t" * 129,
        "bad_host:5000/a",
        "a@sha256:" + H + "@sha256:" + H,
        "x" * 256,
    ],
)
def test_not_a_reference_docker_accepts(image):
    with pytest.raises(ConfigError) as caught:
        require_digest(image if "@" in image else image + "@sha256:" + H, "serving_image")
    assert caught.value.field == "serving_image"


@pytest.mark.parametrize(
    "image, registry, repository",
    [
        ("127.0.0.1:5000/rigkit/app", "127.0.0.1:5000", "rigkit/app"),
        ("[::1]:5000/app", "[::1]:5000", "app"),
        ("localhost/app", "localhost", "app"),
        ("GHCR.io/org/app", "GHCR.io", "org/app"),
        ("docker.io/ubuntu", "docker.io", "library/ubuntu"),
        ("index.docker.io/lmcache/x", "docker.io", "lmcache/x"),
        ("my_org/x--y__z.w", "docker.io", "my_org/x--y__z.w"),
        ("a/b/c/d", "docker.io", "a/b/c/d"),
    ],
)
def test_references_docker_accepts(image, registry, repository):
    pinned = f"{image}@sha256:{H}"
    assert require_digest(pinned, "serving_image") == pinned
    reference = parse_reference(pinned)
    assert (reference.registry, reference.repository, reference.digest) == (registry, repository, f"sha256:{H}")


def test_tag_and_digest_refused_the_digest_would_win():
    with pytest.raises(ConfigError, match="ignore the tag") as caught:
        require_digest(f"lmcache/vllm-openai:v1@sha256:{H}", "serving_image")
    assert caught.value.fix == f"drop the tag: lmcache/vllm-openai@sha256:{H}"


@pytest.mark.parametrize("digest", ["md5:" + "a" * 32, "sha512:" + "a" * 128, "sha256:" + "A" * 64, "sha256:abc"])
def test_only_sha256_digests_are_pinned(digest):
    with pytest.raises(ConfigError, match="malformed digest"):
        require_digest(f"lmcache/vllm-openai@{digest}", "serving_image")


# Why a registry did not give the rig its image (registry_failure). Each answer is the text docker, its CLI
# or containerd prints, as their sources word it (cited in rigkit/remote/registry.py); "no such manifest" is the
# lab's real answer for a digest its registry lacks (tests/lab/test_fleet_lab.py, digest-not-in-registry).

from rigkit.remote.registry import (
    AUTH,
    HUNG,
    NOT_SERVED,
    PROBE_TIMEOUT_MARK,
    RATE_LIMITED,
    TLS,
    UNKNOWN,  # noqa: E402
    UNREACHABLE,
    registry_failure,
)

LAB_IMAGE = "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "3f" * 32
# a digest whose hex holds "401", "403" and "404": hex digits are no HTTP status
TRICKY_DIGEST = "sha256:" + ("401403404" * 8)[:64]


@pytest.mark.parametrize(
    "answer, kind",
    [
        # docker's CLI (manifest inspect) against the lab registry stopped with SIGSTOP: its first endpoint is https
        (
            'failed to configure transport: error pinging v2 registry: Get "https://127.0.0.1:5000/v2/": '
            "net/http: TLS handshake timeout",
            HUNG,
        ),
        (
            'Error response from daemon: Get "http://127.0.0.1:5000/v2/": net/http: request canceled '
            "(Client.Timeout exceeded while awaiting headers)",
            HUNG,
        ),
        ('Error response from daemon: Get "https://reg.example.com/v2/": context deadline exceeded', HUNG),
        (f"{PROBE_TIMEOUT_MARK}: no answer within 60 s", HUNG),
        ('Get "https://127.0.0.1:5000/v2/": dial tcp 127.0.0.1:5000: connect: connection refused', UNREACHABLE),
        (
            'Error response from daemon: Get "https://reg.example.invalid/v2/": dial tcp: lookup reg.example.invalid on '
            "127.0.0.53:53: no such host",
            UNREACHABLE,
        ),
        (
            'Get "https://reg.example.invalid/v2/": dial tcp: lookup reg.example.invalid on 127.0.0.53:53: read udp '
            "127.0.0.1:40000->127.0.0.53:53: i/o timeout",
            UNREACHABLE,
        ),  # a DNS timeout: the name does not resolve
        ('Get "https://10.0.0.5/v2/": dial tcp 10.0.0.5:443: i/o timeout', UNREACHABLE),  # no answer to connect
        ('Get "https://10.0.0.5/v2/": dial tcp 10.0.0.5:443: connect: no route to host', UNREACHABLE),
        ("no such manifest: 127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64, NOT_SERVED),
        (f"no such manifest: r@{TRICKY_DIGEST}", NOT_SERVED),
        (
            f"Error response from daemon: manifest for 127.0.0.1:5000/x@{TRICKY_DIGEST} not found: manifest unknown: "
            "manifest unknown",
            NOT_SERVED,
        ),
        ("manifest unknown: manifest unknown", NOT_SERVED),
        ("name unknown: repository name not known to registry", NOT_SERVED),
        (
            f'failed to resolve reference "127.0.0.1:5000/x@{TRICKY_DIGEST}": 127.0.0.1:5000/x@{TRICKY_DIGEST}: not found',
            NOT_SERVED,
        ),
        ("unauthorized: authentication required", AUTH),
        (
            "Error response from daemon: pull access denied for private/x, repository does not exist or may require "
            "'docker login': denied: requested access to the resource is denied",
            AUTH,
        ),
        ("failed to authorize: no basic auth credentials", AUTH),
        (
            "unexpected status from HEAD request to https://reg.example.com/v2/x/manifests/"
            + TRICKY_DIGEST
            + ": 403 Forbidden",
            AUTH,
        ),
        ('Get "https://reg.example.com/v2/": x509: certificate signed by unknown authority', TLS),
        ('Get "https://reg.example.com/v2/": http: server gave HTTP response to HTTPS client', TLS),
        (
            "toomanyrequests: You have reached your pull rate limit. You may increase the limit by authenticating and "
            "upgrading: https://www.docker.com/increase-rate-limit",
            RATE_LIMITED,
        ),
        ("no answer", UNKNOWN),
    ],
)
def test_registry_failure_tells_which_way_the_registry_failed(answer, kind):
    assert registry_failure(answer, LAB_IMAGE).kind == kind


def test_a_hung_registry_is_not_told_to_check_the_digest():
    answer = (
        'failed to configure transport: error pinging v2 registry: Get "https://127.0.0.1:5000/v2/": '
        "net/http: TLS handshake timeout"
    )
    hung = registry_failure(answer, LAB_IMAGE)
    assert hung.problem.startswith("registry 127.0.0.1:5000 hung")
    assert "digest" not in hung.problem + hung.fix.replace("a digest the rig keeps", "")
    assert "nothing on the rig was stopped" in hung.fix
    missing = registry_failure("no such manifest: x", LAB_IMAGE)
    assert "check the digest" in missing.fix and "rigkit resolve 127.0.0.1:5000/rigkit/vllm-cpu-tiny:TAG" in missing.fix
    assert "unreachable" in registry_failure("connect: connection refused", LAB_IMAGE).problem
    assert (
        "docker login ghcr.io"
        in registry_failure("unauthorized: authentication required", "ghcr.io/org/x@sha256:" + "a" * 64).fix
    )


def test_without_an_image_the_registry_is_the_one_docker_names():
    failure = registry_failure(
        'Error response from daemon: Get "https://reg.example.com:5443/v2/": net/http: TLS handshake timeout'
    )
    assert failure.kind == HUNG and "registry reg.example.com:5443" in failure.problem
    assert "the image's registry" in registry_failure("manifest unknown: manifest unknown").problem


def fake_docker(tmp_path, script: str) -> dict:
    """PATH with a `docker` that runs ``script`` (sh), as the probe's shell finds it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f"#!/bin/sh\n{script}\n")
    (bin_dir / "docker").chmod(0o755)
    import os

    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.parametrize(
    "script, expected",
    [
        ("echo '{}'", None),
        (
            "echo 'no such manifest: 127.0.0.1:5000/x@sha256:ab' >&2; exit 1",
            "no such manifest: 127.0.0.1:5000/x@sha256:ab",
        ),
        ("exit 124", f"{PROBE_TIMEOUT_MARK}: no answer within 60 s"),  # what coreutils timeout exits with
    ],
)
def test_the_manifest_probe_shell_reports_the_answer_or_its_bound(tmp_path, script, expected):
    """The probe's command runs in this machine's sh, with a stand-in docker."""
    import subprocess

    from rigkit.facts.docker import ManifestProbe

    probe = ManifestProbe()
    output = subprocess.run(
        ["sh", "-c", probe.command(LAB_IMAGE)],
        env=fake_docker(tmp_path, script),
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert probe.process(output.splitlines()) == expected
    if expected and PROBE_TIMEOUT_MARK in expected:
        assert registry_failure(expected, LAB_IMAGE).kind == HUNG
