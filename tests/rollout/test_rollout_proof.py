"""rigkit.rollout.proof: the cache proof, validate.py's procedure cut short, against the recorded /metrics of a real
vLLM CPU run (tests/fixtures/metrics, test_validation)."""

from __future__ import annotations

from fake_openai import FakeOpenAI
from recorded_run import RecordedRun
from rigkit.remote.client import ServingClient
from rigkit.rollout.proof import prove_cache


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
    assert not proof.passed and "not ready after" in proof.words, proof.words
