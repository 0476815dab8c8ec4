"""Cache validation against a real vLLM (CPU build, tiny Qwen3) with the ExampleConnector disk store.

One module-scoped vLLM container; it is restarted (removed and run again: a full down/up, a new
process with an empty GPU pool) only for the persistent tier. The test logic takes a
`ValidationTarget` (base URL + restart callable + store dir): the integrator can override the
`validation_target` fixture to point these tests at a rig deployed by rigkit (through the SSH
tunnel) without changing them.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import pytest

from rigkit.card import render_run, write_card
from rigkit.client import PromptSpec, ServingClient, measure
from rigkit.tiers import Tier, label
from rigkit.validation import Settings, TierValidation, evict_gpu_pool, run_decode_ab, to_card, validate_tiers

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

# Lab sizes (lab.md, "Tier isolation works in the lab"): a 72-block pool (9,216 tokens) is evicted
# by a few ~3,500-token fillers; batched tokens >= max-model-len avoids the ExampleConnector
# chunked-reload crash.
NUM_GPU_BLOCKS = 72
MAX_MODEL_LEN = 8192
STORE_IN_CONTAINER = "/kv-store"
SESSION_TOKENS = 3500
SESSIONS = 2


@dataclass
class ValidationTarget:
    base_url: str
    restart: Callable[[], None]  # a full down/up of the serving stack
    store_dir: Optional[Path]  # the connector's store as seen from the test (wipe, size)
    connector_configured: bool = True
    image_digest: Optional[str] = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serving_image() -> dict:
    from rigkit.lab.serving_image import ensure_serving_image

    return ensure_serving_image(progress=lambda message: None)


class LabVLLM:
    """One vLLM container on the host engine, host networking, loopback port, ExampleConnector store."""

    def __init__(self, image: dict, store_dir: Path, port: int):
        self.image, self.store_dir, self.port = image, store_dir, port
        self.name = f"rigkit-validation-{port}"

    def command(self) -> list[str]:
        connector = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                     "kv_connector_extra_config": {"shared_storage_path": STORE_IN_CONTAINER}}
        env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        return (["docker", "run", "-d", "--name", self.name, "--network", "host", "--init", "--shm-size", "1g",
                 "-v", f"{self.store_dir}:{STORE_IN_CONTAINER}"]
                + [arg for k, v in env.items() for arg in ("-e", f"{k}={v}")]
                + [self.image["releases"]["1"], self.image["python"], "-m", self.image["serve_module"],
                   "--model", self.image["model_dir"], "--served-model-name", self.image["served_model_name"],
                   "--load-format", "dummy", "--host", "127.0.0.1", "--port", str(self.port),
                   "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "bfloat16", "--enable-prefix-caching",
                   "--enforce-eager", "--enable-prompt-tokens-details",
                   "--num-gpu-blocks-override", str(NUM_GPU_BLOCKS), "--max-num-batched-tokens", str(MAX_MODEL_LEN),
                   "--kv-transfer-config", json.dumps(connector)])

    def up(self) -> None:
        subprocess.run(self.command(), check=True, capture_output=True, text=True, timeout=120)

    def down(self) -> None:
        subprocess.run(["docker", "rm", "-f", self.name], capture_output=True, text=True, timeout=120)

    def restart(self) -> None:
        self.down()
        self.up()
        self.wait_ready()

    def running(self) -> bool:
        out = subprocess.run(["docker", "inspect", "--format", "{{.State.Running}}", self.name],
                             capture_output=True, text=True)
        return out.stdout.strip() == "true"

    def wait_ready(self, timeout_s: float = 300) -> None:
        """Until /v1/models answers; fails at once with the log tail when the container died."""
        client = ServingClient(f"http://127.0.0.1:{self.port}")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.running():
                raise RuntimeError(f"vLLM container {self.name} died:\n{self.log_tail()}")
            try:
                client.models()
                return
            except Exception:
                time.sleep(2)
        raise RuntimeError(f"vLLM container {self.name} not ready after {timeout_s} s:\n{self.log_tail()}")

    def log_tail(self) -> str:
        out = subprocess.run(["docker", "logs", "--tail", "40", self.name], capture_output=True, text=True)
        return out.stdout + out.stderr


@pytest.fixture(scope="module")
def validation_target(tmp_path_factory) -> Iterator[ValidationTarget]:
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode:
        pytest.skip("no Docker engine: bring the lab up (rigkit lab up)")
    image = _serving_image()
    store = tmp_path_factory.mktemp("kv-store")
    server = LabVLLM(image, store, _free_port())
    server.up()
    try:
        server.wait_ready()
        yield ValidationTarget(f"http://127.0.0.1:{server.port}", server.restart, store,
                               image_digest=image["releases"]["1"])
    finally:
        server.down()
        # the store holds files written by root in the container; tmp_path cleanup copes


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.fixture(scope="module")
def client(validation_target) -> ServingClient:
    return ServingClient(validation_target.base_url)


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings.from_data({"validate_prompt_tokens": SESSION_TOKENS, "validate_sessions": SESSIONS})


@pytest.fixture(scope="module")
def tier_run(validation_target, client, settings) -> TierValidation:
    """The whole tier procedure once: cold, warm-gpu, fillers, warm-connector, down/up, warm-persistent."""
    store = validation_target.store_dir
    return validate_tiers(client, validation_target.restart, settings,
                          connector_configured=validation_target.connector_configured,
                          store_bytes=(lambda: _dir_bytes(store)) if store else None,
                          capacity_tiers={"lab store (1 GiB loop disk)": 2**30})


def test_cold_requests_touch_no_cache(tier_run):
    cold = tier_run.tier(Tier.COLD)
    assert [lab.tier for lab in cold.labels] == [Tier.COLD] * SESSIONS
    for lab in cold.labels:
        assert lab.gpu_hits == 0 and lab.external_hits == 0, lab.proof


def test_immediate_repeat_is_served_by_the_gpu_prefix_cache(tier_run):
    warm = tier_run.tier(Tier.WARM_GPU)
    block = tier_run.pool.block_size
    assert [lab.tier for lab in warm.labels] == [Tier.WARM_GPU] * SESSIONS
    for lab, m in zip(warm.labels, warm.measured):
        # every full block of the prompt came from the GPU pool, nothing from the connector
        assert lab.gpu_hits >= m.result.prompt_tokens - block and lab.external_hits == 0, lab.proof
        assert m.result.cached_tokens == lab.gpu_hits


def test_after_fillers_the_connector_serves_and_the_gpu_pool_does_not(tier_run):
    assert tier_run.fillers_sent * SESSION_TOKENS >= tier_run.pool.gpu_pool_tokens
    connector = tier_run.tier(Tier.WARM_CONNECTOR)
    assert [lab.tier for lab in connector.labels] == [Tier.WARM_CONNECTOR] * SESSIONS
    for lab in connector.labels:
        assert lab.gpu_hits == 0 and lab.external_hits > 0, lab.proof
        assert lab.external_kv_transfer_tokens == lab.external_hits


def test_the_store_survives_a_real_down_up(tier_run):
    persistent = tier_run.tier(Tier.WARM_PERSISTENT)
    assert persistent is not None, "the restart step did not run"
    assert [lab.tier for lab in persistent.labels] == [Tier.WARM_PERSISTENT] * SESSIONS
    for lab in persistent.labels:
        assert lab.external_hits > 0 and lab.gpu_hits == 0, lab.proof


def test_client_ttft_agrees_with_the_server_histogram(tier_run):
    checks = [m.ttft_check for run in tier_run.tiers for m in run.measured]
    assert checks and all(c is not None and c.server_requests == 1 for c in checks)
    outside = [(c.client_s, c.server_s) for c in checks if not c.within]
    assert not outside, f"client vs server TTFT outside tolerance: {outside}"


def test_cache_tiers_are_faster_than_cold(tier_run):
    cold = tier_run.tier(Tier.COLD).result().ttft_s.mean
    for tier in (Tier.WARM_GPU, Tier.WARM_CONNECTOR, Tier.WARM_PERSISTENT):
        assert tier_run.tier(tier).result().ttft_s.mean < cold, tier


def test_capacity_is_measured_from_store_growth(tier_run):
    capacity = tier_run.capacity
    assert capacity is not None and capacity.kb_per_token and capacity.kb_per_token > 0
    assert capacity.tokens_stored >= SESSIONS * (SESSION_TOKENS - 128)


def test_card_from_the_real_run_passes_and_renders(tier_run, settings, validation_target, tmp_path):
    card = to_card("lab-vllm", "lab-run", tier_run, settings,
                   repro={"profile": "lab-example", "image_digest": validation_target.image_digest})
    assert card.passed, card.failures + [t.label for t in card.tiers]
    write_card(tmp_path, card)
    names = {p.name for p in render_run(tmp_path)}
    assert {"lab-vllm.md", "lab-vllm-ttft.png", "fleet.md"} <= names
    md = (tmp_path / "lab-vllm.md").read_text()
    assert "warm-persistent ✓" in md and "external hits +" in md
    print(md)


def test_wiped_store_is_never_labelled_warm(tier_run, validation_target, client, settings):
    """A broken connector (its store wiped): the re-sent prompt must be cold or retrieved-but-unused."""
    if validation_target.store_dir is None:
        pytest.skip("the target does not expose its connector store")
    for entry in validation_target.store_dir.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    evict_gpu_pool(client, tier_run.pool, settings, timeout_s=300)
    prompt = tier_run.prompts[0]
    measured = measure(client, prompt.text, settings.output_tokens, timeout_s=300)
    verdict = label(measured.window, Tier.WARM_CONNECTOR, connector_configured=True)
    assert verdict.tier in (Tier.RETRIEVED_BUT_UNUSED, Tier.COLD), verdict.proof
    assert not verdict.passed


def test_a_cut_prefill_is_reported_as_aborted(client):
    prompt = client.build_prompt(PromptSpec("code", 6000, seed=5))
    result = client.stream_completion(prompt.text, max_tokens=4, timeout_s=0.01)
    assert result.aborted and result.abort_phase == "prefill" and result.ttft_s is None
    assert result.error.startswith("timeout:")


def test_decode_a_a_is_no_penalty(client, settings):
    """Both arms on the same server (an A/A run): the interleaved statistics must call it no penalty."""
    ab = run_decode_ab(lambda arm: client, {"on": "same", "off": "same"}, settings, warmup=1, measured=5)
    for kind in ab.kinds:
        assert kind.on.n == 5 and kind.off.n == 5 and kind.on.mean > 0
    print(f"decode A/A: {[(k.kind, round(k.on.mean, 1), round(k.on.cv, 3), round(k.off.mean, 1), round(k.off.cv, 3)) for k in ab.kinds]} -> {ab.verdict}")
    assert ab.verdict == "no penalty", ab


def test_decode_speed_is_timed_over_every_token(client):
    """Token events with empty text (partial UTF-8) still count: the decode interval spans the stream."""
    prompt = client.build_prompt(PromptSpec("narrative", 256, seed=11))
    result = client.stream_completion(prompt.text, max_tokens=64)
    # the detokenizer may merge a held-back token into the next event, never drop the stream's timing
    assert result.completion_tokens == 64 and 0.9 * 64 <= result.chunks <= 64
    decode_interval = (result.completion_tokens - 1) / result.decode_tps
    assert decode_interval >= 0.9 * (result.total_s - result.ttft_s) - 0.01
