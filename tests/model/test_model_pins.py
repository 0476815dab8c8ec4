"""Pins that deploys will refuse are refused where they are made (issue 43): a shared model is a host path like
l2_path and model_store_path (one type for every host path), `rigkit resolve-model` refuses what a deploy refuses
with the same words, and a repository id, the hub unreachable, end in a refusal, never a traceback."""

from __future__ import annotations

import socket

import pytest

from rigkit.cli import main
from rigkit.errors import ConfigError, RigkitError
from rigkit.model.hub import resolve_revision
from rigkit.model.resolve import resolve_model
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.model_source import hub_repo_problem, parse_model_source, resolve_directory

HASH = "b" * 64
IMAGE = "registry.local/vllm@sha256:" + "a" * 64


@pytest.mark.parametrize(
    "path, problem",
    [
        ("/etc/models", "inside the system directory /etc"),
        ("/usr/share/models", "inside the system directory /usr"),
        ("/mnt", "is the system directory /mnt itself"),
        ("/mnt/mo\u200bdels", "control or format character"),
        ("/mnt/models\u2028x", "control or format character"),
        ("/mnt/a:b", "':' (compose volume syntax)"),
        ("/mnt/$HOME/x", "'$'"),
        ("/mnt/ x", "starts or ends with a space"),
        ("/mnt//x", "normalised"),
        ("/mnt/../etc", "no empty, '.' or '..' parts"),
    ],
)
def test_a_shared_model_is_refused_where_l2_path_and_model_store_path_are_with_the_same_words(path, problem):
    words = {}
    for field, data in [
        ("model_source", {"model_source": f"shared:{path}@{HASH}"}),
        ("l2_path", {"l2_path": path}),
        ("model_store_path", {"model_store_path": path}),
    ]:
        with pytest.raises(ConfigError) as refused:
            settings_for_host({"serving_profile": "cpu-lab", "serving_image": IMAGE, **data})
        assert refused.value.field == field and problem in refused.value.problem, str(refused.value)
        words[field] = refused.value.problem.removeprefix("the directory ")
    assert len(set(words.values())) == 1, words


@pytest.mark.parametrize("path", ["/mnt/models/tiny", "/srv/models/a b", "/data/m"])
def test_a_shared_model_in_a_directory_of_its_own_is_kept(path):
    assert parse_model_source(f"shared:{path}@{HASH}").name == path


@pytest.mark.parametrize("value", ["shared:/mnt/../x", "shared:/etc/models", "shared:/mnt/m\u200bx", "shared:/mnt/a:b"])
def test_resolve_model_refuses_a_shared_pin_a_deploy_refuses_with_the_deploys_words(value, tmp_path, capsys):
    with pytest.raises(ConfigError) as at_resolve:
        resolve_model(value)
    with pytest.raises(ConfigError) as at_deploy:
        parse_model_source(f"{value}@{HASH}")
    assert at_resolve.value.problem == at_deploy.value.problem and at_resolve.value.fix == at_deploy.value.fix
    assert main(["resolve-model", value]) == 1 and "Traceback" not in capsys.readouterr().err


def test_every_pin_resolve_model_prints_is_one_a_deploy_takes(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    pin = resolve_model(f"controller:{tmp_path}/m/")
    assert parse_model_source(pin).revision == resolve_directory(str(tmp_path / "m")).revision


@pytest.mark.parametrize(
    "repo",
    [
        "Qwen/Qwen 3",
        "Qwen/Qwen3;rm",
        "Qwen/Qwen3..x",
        "Qwen/Qwen3--x",
        "Qwen/Qwen3.",
        "Qwen-/x",
        "Qwen/x.git",
        "Qwen/" + "a" * 97,
        "Qwen",
        "a/b/c",
        "Qw\u0435n/x",  # a Cyrillic e
    ],
)
def test_a_repository_id_the_hub_refuses_is_refused_before_the_hub_is_asked(repo, capsys):
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    assert hub_repo_problem(repo)
    with pytest.raises(ConfigError, match="not a hub repository id"):
        resolve_model(repo)
    if repo.count("/") == 1:  # a namespace/name: the hub's own validator refuses it too, before any request
        with pytest.raises(HFValidationError):
            validate_repo_id(repo)
        with pytest.raises(ConfigError, match="not a hub repository id"):
            resolve_revision(repo, "main", endpoint="http://127.0.0.1:9")
    assert main(["resolve-model", repo]) == 1
    error = capsys.readouterr().err
    assert "not a hub repository id" in error and "Traceback" not in error


@pytest.mark.parametrize("repo", ["Qwen/Qwen3-8B", "a/b", "org_/x_y.z", "0/9"])
def test_a_repository_id_the_hub_takes_is_kept(repo):
    from huggingface_hub.utils import validate_repo_id

    validate_repo_id(repo)
    assert hub_repo_problem(repo) is None


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_hub_unreachable_is_a_refusal_naming_the_endpoint_fix_not_a_traceback(monkeypatch, capsys):
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(RigkitError) as refused:
        resolve_revision("org/tiny", "main", endpoint=endpoint)
    assert "the hub did not answer (ConnectError" in refused.value.problem and "HF_ENDPOINT" in refused.value.fix
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    assert main(["resolve-model", "org/tiny"]) == 1
    error = capsys.readouterr().err
    assert "the hub did not answer" in error and "Traceback" not in error
