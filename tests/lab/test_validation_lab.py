"""Cache validation against a real vLLM (CPU build, tiny Qwen3) with the ExampleConnector disk store.

The target is a lab rig deployed by rigkit (the session's `deployed` fixture), in its own network
namespace and reached through the SSH tunnel (prompts, /metrics); every completion is streamed from the rig
itself by rigkit's TTFT probe over the tunnel's SSH connection, as validate.py does; it is restarted (compose down/up: a new process with an
empty GPU pool) only for the persistent tier. The lab group data shrinks the KV pool
(num_gpu_blocks_override) so a few fillers evict a prefix.

Tiers are asserted by vLLM's metrics, never by timing: the speedups are printed with the card
(test_card_from_the_real_run_passes_and_renders, `-s`) and by validate.py, not asserted (a 3500-token
prefill on 2 shared cores takes ~0.1-0.2 s, within the noise of a busy machine).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import pytest

from rigkit.paths import RIG_STACK_DIR
from rigkit.prompts import PromptSpec
from rigkit.remote.client import ServingClient, ServingError
from rigkit.remote.probe import CONTROLLER_TRANSPORT, RigProbe
from rigkit.remote.tunnel import Tunnel, open_tunnel
from rigkit.serving.render import COMPOSE_PROJECT
from rigkit.settings.hostdata import settings_for_host
from rigkit.validation.card import render_run, write_card
from rigkit.validation.card.assemble import to_card
from rigkit.validation.decode_ab import run_decode_ab
from rigkit.validation.measure import measure
from rigkit.validation.power import DAMAGE_NAMES, LocalStore
from rigkit.validation.procedure import LOGPROBS_WARMUP_PROMPT, TierValidation, ValidationSettings, validate_tiers
from rigkit.validation.tier_run import TierRun
from rigkit.validation.tiers import Tier, label
from rigkit.validation.ttft import ttft_tolerance_s

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

# Sessions sized for the lab's 72-block KV pool (group_data/lab.py): a few fillers evict a prefix.
SESSION_TOKENS = 3500
SESSIONS = 2
# Code sessions: the lab model (rigkit/lab/lab_model.py, training.json) puts its first greedy token after a held-out
# code prompt 5.4-6.7 nats ahead of the runner-up, after a narrative one 0.0-0.06 (a near tie: a wrong first token
# there would read as numerics), so a corrupted store is told on the first token.
PROMPT_KIND = "code"
LAB_MODEL_LAYERS = 2  # rigkit/lab/lab_model: the tiny Qwen3's layers (the "one layer" damage's slice)


@dataclass
class ValidationTarget:
    base_url: str
    restart: Callable[..., None]  # a full down/up of the serving stack (while_down: run between the two)
    store_dir: Optional[Path]  # the connector's store as seen from the test (wipe, size)
    connector_configured: bool = True
    image_digest: Optional[str] = None
    tunnel: Optional[Tunnel] = None
    probe: Optional[RigProbe] = None  # streams from the rig: the client TTFT of the rig's own clients


def _rig_path(rig_container: str, path: str) -> Path:
    """A path inside a running rig as the controller (root) sees it: through the rig's /proc root."""
    pid = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Pid}}", rig_container], capture_output=True, text=True, check=True
    ).stdout.strip()
    return Path(f"/proc/{pid}/root{path}")


@pytest.fixture(scope="module")
def validation_target(lab, deployed, netns_rig, lab_host_data, rig_exec, rig_diagnostics) -> Iterator[ValidationTarget]:
    """The lab rig in its own network namespace, as rigkit deployed it (cpu-lab, release 1).

    Its API binds the rig's loopback: the tests reach it only through the SSH tunnel, as on a real
    fleet. The restart is the serving stack's own compose down/up on the rig.
    """
    data = {
        **lab_host_data[netns_rig.name],
        "serving_profile": "cpu-lab",
        "serving_image": lab.serving_image["releases"]["1"],
    }
    l2_path = settings_for_host(data).knobs["l2_path"]
    compose = f"cd {RIG_STACK_DIR} && docker-compose -p {COMPOSE_PROJECT}"
    with open_tunnel(data, "127.0.0.1", netns_rig.serving_port, netns_rig.name) as tunnel:

        def restart(while_down: Optional[Callable[[], None]] = None) -> None:
            rig_exec(netns_rig, f"{compose} down --remove-orphans")
            if while_down is not None:
                while_down()
            rig_exec(netns_rig, f"{compose} up -d")
            try:
                ServingClient(tunnel.url).wait_ready(timeout_s=300)
            except ServingError as exc:
                raise AssertionError(
                    f"{exc}\ntunnel: transport active={tunnel.transport_active()}, "
                    f"reconnects={tunnel.reconnects}\n{rig_diagnostics(netns_rig)}"
                ) from None

        yield ValidationTarget(
            tunnel.url,
            restart,
            _rig_path(netns_rig.container, l2_path),
            image_digest=lab.serving_image["releases"]["1"],
            tunnel=tunnel,
            probe=RigProbe.on(netns_rig.name, tunnel.run, "127.0.0.1", netns_rig.serving_port),
        )


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.fixture(scope="module")
def client(validation_target) -> ServingClient:
    return ServingClient(validation_target.base_url, probe=validation_target.probe)


