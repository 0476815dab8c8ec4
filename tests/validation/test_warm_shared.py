"""The warm-shared tier (rigkit.validation.tiers.label_shared, rigkit.validation.warm_shared, rigkit.validation.card.shared).

Labels are checked on the REAL capture of two vLLM engines on one H200 sharing an fs root
(tests/fixtures/gpu-h200-vllm0.26/shared-fs-two-servers). The pair loop runs against tests/fake_openai.py servers
whose /metrics are that capture's text with MADE-UP counter values, moved request by request as a fleet sharing one
connector store would move them (MadeUpSharedStoreFleet: the rules are written there, not measured).
"""

from __future__ import annotations

import re
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Optional

import pytest
from card_samples import make_card
from fake_openai import FakeOpenAI

from rigkit.errors import ConfigError
from rigkit.metrics import Delta, delta, parse
from rigkit.prompts import PromptSpec
from rigkit.remote.client import ServingClient
from rigkit.validation.card import RigCard, TTFTClient, load_cards, render_run, write_card
from rigkit.validation.card.fleet import render_fleet_markdown
from rigkit.validation.card.rig import render_rig_markdown
from rigkit.validation.card.store import record_shared
from rigkit.validation.procedure import LOGPROBS_WARMUP_PROMPT, ValidationSettings
from rigkit.validation.tiers import Tier, label, label_shared
from rigkit.validation.warm_shared import ask, ordered_pairs, pair_line, prefill, run_pairs, sharing_groups

SHARED_FS = Path(__file__).parents[1] / "fixtures" / "gpu-h200-vllm0.26" / "shared-fs-two-servers"
SETTINGS = ValidationSettings.from_data({"validate_sessions": 1, "validate_seed": 1234})


def capture(name: str) -> str:
    return (SHARED_FS / f"{name}.txt").read_text()


def window(before: str, after: str) -> Delta:
    return delta(parse(capture(before)), parse(capture(after)))


# --- labels on the real capture ---------------------------------------------------------------------------------


def test_the_second_engine_reading_the_first_ones_fs_root_is_warm_shared():
    """B never saw the prompt: its GPU hits stayed 0 and its external hits grew by 2,976 of 2,990 (H200 capture)."""
    verdict = label_shared(window("B-0", "B-1"))
    assert verdict.tier == Tier.WARM_SHARED and verdict.passed, verdict.proof
    assert (verdict.gpu_hits, verdict.external_hits, verdict.external_kv_transfer_tokens) == (0, 2976, 2976)
    # vLLM re-counted B's prefix-cache queries while it promoted the blocks: no ratio is printed for them
    assert "queries re-counted: 41860 for 2990 prompt tokens" in verdict.proof
    assert "external hits +2976/2990 queried" in verdict.proof


def test_the_first_engines_prefill_is_cold_and_asked_as_shared_it_is_retrieved_but_unused():
    """A's own prefill window (nothing hit): cold by the tier rules; judged as a shared tier it is a miss."""
    assert label(window("A-0", "A-1"), Tier.COLD, connector_configured=True).tier == Tier.COLD
    missed = label_shared(window("A-0", "A-1"))
    assert missed.tier == Tier.RETRIEVED_BUT_UNUSED and not missed.passed
    assert "external hits +0/2990 queried" in missed.proof
    assert label_shared(window("A-0", "A-1"), shared_configured=False).tier == Tier.COLD


def test_a_gpu_hit_on_b_is_not_shared_even_with_external_hits_made_up_from_the_capture():
    """MADE UP from B's real window: 1,024 of the tokens served from B's own GPU pool as well. B already had part
    of the prompt, so the window proves nothing shared, however many external hits it also shows."""
    real = window("B-0", "B-1")
    partly_local = replace(
        real,
        prefix_cache_hits=1024.0,
        prompt_tokens_by_source={**real.prompt_tokens_by_source, "local_cache_hit": 1024.0},
    )
    verdict = label_shared(partly_local)
    assert verdict.tier == Tier.NOT_SHARED and not verdict.passed
    assert "B already had the prompt" in verdict.proof and verdict.external_hits == 2976


# --- the pair loop against fake servers whose /metrics move like a shared store's -------------------------------

COUNTER_SAMPLE = re.compile(r"^(?P<name>vllm:[a-z_]+_total)\{(?P<labels>[^}]*)\} \S+$", re.M)


