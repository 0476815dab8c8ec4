"""The serving image for real: built (or reused), two releases in the lab registry, vLLM serves from it.

One vLLM start covers the plain serving path and the cpu-lab profile's ExampleConnector flags.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import uuid

import pytest
import requests

from rigkit.lab import serving_image as si
from rigkit.lab.engine import ensure_engine
from rigkit.lab.lab_model import ensure_lab_model
from rigkit.lab.registry_server import REGISTRY, ensure_registry

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

VLLM_READY_TIMEOUT_S = 300
KV_STORE_IN_CONTAINER = "/kv-store"
# Flags from shared/lab.md: the pool holds one max-length request (72 x 128 >= 8192) and a whole
# prompt prefills in one chunk (the ExampleConnector reload of a chunked prompt kills the engine).
SERVE_FLAGS = [
    "--max-model-len",
    "8192",
    "--dtype",
    "bfloat16",
    "--enable-prefix-caching",
    "--enforce-eager",
    "--enable-prompt-tokens-details",
    "--num-gpu-blocks-override",
    "72",
    "--max-num-batched-tokens",
    "8192",
]
SERVE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def log(message: str) -> None:
    print(f"[serving-image] {message}", flush=True)


@pytest.fixture(scope="module")
def serving() -> dict:
    ensure_engine(log)
    ensure_registry(log)
    return si.ensure_serving_image(REGISTRY, log)


def free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def image_config(reference: str) -> dict:
    out = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config}}", reference],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def test_two_releases_with_their_own_digests_and_labels(serving):
    assert serving["repository"] == f"{REGISTRY}/rigkit/vllm-cpu-tiny"
    releases = serving["releases"]
    assert sorted(releases) == ["1", "2"]
    assert releases["1"] != releases["2"]
    for release, reference in releases.items():
        assert reference.startswith(serving["repository"] + "@sha256:")
        assert si.registry_has_manifest(REGISTRY, reference)
        config = image_config(reference)
        assert config["Labels"][si.RELEASE_LABEL] == release
        assert f"{si.RELEASE_ENV}={release}" in config["Env"]


def test_second_call_reuses_the_registry_releases(serving):
    messages: list[str] = []
    again = si.ensure_serving_image(REGISTRY, messages.append)
    assert again == serving
    assert any("cached" in message for message in messages)
    assert not any(message.startswith(("image build", "push")) for message in messages)


def test_registry_missing_a_manifest_is_not_taken_as_cached(serving):
    repository, _, digest = serving["releases"]["1"].partition("@")
    unknown = f"{repository}@sha256:{'0' * 64}"
    assert not si.registry_has_manifest(REGISTRY, unknown)


def stream_completion(base_url: str, prompt: str, max_tokens: int) -> tuple[list[str], dict]:
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    pieces: list[str] = []
    usage: dict = {}
    with requests.post(f"{base_url}/v1/completions", json=body, stream=True, timeout=120) as response:
        response.raise_for_status()
        for raw in response.iter_lines():
            line = raw.decode()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            pieces += [choice["text"] for choice in chunk.get("choices", [])]
            usage = chunk.get("usage") or usage
    return pieces, usage


def external_queries(metrics_text: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics_text.splitlines()
        if line.startswith("vllm:external_prefix_cache_queries_total{")
    )


def test_release_1_serves_tiny_with_the_example_connector(serving, tmp_path):
    port = free_loopback_port()
    store = tmp_path / "kv-store"
    store.mkdir()
    name = f"rigkit-test-serving-{uuid.uuid4().hex[:8]}"
    kv_config = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": KV_STORE_IN_CONTAINER},
    }
    # vLLM CPU's engine core needs ~160 MiB of /dev/shm; Docker's default is 64 MiB
    cmd = [
        "docker",
        "run",
        "-d",
        "--name",
        name,
        "--network",
        "host",
        "--init",
        "--shm-size",
        "1g",
        "-v",
        f"{store}:{KV_STORE_IN_CONTAINER}",
        # the image holds no model: the lab's, read-only where a deploy mounts the staged one
        "-v",
        f"{ensure_lab_model()}:{serving['model_dir']}:ro",
    ]
    for key, value in SERVE_ENV.items():
        cmd += ["-e", f"{key}={value}"]
    cmd += [
        serving["releases"]["1"],
        serving["python"],
        "-m",
        serving["serve_module"],
        "--model",
        serving["model_dir"],
        "--served-model-name",
        serving["served_model_name"],
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *SERVE_FLAGS,
        "--kv-transfer-config",
        json.dumps(kv_config),
    ]
    log("starting vLLM: " + " ".join(cmd))
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        models = None
        while time.monotonic() - started < VLLM_READY_TIMEOUT_S:
            state = subprocess.run(
                ["docker", "inspect", "--format", "{{.State.Running}}", name], capture_output=True, text=True
            ).stdout.strip()
            if state != "true":
                logs = subprocess.run(["docker", "logs", "--tail", "40", name], capture_output=True, text=True)
                pytest.fail(f"vLLM exited during start-up:\n{logs.stdout}{logs.stderr}")
            try:
                models = requests.get(f"{base_url}/v1/models", timeout=2).json()
                break
            except (requests.RequestException, ValueError):
                time.sleep(2)
        assert models is not None, f"/v1/models did not answer within {VLLM_READY_TIMEOUT_S} s"
        log(f"vLLM ready in {time.monotonic() - started:.0f} s")
        assert [model["id"] for model in models["data"]] == ["tiny"]

        prompt = " ".join(f"rig{index} cache token prefix" for index in range(120))  # several 128-token blocks
        pieces, usage = stream_completion(base_url, prompt, max_tokens=8)
        assert len(pieces) >= 2, pieces  # streamed: one chunk per token, not one reply
        assert usage["completion_tokens"] == 8
        assert usage["prompt_tokens"] > 128
        stored = [path for path in store.rglob("*") if path.is_file()]
        assert stored, "ExampleConnector wrote nothing to its shared_storage_path"
        metrics = requests.get(f"{base_url}/metrics", timeout=10).text
        assert external_queries(metrics) >= usage["prompt_tokens"] - 1, "the connector was not consulted"

        # the chat template in tokenizer_config.json renders (ChatML)
        chat = requests.post(
            f"{base_url}/v1/chat/completions",
            timeout=60,
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 4,
                "ignore_eos": True,
            },
        ).json()
        assert chat["usage"]["completion_tokens"] == 4, chat
    finally:
        logs = subprocess.run(["docker", "logs", "--tail", "15", name], capture_output=True, text=True)
        log("vLLM log tail:\n" + logs.stdout + logs.stderr)
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