@pytest.fixture
def live_client(validation_target, client, netns_rig, rig_diagnostics) -> ServingClient:
    """The client, with the stack restarted first if its server stopped answering in an earlier test
    (seen in the CI lab after the abort and decode tests; the report below says why when it happens)."""
    try:
        client.wait_ready(timeout_s=120)
    except ServingError as exc:
        tunnel = validation_target.tunnel
        print(
            f"live_client: {exc}\ntunnel: transport active={tunnel and tunnel.transport_active()}, "
            f"reconnects={tunnel and tunnel.reconnects}\n{rig_diagnostics(netns_rig)}"
        )
        validation_target.restart()
    return client


@pytest.fixture(scope="module")
def settings() -> ValidationSettings:
    return ValidationSettings.from_data(
        {
            "validate_prompt_tokens": SESSION_TOKENS,
            "validate_sessions": SESSIONS,
            "validate_prompt_kind": PROMPT_KIND,
            "validate_power_selftest": True,
        }
    )


@pytest.fixture(scope="module")
def tier_run(validation_target, client, settings) -> TierValidation:
    """The whole tier procedure once: cold, warm-gpu, fillers, warm-connector, down/up, warm-persistent."""
    store = validation_target.store_dir
    return validate_tiers(
        client,
        validation_target.restart,
        settings,
        connector_configured=validation_target.connector_configured,
        store_bytes=(lambda: _dir_bytes(store)) if store else None,
        capacity_tiers={"lab store (1 GiB loop disk)": 2**30},
        store=LocalStore(store) if store else None,
        model_layers=LAB_MODEL_LAYERS,
    )


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


def test_client_ttft_less_its_measured_api_overhead_is_compared_with_the_histogram_on_every_tier(tier_run):
    """The probe measures where the rig's own clients sit (the rig's loopback, not the tunnel), one request per
    server window, and before each times the same body refused with 404 (the API server's cost outside the
    histogram's clock, the median of three). On the real vLLM: every request gets that figure; taking it off never
    takes the client below the histogram by more than the tolerance (the 404 holds no engine time), and brings the
    client figures closer to the histogram's in all (the summed distance shrinks). The issue's target, every request
    within max(5 %, 5 ms), is not asserted: a quiet lab run met it on 8 of 8 requests, runs sharing the host with
    other work on 7, 5 and 4 of 8 (docs/benchmarks.md). Printed with -s: client / overhead / server in ms and the count within."""
    assert "loopback" in tier_run.ttft_transport, tier_run.ttft_transport
    checks = [(run.expected.value, m.ttft_check) for run in tier_run.tiers for m in run.measured]
    print(
        "client/API overhead/server TTFT (ms): "
        + "; ".join(
            f"{tier} {1000 * c.client_s:.1f}/{1000 * (c.api_overhead_s or 0):.1f}/{1000 * (c.server_s or 0):.1f}"
            for tier, c in checks
            if c
        )
    )
    assert all(c is not None and c.server_requests == 1 and c.server_s and c.api_overhead_s for _, c in checks), checks
    overshoots = [(tier, c) for tier, c in checks if c.compared_s < c.server_s - ttft_tolerance_s(c.server_s)]
    assert not overshoots, f"the API overhead took the client figure below the histogram: {overshoots}"
    print(
        f"within max(5 %, 5 ms) once the API overhead is taken off: {sum(c.within for _, c in checks)} of "
        f"{len(checks)} requests"
    )
    raw = sum(abs(c.client_s - c.server_s) for _, c in checks)
    less_overhead = sum(abs(c.difference_s) for _, c in checks)
    assert less_overhead < raw, (
        f"the API overhead brought nothing closer: {less_overhead:.4f} s vs {raw:.4f} s, {checks}"
    )