def capture_with(counters: dict[str, float], template: str) -> str:
    """The capture's text with the counters replaced: key `name` or `name[source]` for the by-source families."""

    def put(match: re.Match) -> str:
        source = re.search(r'source="([^"]+)"', match["labels"])
        key = match["name"] + (f"[{source.group(1)}]" if source else "")
        return f"{match['name']}{{{match['labels']}}} {counters[key]}" if key in counters else match.group(0)

    return COUNTER_SAMPLE.sub(put, template)


class MadeUpSharedStoreFleet:
    """Fake rigs sharing one connector store (MADE-UP rules, modelled on the captures): a prompt a rig holds in its
    GPU pool is a GPU prefix hit; else one in the store a prefill put there is an external hit; else it is computed
    and stored. `shared=False`: every rig has a store of its own. `prefill_reaches` names rigs that also get each
    prefill into their GPU pool (a router sending it there too). `already_warm`: rigs whose first request is a
    GPU hit (a salt reused: the prompt was in its pool and the store before)."""

    def __init__(
        self,
        stack: ExitStack,
        rigs=("rig1", "rig2"),
        shared: bool = True,
        prefill_reaches: tuple = (),
        already_warm: tuple = (),
    ):
        self.shared, self.prefill_reaches, self.already_warm = shared, prefill_reaches, set(already_warm)
        self.template = capture("B-0")
        self.servers = {rig: stack.enter_context(FakeOpenAI()) for rig in rigs}
        self.gpu = {rig: set() for rig in rigs}
        self.stores = {rig: set() for rig in rigs}
        self.counters = {rig: {} for rig in rigs}
        self.origin: dict[str, str] = {}  # prompt -> the rig that computed it
        for rig, server in self.servers.items():
            server.on_completion = lambda body, rig=rig: self.completion(rig, body["prompt"])
            self.show(rig)

    def store_of(self, rig: str) -> set:
        return self.stores["rig1" if self.shared else rig]

    def count(self, rig: str, **grown: float) -> None:
        for key, value in grown.items():
            name = {
                "queries": "vllm:prefix_cache_queries_total",
                "hits": "vllm:prefix_cache_hits_total",
                "ext_queries": "vllm:external_prefix_cache_queries_total",
                "ext_hits": "vllm:external_prefix_cache_hits_total",
            }.get(key, f"vllm:prompt_tokens_by_source_total[{key}]")
            self.counters[rig][name] = self.counters[rig].get(name, 0.0) + value
        self.show(rig)

    def show(self, rig: str) -> None:
        self.servers[rig].metrics_text = capture_with(self.counters[rig], self.template)

    def completion(self, rig: str, prompt: str) -> None:
        tokens = len(prompt) // 4
        if rig in self.already_warm and prompt != LOGPROBS_WARMUP_PROMPT:  # it had the prompt before: pool and store
            self.already_warm.discard(rig)
            self.gpu[rig].add(prompt)
            self.store_of(rig).add(prompt)
        if prompt in self.gpu[rig]:
            self.count(rig, queries=tokens, hits=tokens, local_cache_hit=tokens)
        elif prompt in self.store_of(rig):
            self.count(rig, queries=tokens, ext_queries=tokens, ext_hits=tokens, external_kv_transfer=tokens)
        else:
            self.count(rig, queries=tokens, ext_queries=tokens, local_compute=tokens)
            self.store_of(rig).add(prompt)
            self.origin[prompt] = rig
            for other in self.prefill_reaches:
                self.gpu[other].add(prompt)
        self.gpu[rig].add(prompt)

    def garble_shared(self, rig: str) -> None:
        """`rig` answers other words for every prompt another rig computed, as a store handing it wrong KV would."""
        self.servers[rig].token_word = lambda body: "w" if self.origin.get(body["prompt"]) == rig else "garbled"

    def clients(self) -> dict[str, ServingClient]:
        return {rig: ServingClient(server.url, model="tiny") for rig, server in self.servers.items()}

    def run(self, groups: Optional[list] = None):
        clients = self.clients()
        return run_pairs(clients, {rig: SETTINGS for rig in clients}, groups or [list(clients)])


