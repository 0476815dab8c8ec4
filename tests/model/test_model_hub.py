"""The hub path with the real huggingface_hub client against a stand-in hub on loopback (tests/hub_standin.py):
a commit fetched and verified, a wrong sha256 fetched again then refused, a dropped connection resumed, a
revision the hub does not have refused, a branch resolved to its commit."""

import hashlib
import os

import pytest

from rigkit.errors import RigkitError
from rigkit.model.hub import fetch_to_controller, resolve_revision
from rigkit.settings.model_source import ModelSource, manifest_hash, parse_model_source
from tests.hub_standin import HubRepo, HubStandIn

COMMIT = "a" * 40
WEIGHTS = os.urandom(24 << 20)
FILES = {"config.json": b'{"model_type": "qwen3"}\n', "model.safetensors": WEIGHTS, "sub/tokenizer.json": b"{}"}


@pytest.fixture
def hub():
    with HubStandIn([HubRepo("org/tiny", COMMIT, dict(FILES), lfs={"model.safetensors"})]) as stand_in:
        yield stand_in


@pytest.fixture(autouse=True)
def _no_user_token(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)


def source() -> ModelSource:
    return parse_model_source(f"org/tiny@{COMMIT}")


def test_fetch_verifies_every_file_and_a_second_fetch_reads_nothing(hub, tmp_path):
    copy = fetch_to_controller(source(), tmp_path / "cache", endpoint=hub.endpoint, progress=lambda line: None)
    assert set(copy.files) == set(FILES)
    for path, data in FILES.items():
        assert (copy.root / path).read_bytes() == data
        assert copy.files[path] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert hub.served_bytes == sum(map(len, FILES.values()))
    again = fetch_to_controller(source(), tmp_path / "cache", endpoint=hub.endpoint, progress=lambda line: None)
    assert again.hash == copy.hash == manifest_hash(copy.files)
    assert hub.served_bytes == sum(map(len, FILES.values()))  # nothing fetched twice


def test_a_file_with_a_wrong_sha256_is_fetched_again_then_refused(hub, tmp_path):
    hub.corrupt["model.safetensors"] = bytes(len(WEIGHTS))  # same size, other bytes, every time
    with pytest.raises(RigkitError) as refused:
        fetch_to_controller(source(), tmp_path / "cache", endpoint=hub.endpoint, progress=lambda line: None)
    assert refused.value.field == "model_source"
    assert "model.safetensors from the hub does not match its listing twice" in str(refused.value)
    blobs = list((tmp_path / "cache").rglob("*"))
    assert not [path for path in blobs if path.is_file() and path.read_bytes() == bytes(len(WEIGHTS))]


def test_a_file_corrupt_once_is_fetched_again_and_served_verified(hub, tmp_path, caplog):
    hub.corrupt["model.safetensors"] = bytes(len(WEIGHTS))
    original = hub._answer

    def heal_after_first(handler, body):
        original(handler, body)
        if body and "model.safetensors" in handler.path:
            hub.corrupt.clear()

    hub._answer = heal_after_first
    copy = fetch_to_controller(source(), tmp_path / "cache", endpoint=hub.endpoint, progress=lambda line: None)
    assert (copy.root / "model.safetensors").read_bytes() == WEIGHTS
    assert "is corrupt" in caplog.text


def test_a_dropped_connection_mid_file_resumes_with_a_range_request(hub, tmp_path):
    # huggingface_hub 2.4 writes what it read in DOWNLOAD_CHUNK_SIZE (10 MiB) pieces: a drop after 15 MiB
    # resumes at 10 MiB (file_download.http_get); a drop inside the first piece starts the file again
    hub.drop_after["model.safetensors"] = 15 << 20
    copy = fetch_to_controller(source(), tmp_path / "cache", endpoint=hub.endpoint, progress=lambda line: None)
    assert (copy.root / "model.safetensors").read_bytes() == WEIGHTS
    assert hub.range_requests == ["model.safetensors"]
    assert hub.served_bytes == sum(map(len, FILES.values())) + (5 << 20)  # only the unwritten 5 MiB twice


def test_a_revision_the_hub_does_not_have_is_refused(hub, tmp_path):
    with pytest.raises(RigkitError) as refused:
        fetch_to_controller(parse_model_source("org/tiny@" + "b" * 40), tmp_path / "cache", endpoint=hub.endpoint)
    assert "the hub has no revision " + "b" * 40 in str(refused.value)
    assert "rigkit resolve-model" in refused.value.fix


def test_a_repository_the_hub_does_not_have_is_refused(hub, tmp_path):
    with pytest.raises(RigkitError, match="no such repository"):
        fetch_to_controller(parse_model_source("org/other@" + COMMIT), tmp_path / "cache", endpoint=hub.endpoint)


def test_a_branch_resolves_to_its_commit(hub):
    hub.branches["main"] = COMMIT
    assert resolve_revision("org/tiny", "main", endpoint=hub.endpoint) == COMMIT
    with pytest.raises(RigkitError, match="no revision nope"):
        resolve_revision("org/tiny", "nope", endpoint=hub.endpoint)
