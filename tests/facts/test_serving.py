"""rigkit/files/engine_api.py, the script behind ServingEngine, run as the rig runs it (``python3 -c``) against
a stand-in engine: a small HTTP server on a unix socket answering the engine API's paths with the answers a
real Docker 20.10 engine gave (tests/facts/serving.ServingEngine/engine-api.json). That the script and the
docker CLI read a real engine alike is tests/lab/test_serving_lab.py's."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from socketserver import ThreadingUnixStreamServer
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from rigkit.facts.batch import FactSpec
from rigkit.facts.serving import (
    ENGINE_API_SCRIPT,
    ENGINE_SECTION_END,
    ServingEngine,
    StackContainers,
    engine_parts,
    serving_engine,
)
from rigkit.files.engine_api import DEFAULT_SOCKET, container_ids, engine_socket, quote
from rigkit.serving.render import STACK_LABEL

CAPTURED = json.loads((Path(__file__).parent / "serving.ServingEngine" / "engine-api.json").read_text())
IMAGE = CAPTURED["arguments"]["image"]
CONTAINERS = json.loads(engine_parts(CAPTURED["output"])[3][0])  # the inspect JSON the real engine gave
IMAGES = [
    {"Id": "sha256:new", "RepoTags": ["rigkit/serving:b", "rigkit/serving:a"], "RepoDigests": []},
    {"Id": "sha256:untagged", "RepoTags": ["<none>:<none>"], "RepoDigests": ["rigkit/serving@sha256:0"]},
    {"Id": "sha256:old", "RepoTags": None, "RepoDigests": []},
    {"Id": "sha256:older", "RepoTags": ["debian:bookworm"], "RepoDigests": []},
]
LABEL = f"{STACK_LABEL}=serving"


VERSION = CAPTURED["fact"]["engine"]["server_version"]
DOCKER_SERVER = f"Docker/{VERSION} (linux)"  # the header every answer of a real engine carries


class StandInEngine(BaseHTTPRequestHandler):
    failing: set[str] = set()  # paths answered 500
    server_header = DOCKER_SERVER  # its Server header (self.server is the socket server)
    asked: list[str] = []  # the paths asked, in order

    def version_string(self) -> str:
        return self.server_header

    def do_GET(self):
        url = urlsplit(self.path)
        path = unquote(url.path)
        self.asked.append(path)
        if path in self.failing:
            return self.answer(500, {"message": "stand-in failure"})
        if path == "/version":
            return self.answer(200, {"Version": VERSION})
        if path == "/images/json":
            return self.answer(200, IMAGES)
        if path == f"/images/{IMAGE}/json":
            return self.answer(200, {"Id": "sha256:x"})
        if path.startswith("/images/"):
            return self.answer(404, {"message": "No such image"})
        if path == "/containers/json":
            labels = json.loads(parse_qs(url.query)["filters"][0])["label"]
            return self.answer(200, [{"Id": c["Id"]} for c in CONTAINERS] if labels == [LABEL] else [])
        for container in CONTAINERS:
            if path == f"/containers/{container['Id']}/json":
                return self.answer(200, container)
        return self.answer(404, {"message": "page not found"})

    def answer(self, status: int, body) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, *args) -> None:
        pass


@pytest.fixture()
def engine(tmp_path: Path):
    path = tmp_path / "docker.sock"
    server = ThreadingUnixStreamServer(str(path), StandInEngine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield path
    server.shutdown()
    server.server_close()
    StandInEngine.failing = set()
    StandInEngine.server_header = DOCKER_SERVER
    StandInEngine.asked = []


def run_script(env: dict, image: str = IMAGE) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-c", ENGINE_API_SCRIPT, ENGINE_SECTION_END, image, LABEL]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)


def env_for(tmp_path: Path, **extra) -> dict:
    return {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", **extra}


def test_the_script_prints_what_the_facts_read(engine, tmp_path):
    result = run_script(env_for(tmp_path, DOCKER_HOST=f"unix://{engine}"))
    assert result.returncode == 0, result.stderr
    assert ServingEngine().process(result.stdout.splitlines()) == {
        **CAPTURED["fact"],
        # newest image first, its tags as the engine lists them; untagged and digest-only images left out
        "local_images": ["rigkit/serving:b", "rigkit/serving:a", "debian:bookworm"],
    }


def test_an_image_the_engine_lacks_is_absent_and_no_image_reads_none(engine, tmp_path):
    env = env_for(tmp_path, DOCKER_HOST=f"unix://{engine}")
    absent = ServingEngine().process(run_script(env, image=IMAGE[:-4] + "0000").stdout.splitlines())
    assert absent["image_present"] is False and absent["stack_containers"] == CAPTURED["fact"]["stack_containers"]
    none = run_script(env, image="")
    assert none.stdout.split(ENGINE_SECTION_END)[3] == "\n"  # the image's section is empty (after " api")
    assert ServingEngine().process(none.stdout.splitlines())["image_present"] is False


def test_the_version_is_read_from_the_engines_header_and_else_asked(engine, tmp_path):
    """GET /version costs a real engine more than the other answers together: asked only when the Server header
    is not Docker's (another engine, a proxy)."""
    env = env_for(tmp_path, DOCKER_HOST=f"unix://{engine}")
    from_header = run_script(env)
    assert "/version" not in StandInEngine.asked and from_header.stdout.splitlines()[1] == DOCKER_SERVER
    StandInEngine.asked.clear()
    StandInEngine.server_header = f"Podman/{VERSION} (linux)"
    asked = run_script(env)
    assert "/version" in StandInEngine.asked and json.loads(asked.stdout.splitlines()[1]) == {"Version": VERSION}
    for result in (from_header, asked):
        assert ServingEngine().process(result.stdout.splitlines())["engine"] == {
            "server_version": VERSION,
            "error": None,
        }


