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
from rigkit.registry import MANIFEST_ACCEPT, api_base, parse_reference, require_digest, resolve

MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                       "manifests": []}).encode()
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
                return self._reply(401, {"WWW-Authenticate":
                                         f'Bearer realm="{realm}",service="test",scope="repository:private/app:pull"'})
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


@pytest.mark.parametrize("image", ["lmcache/vllm-openai:latest", "127.0.0.1:5000/rigkit/vllm-cpu-tiny:release-1",
                                   "ubuntu"])
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


@pytest.mark.parametrize("image, fixed", [("Lmcache/vllm-openai@sha256:" + H, "lmcache/vllm-openai@sha256:" + H),
                                          ("ghcr.io/Org/App@sha256:" + H, "ghcr.io/org/app@sha256:" + H),
                                          ("UBUNTU@sha256:" + H, "ubuntu@sha256:" + H)])
def test_uppercase_repository_refused_with_the_lowercase_form(image, fixed):
    with pytest.raises(ConfigError, match="lowercase") as caught:
        require_digest(image, "serving_image")
    assert fixed in caught.value.fix


@pytest.mark.parametrize("image", ["a//b", "/a", "a/", "a b", "a_", "-a", "a..b", "a/b/", "caf\u00e9", "a:", "a:-x",
                                   "a:" + "t" * 129, "bad_host:5000/a", "a@sha256:" + H + "@sha256:" + H,
                                   "x" * 256])
def test_not_a_reference_docker_accepts(image):
    with pytest.raises(ConfigError) as caught:
        require_digest(image if "@" in image else image + "@sha256:" + H, "serving_image")
    assert caught.value.field == "serving_image"


@pytest.mark.parametrize("image, registry, repository", [
    ("127.0.0.1:5000/rigkit/app", "127.0.0.1:5000", "rigkit/app"), ("[::1]:5000/app", "[::1]:5000", "app"),
    ("localhost/app", "localhost", "app"), ("GHCR.io/org/app", "GHCR.io", "org/app"),
    ("docker.io/ubuntu", "docker.io", "library/ubuntu"), ("index.docker.io/lmcache/x", "docker.io", "lmcache/x"),
    ("my_org/x--y__z.w", "docker.io", "my_org/x--y__z.w"), ("a/b/c/d", "docker.io", "a/b/c/d")])
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