def test_greedy_output_of_every_warm_tier_repeats_the_cold_run(tier_run):
    """The served-but-wrong check on the lab's CPU build and its trained model: greedy (temperature 0, the session's
    seed) output of warm-gpu, warm-connector and warm-persistent against cold (and warm-gpu), session by session,
    with the top logprobs the engine computed (the image's g++ lets vLLM CPU compile that path); printed with
    `-s`: verdict, where an output parted and the reference's margin there. Numerics (a near tie) passes."""
    for run in tier_run.tiers[1:]:
        for check in run.result().greedy:
            print(
                f"greedy {run.expected.value} session {check.session}: {check.verdict} against {check.reference}"
                f" (first difference: token {check.first_difference_token}, margin {check.margin_nats}, drift "
                f"{check.logprob_drift}): {check.reference} {check.reference_text!r} / warm {check.text!r}"
            )
    compared = {run.expected: len(run.result().greedy) for run in tier_run.tiers[1:]}
    assert compared == {Tier.WARM_GPU: SESSIONS, Tier.WARM_CONNECTOR: SESSIONS, Tier.WARM_PERSISTENT: SESSIONS}
    assert all(len(m.result.tokens) == m.result.completion_tokens for run in tier_run.tiers for m in run.measured), (
        "the engine returned no logprobs for some request"
    )
    assert all(check.tokens_compared for run in tier_run.tiers for check in run.result().greedy)
    wrong = [
        (run.expected.value, c.session, c.first_difference_token, c.margin_nats)
        for run in tier_run.tiers
        for c in run.result().greedy
        if c.verdict not in ("same", "numerics")
    ]
    assert not wrong, f"served-but-wrong or inconclusive (tier, session, first differing token, margin): {wrong}"


def test_the_power_self_test_catches_every_damage_of_the_lab_store(tier_run):
    """The verdict's power on the lab's model and ExampleConnector store: self-test sessions' entries damaged four ways
    before the restart (rigkit.validation.power), each asked again after it. Printed with -s: the table."""
    power = tier_run.power
    assert power is not None and [row.damage for row in power.rows] == list(DAMAGE_NAMES)
    for row in power.rows:
        print(
            f"power {row.damage}: {row.files} files, {row.bytes_damaged} bytes, {row.label}, {row.verdict}, "
            f"shift {row.shift_nats}, caught {row.caught}"
        )
    assert all(row.files > 0 for row in power.rows), power.rows
    assert all(row.caught for row in power.rows), power.rows


def test_after_the_power_self_test_no_damaged_entry_stays_and_the_engine_answers_right(
    tier_run, validation_target, live_client
):
    """The damaged loads left NaN behind in the lab engine's KV pool (a later short prompt got NaN logits, no logprob,
    until a restart): the procedure deletes the self-test's entries and restarts the engine once more. A short prompt
    with logprobs, the kind that came back NaN, must come back with them."""
    power = tier_run.power
    assert power.restarted_after and power.entries_removed >= sum(row.files for row in power.rows) > 0, power
    short = live_client.stream_completion(LOGPROBS_WARMUP_PROMPT, max_tokens=1, logprobs=5)
    assert short.tokens and short.tokens[0].logprob <= 0.0, short


def test_capacity_is_measured_from_store_growth(tier_run):
    capacity = tier_run.capacity
    assert capacity is not None and capacity.kb_per_token and capacity.kb_per_token > 0
    assert capacity.tokens_stored >= SESSIONS * (SESSION_TOKENS - 128)


def test_card_from_the_real_run_passes_and_renders(tier_run, settings, validation_target, tmp_path):
    card = to_card(
        "lab-vllm",
        "lab-run",
        tier_run,
        settings,
        repro={"profile": "lab-example", "image_digest": validation_target.image_digest},
    )
    assert card.passed, card.failures + [t.label for t in card.tiers]
    write_card(tmp_path, card)
    names = {p.name for p in render_run(tmp_path)}
    assert {"lab-vllm.md", "lab-vllm-ttft.png", "fleet.md"} <= names
    md = (tmp_path / "lab-vllm.md").read_text()
    assert "warm-persistent ✓" in md and "external hits +" in md
    assert f"Client TTFT measured on {validation_target.probe.transport}" in md
    print(md)