@pytest.mark.parametrize(
    "failing", ["/version", "/images/json", f"/images/{IMAGE}/json", "/containers/json", "CONTAINER"]
)
def test_an_answer_that_fails_prints_nothing(engine, tmp_path, failing):
    """Nothing partial: the fact's shell runs the docker CLI for every part when the script prints nothing."""
    StandInEngine.failing = {f"/containers/{CONTAINERS[0]['Id']}/json" if failing == "CONTAINER" else failing}
    StandInEngine.server_header = "" if failing == "/version" else DOCKER_SERVER  # /version is asked without the header
    result = run_script(env_for(tmp_path, DOCKER_HOST=f"unix://{engine}"))
    assert result.returncode != 0 and result.stdout == ""


# (DOCKER_* variables, ~/.docker/config.json or None) -> the socket the script reads, None: the CLI reads it
SOCKET_CHOICES = {
    "nothing-set": ({}, None, DEFAULT_SOCKET),
    "unix-host": ({"DOCKER_HOST": "unix:///run/user/1000/docker.sock"}, None, "/run/user/1000/docker.sock"),
    "tcp-host": ({"DOCKER_HOST": "tcp://127.0.0.1:2375"}, None, None),
    "ssh-host": ({"DOCKER_HOST": "ssh://root@rig1"}, None, None),
    "context-variable": ({"DOCKER_CONTEXT": "remote"}, None, None),
    "default-context-variable": ({"DOCKER_CONTEXT": "default"}, {"currentContext": "remote"}, DEFAULT_SOCKET),
    "config-context": ({}, {"currentContext": "remote"}, None),
    "config-default-context": ({}, {"currentContext": "default", "auths": {}}, DEFAULT_SOCKET),
    "config-without-context": ({}, {"auths": {}}, DEFAULT_SOCKET),
    "docker-config-dir": ({"DOCKER_CONFIG": "CONFIG_DIR"}, {"currentContext": "remote"}, None),
    # docker/cli cli/command/cli.go resolveContextName: a DOCKER_HOST comes before any context
    "host-before-context": ({"DOCKER_HOST": "unix:///d.sock", "DOCKER_CONTEXT": "remote"}, None, "/d.sock"),
    "host-before-config": ({"DOCKER_HOST": "unix:///d.sock"}, {"currentContext": "remote"}, "/d.sock"),
}


@pytest.mark.parametrize("name", SOCKET_CHOICES)
def test_the_script_reads_the_socket_the_cli_would_use(tmp_path, monkeypatch, name):
    env, config, expected = SOCKET_CHOICES[name]
    config_dir = tmp_path / ("elsewhere" if "DOCKER_CONFIG" in env else ".docker")
    if config is not None:
        config_dir.mkdir()
        (config_dir / "config.json").write_text(json.dumps(config))
    for key in ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for key, value in env.items():
        monkeypatch.setenv(key, str(config_dir) if value == "CONFIG_DIR" else value)
    assert engine_socket() == expected


def test_the_script_leaves_another_engine_to_the_cli(tmp_path):
    """Exit 2 and no output: the fact's shell runs the docker CLI."""
    result = run_script(env_for(tmp_path, DOCKER_HOST="tcp://127.0.0.1:2375"))
    assert (result.returncode, result.stdout) == (2, "")


def test_a_socket_that_does_not_answer_prints_nothing(tmp_path):
    result = run_script(env_for(tmp_path, DOCKER_HOST=f"unix://{tmp_path}/absent.sock"))
    assert result.returncode != 0 and result.stdout == ""


@pytest.mark.parametrize("text", [IMAGE, json.dumps({"label": [LABEL]}), "é x+y%/a:b@c~d"])
def test_the_script_quotes_a_url_as_urllib_does(text):
    assert quote(text) == urllib.parse.quote(text, safe="/:@")


