"""rigkit.rollout.proof: the cache proof, validate.py's procedure cut short, against the recorded /metrics of a real
vLLM CPU run (tests/fixtures/metrics, test_validation)."""

from __future__ import annotations

from types import SimpleNamespace

from fake_openai import FakeOpenAI
from recorded_run import RecordedRun

import rigkit.rollout.proof
from rigkit.remote.client import ServingClient
from rigkit.rollout.proof import Proof, proof_verdict, prove_cache
from rigkit.validation.tiers import Tier


def test_the_cache_proof_passes_on_a_real_runs_counters():
    with FakeOpenAI() as server:
        recorded = RecordedRun(server)
        proof = prove_cache(ServingClient(server.url, model="tiny"), {"validate_seed": 1234}, True)
    assert proof.passed, proof.words
    assert "warm-gpu +" in proof.words and "warm-connector +" in proof.words and "fillers" in proof.words
    assert recorded.step == "04-after-warm-connector"  # no restart: the short proof stops at the connector tier


class NoEviction(RecordedRun):
    """After the fillers the session prompt moves no counter: neither the GPU pool nor the connector served it."""

    def completion(self, body: dict) -> None:
        if self.step == "03-after-fillers" and body["prompt"] == self.session_prompt:
            return
        super().completion(body)


def test_the_cache_proof_fails_when_the_connector_tier_is_not_proven():
    with FakeOpenAI() as server:
        NoEviction(server)
        proof = prove_cache(ServingClient(server.url, model="tiny"), {"validate_seed": 1234}, True)
    assert not proof.passed and "warm-connector expected, measured" in proof.words, proof.words


def test_a_proof_that_cannot_reach_the_engine_fails_in_its_words():
    proof = prove_cache(ServingClient("http://127.0.0.1:9", model="tiny"), {}, True, ready_timeout_s=0.5)
    assert proof.passed is False and "not ready after" in proof.words, proof.words
    assert proof.words.startswith("ServingError: "), proof.words


# --- proof_verdict on plain values: what the mutation check (bench/mutation.py) found no test holding ---------


def tier_run(tier: Tier, gpu_hits=0, external_hits=0, passed=True, aborted=(), measured: Tier = None):
    label = SimpleNamespace(tier=measured or tier, gpu_hits=gpu_hits, external_hits=external_hits)
    return SimpleNamespace(labels=[label], result=lambda: SimpleNamespace(passed=passed, aborted=list(aborted)))


def validation(*runs, failures=(), fillers_sent=5):
    by_tier = {run.labels[-1].tier if run.labels else None: run for run in runs}
    return SimpleNamespace(failures=list(failures), fillers_sent=fillers_sent, tier=by_tier.get)


COLD_RUN, WARM_GPU_RUN = tier_run(Tier.COLD), tier_run(Tier.WARM_GPU, gpu_hits=12)


def test_a_proof_without_a_connector_proves_the_gpu_tier_only_and_says_so():
    assert proof_verdict(validation(COLD_RUN, WARM_GPU_RUN), connector_configured=False) == Proof(
        True, "cache proof passed: warm-gpu +12 GPU hits (no KV connector: GPU prefix cache only)"
    )
    connector = tier_run(Tier.WARM_CONNECTOR, external_hits=30)
    assert proof_verdict(validation(COLD_RUN, WARM_GPU_RUN, connector), connector_configured=True) == Proof(
        True, "cache proof passed: warm-gpu +12 GPU hits, warm-connector +30 external hits after 5 fillers"
    )


def test_a_failed_proof_names_every_tier_it_could_not_prove():
    missed = tier_run(Tier.WARM_CONNECTOR, passed=False, aborted=("prefill", "decode"), measured=Tier.COLD)
    missed.labels[0].gpu_hits, missed.labels[0].external_hits = 0, 0
    runs = {Tier.WARM_GPU: SimpleNamespace(labels=[]), Tier.WARM_CONNECTOR: missed}
    proof = proof_verdict(SimpleNamespace(failures=["calibration: too short"], fillers_sent=5, tier=runs.get), True)
    assert proof == Proof(
        False,
        "calibration: too short; cold: not measured; warm-gpu: not measured; warm-connector "
        "expected, measured cold (GPU hits +0, external hits +0, request aborted in prefill)",
    )
    assert proof.passed is False


def test_a_tier_that_failed_without_an_aborted_request_names_only_its_counters():
    missed = tier_run(Tier.WARM_GPU, gpu_hits=0, external_hits=16, passed=False, measured=Tier.WARM_CONNECTOR)
    runs = {Tier.COLD: COLD_RUN, Tier.WARM_GPU: missed}
    proof = proof_verdict(SimpleNamespace(failures=[], fillers_sent=5, tier=runs.get), False)
    assert proof == Proof(False, "warm-gpu expected, measured warm-connector (GPU hits +0, external hits +16)")


def test_the_short_proof_is_one_session_without_restart_soak_or_ab(monkeypatch):
    asked = []

    def validate_tiers(client, restart, settings, connector_configured):
        asked.append((restart, settings, connector_configured))
        return validation(COLD_RUN, WARM_GPU_RUN)

    monkeypatch.setattr(rigkit.rollout.proof, "validate_tiers", validate_tiers)
    ready = SimpleNamespace(wait_ready=lambda timeout_s: None)
    data = {"validate_sessions": 4, "validate_restart": True, "validate_decode_ab": True, "validate_soak_sessions": 2}
    assert prove_cache(ready, data, False).passed
    ((restart, settings, connector_configured),) = asked
    assert (
        restart,
        settings.sessions,
        settings.restart,
        settings.decode_ab,
        settings.soak_sessions,
        connector_configured,
    ) == (None, 1, False, False, 0, False)