def test_rigkit_validate_by_url_alone_proves_the_lab_rig_and_restarts_it_by_its_command(
    validation_target, netns_rig, live_client, tmp_path
):
    """Issue 41: `rigkit validate --url` as a user types it for an endpoint rigkit did not deploy, against the lab rig
    known by its URL alone (the tunnel's local port: vLLM's API and /metrics), the profile it runs, and a restart
    command (compose down/up on the rig through `docker exec`, as a `kubectl rollout restart` would be given). The
    same tier proof and verdict as on a rig: every tier proven by the rig's own counters, the persistent one after the
    command's restart, the card PASS; client TTFT measured here, through the URL. Printed with -s: the
    card at a glance."""
    compose = f"cd {RIG_STACK_DIR} && docker-compose -p {COMPOSE_PROJECT}"
    restart = shlex.join(
        ["docker", "exec", netns_rig.container, "bash", "-c", f"{compose} down --remove-orphans && {compose} up -d"]
    )
    command = [
        sys.executable, "-m", "rigkit.cli", "validate",
        "--url", validation_target.base_url, "--profile", "cpu-lab", "--name", "lab-by-url",
        "--image", validation_target.image_digest, "--restart-command", restart, "--run-dir", str(tmp_path),
        "--data", f"validate_prompt_tokens={SESSION_TOKENS}", "--data", "validate_sessions=1",
        "--data", f"validate_prompt_kind={PROMPT_KIND}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    print(done.stdout, done.stderr)
    card = json.loads((tmp_path / "lab-by-url.card.json").read_text())
    assert done.returncode == 0, (card["failures"], done.stderr[-2000:])
    assert [(t["expected"], t["labels"], t["passed"]) for t in card["tiers"]] == [
        (tier, [tier], True) for tier in ("cold", "warm-gpu", "warm-connector", "warm-persistent")
    ]
    assert card["not_applicable"] == {} and card["repro"]["image_digest"] == validation_target.image_digest
    greedy = [check["verdict"] for tier in card["tiers"] for check in tier["greedy"]]
    assert greedy and set(greedy) <= {"same", "numerics"}, greedy
    assert card["ttft_client"]["transport"] == f"{CONTROLLER_TRANSPORT}, through {validation_target.base_url}"
    assert done.stdout.startswith("lab-by-url: PASS")


def test_decode_a_a_is_no_penalty(live_client, settings):
    """Both arms on the same server (an A/A run): the interleaved statistics must call it no penalty."""
    client = live_client
    ab = run_decode_ab(lambda arm: client, {"on": "same", "off": "same"}, settings, warmup=1, measured=5)
    for kind in ab.kinds:
        assert kind.on.n == 5 and kind.off.n == 5 and kind.on.mean > 0
    print(
        "decode A/A: "
        f"{[(k.kind, round(k.on.mean, 1), round(k.on.cv, 3), round(k.off.mean, 1), round(k.off.cv, 3)) for k in ab.kinds]}"
        f" -> {ab.verdict}"
    )
    assert ab.verdict == "no penalty", ab


def test_every_token_event_of_a_real_stream_is_counted(live_client):
    """Token events with empty text (partial UTF-8) still count. The timing side is a unit test
    (tests/remote/test_client.py, a server with known gaps): here the stream's tail after the last token
    (usage chunk, [DONE], the tunnel) varies by tens of ms on a busy machine."""
    client = live_client
    prompt = client.build_prompt(PromptSpec("narrative", 256, seed=11))
    result = client.stream_completion(prompt.text, max_tokens=64)
    # the detokenizer may merge a held-back token into the next event, never drop one
    assert result.completion_tokens == 64 and 0.9 * 64 <= result.chunks <= 64
    assert result.decode_tps and result.decode_tps > 0


def flip_sign_bits(path: Path) -> int:
    """Negate every value of a safetensors file in place (the sign bit of each element, little-endian): the file
    still loads, its KV is wrong. Returns the bytes changed."""
    data = bytearray(path.read_bytes())
    header_size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + header_size])
    flipped = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        size = SAFETENSORS_ELEMENT_BYTES[tensor["dtype"]]
        start, end = (8 + header_size + offset for offset in tensor["data_offsets"])
        for sign_byte in range(start + size - 1, end, size):
            data[sign_byte] ^= 0x80
            flipped += 1
    path.write_bytes(bytes(data))
    return flipped


SAFETENSORS_ELEMENT_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "F8_E5M2": 1}