ID_A, ID_B = "a" * 64, "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "listing, ids",
    [
        # the engine's own layout (Go's encoding/json, no spaces), a label's value "Id" and an escaped key in a string
        (f'[{{"Id":"{ID_A}","Labels":{{"note":"Id","x":"\\"Id\\":\\"y"}}}},{{"Id":"{ID_B}"}}]', [ID_A, ID_B]),
        (f'[{{"Id": "{ID_A}", "Names": ["/a"]}}]', [ID_A]),  # another encoder's spaces
        ("[]", []),
        ("null", []),
    ],
)
def test_container_ids_are_read_without_json(listing, ids):
    assert container_ids(listing.encode()) == ids


@pytest.mark.parametrize(
    "listing", [f'[{{"Id":"{ID_A[:-1]}"}}]', f'[{{"Id":"{ID_A.upper()}"}}]', '[{"Id":7}]', '[{"ID":"x"}]']
)
def test_a_listing_laid_out_otherwise_leaves_the_read_to_the_cli(listing):
    with pytest.raises(SystemExit) as ended:
        container_ids(listing.encode())
    assert ended.value.code == 4


def test_the_script_imports_neither_json_nor_socket(engine, tmp_path):
    """Each import is a rig's CPU twice a deploy (json loads re; socket loads enum and selectors)."""
    argv = [sys.executable, "-I", "-S", "-X", "importtime", "-c", ENGINE_API_SCRIPT, ENGINE_SECTION_END, IMAGE, LABEL]
    result = subprocess.run(
        argv, env=env_for(tmp_path, DOCKER_HOST=f"unix://{engine}"), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0 and result.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import")}
    assert imported.isdisjoint({"json", "socket", "re", "enum", "selectors"}), imported


def api_output(*sections: list[str]) -> list[str]:
    """What the script prints: its first line, then each section and its end line."""
    return [f"{ENGINE_SECTION_END} api", *(line for section in sections for line in [*section, ENGINE_SECTION_END])]


def test_the_engines_answers_are_read_however_they_are_laid_out():
    """Two containers, an answer written over several indented lines (another engine's encoder), no tags."""
    first, second = ({**CONTAINERS[0], "Id": ident, "Name": name} for ident, name in ((ID_A, "/a"), (ID_B, "/Xb")))
    spread = json.dumps(second, indent=4).splitlines()
    output = api_output(['{"Version": "27.1.1"}'], ["[]"], ["absent"], [json.dumps(first), *spread])
    read = ServingEngine().process(output)
    assert read["engine"] == {"server_version": "27.1.1", "error": None}
    assert (read["local_images"], read["image_present"]) == ([], False)
    assert [(c["id"], c["name"]) for c in read["stack_containers"]] == [(ID_A[:12], "a"), (ID_B[:12], "Xb")]


def test_no_container_of_the_stack_reads_as_none_and_a_cut_answer_as_no_engine():
    none = ServingEngine().process(api_output(['{"Version": "27.1.1"}'], ["[]"], [], []))
    assert none["stack_containers"] == [] and none["engine"]["server_version"] == "27.1.1"
    assert engine_parts([f"{ENGINE_SECTION_END} api"])[0] == []  # cut after its first line: no version read
    assert ServingEngine().process([f"{ENGINE_SECTION_END} api"])["engine"]["server_version"] is None


def test_the_cli_prints_its_parts_as_they_are():
    output = ["27.1.1", "exit=0", ENGINE_SECTION_END, "a:b", ENGINE_SECTION_END, "present", ENGINE_SECTION_END, "[]"]
    assert engine_parts(output) == [["27.1.1", "exit=0"], ["a:b"], ["present"], ["[]"]]
    assert StackContainers().process(["[", json.dumps({**CONTAINERS[0], "Name": "/Xb"}), "]"])[0]["name"] == "Xb"


def test_the_survey_and_the_operations_read_the_pinned_image_and_rigkits_stack():
    """serving_engine is the one spec both use (the operations are answered from the picture by its key)."""
    spec = serving_engine(IMAGE)
    assert spec.fact is ServingEngine and spec == FactSpec.of(ServingEngine, image=IMAGE, stack="serving")
    assert f" {IMAGE} {LABEL} " in ServingEngine().command(**dict(spec.kwargs))


@pytest.mark.parametrize(
    "version_part",
    [
        ["Docker/27.1.1 (linux)"],
        ["Docker/27.1.1"],
        ["Docker/27.1.1 (an os with spaces)"],
        ['{"Version": "27.1.1"}'],
        ["{", '  "Version": "27.1.1"', "}"],
    ],
)
def test_the_engines_version_is_read_from_its_header_or_its_answer(version_part):
    read = ServingEngine().process(api_output(version_part, ["[]"], [], []))
    assert read["engine"] == {"server_version": "27.1.1", "error": None}