def test_each_rig_is_asked_what_the_other_prefilled_and_proves_it_by_its_own_counters():
    with ExitStack() as stack:
        fleet = MadeUpSharedStoreFleet(stack)
        pairs = fleet.run()
    assert [(p.source, p.target, p.label, p.passed) for p in pairs] == [
        ("rig1", "rig2", "warm-shared", True),
        ("rig2", "rig1", "warm-shared", True),
    ]
    for pair in pairs:
        assert pair.prefill.labels == ["cold"]
        (proof,) = pair.asked.proofs
        assert proof.gpu_hits == 0 and proof.external_hits == pair.asked.prompt_tokens[0] > 0
        assert [check.same for check in pair.asked.greedy] == [True]
    # the prompts were salted afresh for each pair: the same body seed, another session
    prompts = [body["prompt"] for server in fleet.servers.values() for body in server.completions[1:]]
    assert len(set(prompts)) == 2 and all(prompt.startswith("Session ") for prompt in prompts)


def test_each_rig_gets_one_unmeasured_logprobs_request_before_any_pair_and_sharing_no_prefix():
    """vLLM CPU compiles its logprobs path at the first request asking for them (10.7 s in the lab): that lands in
    a one-token warm-up of each rig, not in the first pair's TTFT."""
    with ExitStack() as stack:
        fleet = MadeUpSharedStoreFleet(stack)
        pairs = fleet.run()
    for server in fleet.servers.values():
        first, *measured = server.completions
        assert first["prompt"] == LOGPROBS_WARMUP_PROMPT and first["max_tokens"] == 1
        assert first["logprobs"] == SETTINGS.top_logprobs > 0
        assert measured and all(body["prompt"][0] != LOGPROBS_WARMUP_PROMPT[0] for body in measured)
    assert [len(pair.prefill.prompt_tokens) + len(pair.asked.prompt_tokens) for pair in pairs] == [2, 2]


def test_rigs_with_stores_of_their_own_are_retrieved_but_unused():
    with ExitStack() as stack:
        pairs = MadeUpSharedStoreFleet(stack, shared=False).run()
    assert [(p.label, p.passed) for p in pairs] == [("retrieved-but-unused", False)] * 2
    assert pairs[0].asked.proofs[0].external_hits == 0


def test_a_prompt_that_reached_b_before_it_was_asked_is_not_shared():
    with ExitStack() as stack:
        pairs = MadeUpSharedStoreFleet(stack, prefill_reaches=("rig2",)).run()
    by_target = {p.target: p for p in pairs}
    assert by_target["rig2"].label == "not-shared" and not by_target["rig2"].passed
    assert by_target["rig1"].label == "warm-shared" and by_target["rig1"].passed


def test_b_answering_otherwise_than_a_is_served_but_wrong():
    with ExitStack() as stack:
        fleet = MadeUpSharedStoreFleet(stack)
        fleet.garble_shared("rig2")
        pairs = fleet.run()
    by_target = {p.target: p for p in pairs}
    assert by_target["rig1"].label == "warm-shared" and by_target["rig1"].passed
    wrong = by_target["rig2"]
    assert wrong.asked.counters_label == "warm-shared" and wrong.label == "served-but-wrong" and not wrong.passed
    assert wrong.asked.greedy[0].cold_text.startswith(" w0") and wrong.asked.greedy[0].text.startswith(" garbled0")


def test_a_prefill_that_was_not_cold_fails_the_pair_whatever_b_shows():
    with ExitStack() as stack:
        pairs = MadeUpSharedStoreFleet(stack, already_warm=("rig1",)).run()
    first = pairs[0]
    assert (first.source, first.prefill.labels, first.asked.label) == ("rig1", ["warm-gpu"], "warm-shared")
    assert not first.passed and "prefill on rig1 labelled warm-gpu (not cold)" in pair_line(first)


def test_pairs_stay_within_one_store():
    assert ordered_pairs([["a", "b", "c"], ["d", "e"]]) == [
        ("a", "b"),
        ("a", "c"),
        ("b", "a"),
        ("b", "c"),
        ("c", "a"),
        ("c", "b"),
        ("d", "e"),
        ("e", "d"),
    ]
    assert sharing_groups({"r1": "nas:/kv", "r2": None, "r3": "nas:/kv", "r4": "other:/kv"}) == [["r1", "r3"]]


@pytest.mark.parametrize("sources", [{"rig1": "nas:/kv", "rig2": None}, {"rig1": "nas:/a", "rig2": "nas:/b"}, {}])
def test_fewer_than_two_rigs_on_one_store_are_refused_naming_kv_share(sources):
    with pytest.raises(ConfigError) as refused:
        sharing_groups(sources)
    assert refused.value.field == "kv_share" and "kv_share=true" in str(refused.value)