def test_kv_corrupted_in_the_store_is_served_but_wrong_on_the_card(
    tier_run, validation_target, client, settings, tmp_path
):
    """The oracle can fail: the connector's stored KV is corrupted between store and load (every stored value
    negated while the stack is down, as a torn or rotted disk could leave it), then each session is asked again. The
    counters still prove warm-persistent (the prefix came from the store), and the card says served-but-wrong,
    with both texts, where they parted and the margin; the untouched run of the same sessions passed
    (test_card_from_the_real_run_passes_and_renders)."""
    store = validation_target.store_dir
    if store is None:
        pytest.skip("the target does not expose its connector store")
    changed: dict[str, int] = {}

    def corrupt() -> None:
        changed.update({str(path.relative_to(store)): flip_sign_bits(path) for path in store.rglob("*.safetensors")})

    validation_target.restart(while_down=corrupt)
    # one folder per stored prefix (the md5 of its token ids), one safetensors file per layer. A prompt shorter than one
    # block (the logprobs warm-up) stores no token: its folder is the md5 of nothing and its tensors have no element
    # (vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py, _generate_foldername_debug; the lab's vLLM)
    empty_entry = hashlib.md5(b"").hexdigest()
    assert changed and all(n > 0 for name, n in changed.items() if not name.startswith(empty_entry)), changed
    cold, warm_gpu = tier_run.tier(Tier.COLD), tier_run.tier(Tier.WARM_GPU)
    tolerance = tier_run.tier(Tier.WARM_PERSISTENT).tolerance  # measured in the clean run (the same verdict)
    corrupted = TierRun(Tier.WARM_PERSISTENT, reference=cold, same_path=warm_gpu, tolerance=tolerance)
    for prompt in cold.prompts:
        measured = measure(
            client,
            prompt.text,
            settings.output_tokens,
            timeout_s=300,
            seed=prompt.spec.seed,
            logprobs=settings.top_logprobs,
        )
        corrupted.measured.append(measured)
        corrupted.prompts.append(prompt)
        corrupted.labels.append(
            label(measured.window, Tier.WARM_PERSISTENT, connector_configured=True, after_restart=True)
        )
    validation = dataclasses.replace(
        tier_run, tiers=[t for t in tier_run.tiers if t.expected != Tier.WARM_PERSISTENT] + [corrupted]
    )
    result = corrupted.result()
    for check in result.greedy:
        print(
            f"corrupted store, session {check.session}: {check.verdict} against {check.reference}, first "
            f"difference token {check.first_difference_token}, shift {check.shift_nats} nats against tolerance "
            f"{check.tolerance_nats} ({check.tolerance_source}): {check.reference_text!r} / {check.text!r}"
        )
    assert [lab.tier for lab in corrupted.labels] == [Tier.WARM_PERSISTENT] * SESSIONS, [
        lab.proof for lab in corrupted.labels
    ]
    assert [c.verdict for c in result.greedy] == ["served-but-wrong"] * SESSIONS
    assert result.label == "served-but-wrong" and result.counters_label == "warm-persistent" and not result.passed
    card = to_card("lab-vllm", "lab-corrupted", validation, settings)
    write_card(tmp_path, card)
    render_run(tmp_path)
    md = (tmp_path / "lab-vllm.md").read_text()
    assert not card.passed and "**Verdict: FAIL**" in md
    assert "tier warm-persistent: served-but-wrong: its counters prove warm-persistent" in md
    assert "- ✗ served-but-wrong: warm-persistent, session " in md and " > tolerance " in md
    print(md)


# Next to last: it restarts the stack with an empty store.
def test_wiped_store_is_never_labelled_warm(tier_run, validation_target, client, settings):
    """A broken connector tier (its store wiped while the stack was down, as a lost or reformatted L2
    disk would leave it): the re-sent prompt must come out cold or retrieved-but-unused, never warm.

    The store is wiped while the stack is down: wiping it under a running ExampleConnector killed the
    engine in the lab (the container then restarts), which is a connector fault, not a tier."""
    if validation_target.store_dir is None:
        pytest.skip("the target does not expose its connector store")

    def wipe() -> None:
        for entry in validation_target.store_dir.iterdir():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

    validation_target.restart(while_down=wipe)
    prompt = tier_run.prompts[0]
    measured = measure(client, prompt.text, settings.output_tokens, timeout_s=300)
    verdict = label(measured.window, Tier.WARM_PERSISTENT, connector_configured=True, after_restart=True)
    assert verdict.tier in (Tier.RETRIEVED_BUT_UNUSED, Tier.COLD), verdict.proof
    assert not verdict.passed


# Very last: in the CI lab the engine did not survive this client abort (the decode tests that used to
# follow it lost their server); nothing may depend on the server after it.
def test_a_cut_prefill_is_reported_as_aborted(live_client):
    client = live_client
    prompt = client.build_prompt(PromptSpec("code", 6000, seed=5))
    result = client.stream_completion(prompt.text, max_tokens=4, timeout_s=0.01)
    assert result.aborted and result.abort_phase == "prefill" and result.ttft_s is None
    assert result.error.startswith("timeout:")