def test_a_prompt_too_long_for_a_rig_is_refused_before_any_prefill():
    with ExitStack() as stack:
        fleet = MadeUpSharedStoreFleet(stack)
        clients = fleet.clients()
        too_long = ValidationSettings.from_data({"validate_sessions": 1, "validate_prompt_tokens": 9000})
        with pytest.raises(ConfigError) as refused:
            run_pairs(clients, {rig: too_long for rig in clients}, [list(clients)])
        assert refused.value.field == "validate_prompt_tokens"
        assert not any(server.completions for server in fleet.servers.values())


# --- the real capture through the pair's two steps ------------------------------------------------------------


def test_the_h200_capture_walked_as_a_pair_is_warm_shared():
    """The fakes show the REAL captures: A's idle then after-prefill text, B's idle then after-ask text."""
    with FakeOpenAI() as a, FakeOpenAI() as b:
        a.metrics_text, b.metrics_text = capture("A-0"), capture("B-0")
        a.on_completion = lambda body: setattr(a, "metrics_text", capture("A-1"))
        b.on_completion = lambda body: setattr(b, "metrics_text", capture("B-1"))
        prefilled = prefill("gpu-a", ServingClient(a.url, model="tiny"), [PromptSpec("narrative", 2990, 7)], 16, 60)
        pair = ask(prefilled, "gpu-b", ServingClient(b.url, model="tiny"), 16, 60, logprobs=0, ceiling_nats=0.5)
    assert pair.prefill.labels == ["cold"] and pair.asked.labels == ["warm-shared"] and pair.passed
    assert pair.asked.proofs[0].external_hits == 2976
    assert [(r.kind, r.target_tokens, r.seed) for r in pair.prompts] == [("narrative", 2990, 7)]  # to repeat it
    assert a.completions[0]["prompt"] == b.completions[0]["prompt"]


# --- the cards -----------------------------------------------------------------------------------------------------


def test_the_pairs_land_in_b_cards_and_the_fleet_card_has_a_row_per_pair(tmp_path):
    with ExitStack() as stack:
        fleet = MadeUpSharedStoreFleet(stack)
        fleet.garble_shared("rig1")  # rig2 -> rig1 is served-but-wrong
        pairs = fleet.run()
    write_card(tmp_path, make_card(rig="rig2"))  # validate.py's card for rig2 in the same run
    client = TTFTClient(transport="rig1's loopback", tolerance_rel=0.05, tolerance_abs_s=0.005)
    record_shared(tmp_path, pairs, {"rig1": client, "rig2": client})
    render_run(tmp_path)
    cards = {card.rig: card for card in load_cards(tmp_path)}
    assert [(p.source, p.label) for p in cards["rig2"].shared] == [("rig1", "warm-shared")]
    assert cards["rig2"].tiers and cards["rig2"].passed  # validate.py's tiers kept, its pair passes
    assert [(p.source, p.label) for p in cards["rig1"].shared] == [("rig2", "served-but-wrong")]
    assert not cards["rig1"].tiers and not cards["rig1"].passed and cards["rig1"].ttft_client == client

    fleet_md = (tmp_path / "fleet.md").read_text()
    assert "## Warm-shared tier (prefilled on rig A, asked of rig B)" in fleet_md
    rows = [line for line in fleet_md.splitlines() if " → " in line and line.startswith("| rig")]
    assert [row.split(" | ")[:2] for row in rows] == [
        ["| rig1 → rig2", "warm-shared ✓"],
        ["| rig2 → rig1", "served-but-wrong ✗"],
    ]
    assert "GPU prefix hits +0/" in rows[0] and "its prefills for the other rigs" in rows[0] and "1/1 same" in rows[0]
    assert "0/1 same" in rows[1]
    rig1_md = (tmp_path / "rig1.md").read_text()
    assert "**Verdict: FAIL**" in rig1_md and "- ✗ warm-shared rig2 → rig1: labelled served-but-wrong" in rig1_md
    # one source of truth: the rendering is the JSON's alone
    assert render_fleet_markdown(list(cards.values())) == fleet_md
    assert render_rig_markdown(RigCard.model_validate_json((tmp_path / "rig1.card.json").read_text())) == rig1_md


def test_a_fleet_card_without_pairs_has_no_warm_shared_section():
    assert "Warm-shared" not in render_fleet_markdown([make_card(rig="rig1"), make_card(rig="rig2")])
