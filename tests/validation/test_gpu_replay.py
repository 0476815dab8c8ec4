"""What one H200 served, replayed through rigkit's own validation (tests/gpu_replay.py): every profile's procedure
follows its tiers, and LMCache's own counters tell its store tier.

Records: fixtures/gpu-h200-vllm0.26/h200-2026-12-03-round1/<case>/record.jsonl.gz (vLLM 0.26.0, LMCache 0.5.3,
dummy weights; ../shared/gpu/h200-2026-12-03, its README), and the bench/gpu captures (gpu-check-*/, when present).
"""

from __future__ import annotations

import json

import pytest
from gpu_replay import GPU_FIXTURES, ReplayClient, read_record

from rigkit.prompts import on_a_block_edge
from rigkit.settings.hostdata import settings_for_host
from rigkit.validation.card.assemble import to_card
from rigkit.validation.card.rig import render_rig_markdown
from rigkit.validation.procedure import ValidationSettings, validate_tiers
from rigkit.validation.tiers import Tier

ROUND1 = GPU_FIXTURES / "h200-2026-12-03-round1"
DIGEST = "@sha256:" + "0" * 64
# the host data each recorded case was rendered from (bench/gpu: a single-H200 rig, every other knob at default)
CASES = {
    "native-offload": {"serving_profile": "native-offload", "serving_image": "vllm/vllm-openai" + DIGEST},
    # LMCache's chunk as rendered then (the profile's chunk_size moved to 1024 later: docs/benchmarks.md)
    "lmcache-mp-l1": {
        "serving_profile": "lmcache-mp",
        "serving_image": "lmcache/vllm-openai" + DIGEST,
        "chunk_size": 256,
    },
    "lmcache-mp-l2": {
        "serving_profile": "lmcache-mp",
        "serving_image": "lmcache/vllm-openai" + DIGEST,
        "l2_enabled": True,
        "chunk_size": 256,
    },
    "native-tiered": {"serving_profile": "native-tiered", "serving_image": "vllm/vllm-openai" + DIGEST},
}


def stack_for(case: str):
    return settings_for_host({**CASES[case], "model": "tiny", "allow_incubating": True})


def replay(case: str, not_applicable=None, store_bytes=None, chunk=None):
    client = ReplayClient(read_record(ROUND1 / case / "record.jsonl.gz"))
    restarts = []
    # round 1 ran without logprobs (the records hold none): the oracle compares outputs only, as it did there
    settings = ValidationSettings.from_data({"validate_top_logprobs": 0})
    validation = validate_tiers(
        client,
        lambda: restarts.append(case),
        settings,
        connector_configured=True,
        not_applicable=not_applicable,
        store_bytes=store_bytes,
        store_chunk_tokens=chunk,
    )
    return validation, restarts, to_card(case, "h200-2026-12-03", validation, settings)


@pytest.mark.parametrize("case", ["native-offload", "lmcache-mp-l1"])
def test_a_stack_where_nothing_persists_runs_no_restart_and_passes_saying_not_applicable_once(case):
    stack = stack_for(case)
    assert not stack.l2_active and list(stack.tiers_not_applicable) == ["warm-persistent"]
    validation, restarts, card = replay(case, stack.tiers_not_applicable)
    assert restarts == []
    assert [t.expected for t in validation.tiers] == [Tier.COLD, Tier.WARM_GPU, Tier.WARM_CONNECTOR]
    assert card.passed, render_rig_markdown(card)
    text = render_rig_markdown(card)
    assert text.count("not applicable") == 1
    assert "not applicable | profile" in text and "nothing survives a restart" in text


@pytest.mark.parametrize("case", ["native-offload", "lmcache-mp-l1"])
def test_demanding_the_persistent_tier_of_such_a_stack_fails_its_card_as_on_the_h200(case):
    """The guard's other side: the same record, the step run anyway (rigkit before this fix): every warm-persistent
    window recomputed every token, labelled retrieved-but-unused, and the card failed."""
    validation, restarts, card = replay(case, not_applicable={})
    assert restarts == [case] and not card.passed
    assert set(validation.tier(Tier.WARM_PERSISTENT).result().labels) == {"retrieved-but-unused"}


@pytest.mark.parametrize("case", ["lmcache-mp-l2", "native-tiered"])
def test_a_stack_with_a_disk_tier_is_asked_for_it_after_a_restart(case):
    stack = stack_for(case)
    assert stack.l2_active and stack.tiers_not_applicable == {}
    validation, restarts, card = replay(case, stack.tiers_not_applicable)
    assert restarts == [case] and card.passed and "not applicable" not in render_rig_markdown(card)
    assert validation.tier(Tier.WARM_PERSISTENT).result().labels == ["warm-persistent"] * 3


def test_lmcache_0_5_3_tells_l1_and_l2_by_its_own_counters_on_the_h200():
    validation, _, card = replay("lmcache-mp-l2", {})
    connector, persistent = card.tier("warm-connector"), card.tier("warm-persistent")
    assert connector.store_tier == "LMCache L1, by LMCache's counters"
    assert persistent.store_tier == "LMCache L2, by LMCache's counters"
    assert "chunks loaded +13, of them from L2 (prefetch loads) +13: served from L2" in persistent.proofs[0].text
    assert "(LMCache L2, by LMCache's counters) ✓" in render_rig_markdown(card)
    assert "inferred" not in render_rig_markdown(card)


def test_lmcache_capacity_divides_by_the_whole_chunks_it_stored():
    """The store grew 3 x 13 chunks of 4 MiB (16 KiB per token x 256) on the H200; per prompt token that reads 15.6
    KB/token, per token LMCache stored (whole 256-token chunks) 16.4 (the README's figures)."""
    grown = iter([0, 3 * 13 * 4 * 2**20])
    stack = stack_for("lmcache-mp-l2")
    assert stack.store_chunk_tokens == 256
    _, _, per_chunk = replay("lmcache-mp-l2", {}, store_bytes=lambda: next(grown), chunk=stack.store_chunk_tokens)
    assert per_chunk.capacity.tokens_stored == 3 * 13 * 256
    assert per_chunk.capacity.kb_per_token == pytest.approx(16.384, abs=0.01)
    assert "whole 256-token chunks" in per_chunk.capacity.source


# --- the GPU check's own captures (bench/gpu: collect.py -> fixtures/gpu-h200-vllm0.26/gpu-check-*) -----------------

CHECKS = sorted(path for path in GPU_FIXTURES.glob("gpu-check-*") if (path / "stacks.json").exists())


def checked_stacks():
    for check in CHECKS:
        for info in json.loads((check / "stacks.json").read_text())["stacks"]:
            if (check / info["case"] / "result.json").exists() and "tiers" in json.loads(
                (check / info["case"] / "result.json").read_text()
            ):
                yield pytest.param(check, info, id=f"{check.name}/{info['case']}")


@pytest.mark.parametrize("check,info", list(checked_stacks()))
def test_each_stack_of_the_gpu_check_replays_to_the_labels_and_verdict_the_h200_gave(check, info):
    recorded = json.loads((check / info["case"] / "result.json").read_text())
    client = ReplayClient(read_record(check / info["case"] / "record.jsonl.gz"), model=info["served_model_name"])
    settings = ValidationSettings.from_data(json.loads((check / "summary.json").read_text()).get("validation", {}))
    validation = validate_tiers(
        client,
        lambda: None,
        settings,
        connector_configured=info["connector"],
        not_applicable=info["not_applicable"],
        store_chunk_tokens=info["store_chunk_tokens"],
    )
    card = to_card(info["case"], check.name, validation, settings, info["connector"])
    assert [t.result().labels for t in validation.tiers] == [t["labels"] for t in recorded["tiers"]]
    assert [t.result().label for t in validation.tiers] == [
        (t["labels"][0] if len(set(t["labels"])) == 1 else f"inconsistent: {'/'.join(t['labels'])}")
        if all(g.get("verdict", "same" if g["same"] else "served-but-wrong") != "served-but-wrong" for g in t["greedy"])
        else "served-but-wrong"
        for t in recorded["tiers"]
    ]
    assert card.passed == recorded["card_passed"]
    assert set(card.not_applicable) == set(info["not_applicable"])


GPU_CHECK = GPU_FIXTURES / "gpu-check-2026-12-03"


def card_verdicts(summary: dict) -> dict[str, bool]:
    """Each stack's card verdict in a GPU check's summary.json."""
    return {
        case: entry["card_passed"]
        for case, entry in summary.items()
        if isinstance(entry, dict) and "card_passed" in entry
    }


def test_the_h200_check_passed_every_gpu_profile_and_caught_the_corrupted_tier():
    """vLLM 0.26.0 + LMCache 0.5.3 on one H200, a model trained on the device (bench/gpu): every GPU profile's card
    PASS, each tier proven or not applicable; the fs tier overwritten while the stack was down is served-but-wrong
    at warm-persistent although its counters prove the tier."""
    summary = json.loads((GPU_CHECK / "summary.json").read_text())
    assert summary["weights"] == "real" and all(summary["ready"].values())
    verdicts = {
        case: entry["card_passed"] for case, entry in summary.items() if case not in ("ready", "weights", "validation")
    }
    assert verdicts == {**{case: True for case in verdicts}, "native-tiered-corrupt": False}
    assert "vllm 0.26.0 lmcache 0.5.3" in (GPU_CHECK / "versions.txt").read_text()
    corrupt = json.loads((GPU_CHECK / "native-tiered-corrupt" / "result.json").read_text())
    assert corrupt["corrupted"]["files"] > 0
    persistent = corrupt["tiers"][-1]
    assert persistent["expected"] == "warm-persistent" and set(persistent["labels"]) == {"warm-persistent"}
    assert "served-but-wrong" in [check["verdict"] for check in persistent["greedy"]]
    assert all(tier["passed"] for tier in corrupt["tiers"][:-1])
    shared = json.loads((GPU_CHECK / "kv-share" / "result.json").read_text())
    assert [pair["asked"]["labels"] for pair in shared["pairs"]] == [["warm-shared"] * 3] * 2


MODEL_SOURCE_CHECK = GPU_FIXTURES / "gpu-check-2026-12-03-model-source"


def test_the_h200_check_rendered_with_a_staged_model_source_still_passed_and_caught_the_corrupted_tier():
    """The same check rendered as main renders a staged model (model_source): the engine loads /model (the model
    directory bind-mounted read-only there), the container offline by its rendered environment, no hub token; code
    sessions (the device's model learnt one text of each kind). Every card PASS but the corrupted copy, which its
    counters prove warm-persistent and the oracle calls served-but-wrong."""
    summary = json.loads((MODEL_SOURCE_CHECK / "summary.json").read_text())
    assert summary["weights"] == "real" and all(summary["ready"].values())
    assert summary["model_mount"] == "<model> bind-mounted at /model, read-only"
    assert summary["validation"] == {"validate_prompt_kind": "code"}
    verdicts = card_verdicts(summary)
    assert len(verdicts) == 9 and verdicts == {**{case: True for case in verdicts}, "native-tiered-corrupt": False}
    for info in json.loads((MODEL_SOURCE_CHECK / "stacks.json").read_text())["stacks"]:
        env = json.loads((MODEL_SOURCE_CHECK / info["case"] / "run-env.json").read_text())
        assert env["RIGKIT_MODEL"] == "/model" and env["HF_HUB_OFFLINE"] == "1" and "HF_TOKEN" not in env
        assert info["model_mount"]["read_only"] and info["model_mount"]["target"] == "/model"
    corrupt = json.loads((MODEL_SOURCE_CHECK / "native-tiered-corrupt" / "result.json").read_text())
    persistent = corrupt["tiers"][-1]
    assert persistent["expected"] == "warm-persistent" and set(persistent["labels"]) == {"warm-persistent"}
    assert [check["verdict"] for check in persistent["greedy"]].count("served-but-wrong") == 2
    assert all(tier["passed"] for tier in corrupt["tiers"][:-1])


def test_only_the_profiles_declaring_l1_in_shm_made_a_dev_shm_segment_and_the_restart_removed_only_its_own():
    """All ten engines up: four /dev/shm/vllm_offload_*.mmap, one per TieringOffloadingSpec engine (native-tiered, the
    kv_share pair, the corrupt copy), none for native-offload or LMCache, as profiles.yaml declares. native-tiered's
    restart: its stop left its segment (shutdown timeout 0), rigkit's cleanup removed that one and kept the three that
    running engines map."""
    stacks = json.loads((GPU_CHECK / "stacks.json").read_text())["stacks"]
    declared = [s["case"] for s in stacks if s["l1_in_shm"]]
    assert declared == ["native-tiered", "kv-share-a", "kv-share-b", "native-tiered-corrupt"]
    assert not stack_for("native-offload").profile.connector.l1_in_shm
    results = [GPU_CHECK / s["case"] / "result.json" for s in stacks]
    readies = [
        event
        for path in results
        if path.exists()
        for event in json.loads(path.read_text())["events"]
        if event["event"] == "ready"
    ]
    assert max(len(event["shm"]) for event in readies) == len(declared)
    (stop,) = [
        e
        for e in json.loads((GPU_CHECK / "native-tiered" / "result.json").read_text())["events"]
        if e["event"] == "stop"
    ]
    assert len(stop["shm_left_by_stop"]) == 4 and len(stop["shm_after_cleanup"]) == 3
    assert stop["cleanup_output"].count("removed stale") == 1
    assert set(stop["shm_after_cleanup"]) < set(stop["shm_left_by_stop"])


def warm_gpu_sessions():
    """(check, case, has a connector, prompt tokens, block size, label) of every warm-GPU session the H200 served."""
    for check in CHECKS:
        connectors = {s["case"]: s["connector"] for s in json.loads((check / "stacks.json").read_text())["stacks"]}
        for result in sorted(check.glob("*/result.json")):
            recorded = json.loads(result.read_text())
            for tier in recorded.get("tiers", []):
                if tier["expected"] == "warm-gpu":
                    block = int(tier["windows"][0]["cache_config"]["block_size"])
                    for tokens, label in zip(tier["prompt_tokens"], tier["labels"]):
                        yield check.name, recorded["case"], connectors[recorded["case"]], tokens, block, label


def test_on_the_h200_a_warm_gpu_repeat_reads_mixed_exactly_when_a_connector_holds_a_prompt_of_whole_blocks():
    """vLLM recomputes a prompt's last token, so a prompt of k x block tokens gets its last block from the connector
    (gpu-check-2026-12-03-block-edge: native-offload and the corrupt copy, 3,536 = 221 x 16, card FAIL on that alone).
    Every warm-GPU session of every check agrees, and on_a_block_edge, which build_prompt steers clear of, names it."""
    sessions = list(warm_gpu_sessions())
    mixed = [s for s in sessions if s[-1] == "mixed"]
    assert len(mixed) == 2 and {s[1] for s in mixed} == {"native-offload", "native-tiered-corrupt"}
    for check, case, connector, tokens, block, label in sessions:
        whole_blocks_with_a_connector = connector and tokens % block == 0
        assert (label == "mixed") == whole_blocks_with_a_connector, (check, case, tokens, block, label)
        assert label == "warm-gpu" or on_a_block_edge(tokens, block)


OFF_BLOCK_EDGES_CHECK = GPU_FIXTURES / "gpu-check-2026-12-03-off-block-edges"


def test_the_h200_check_with_prompts_off_block_edges_passed_every_profile_and_failed_the_corrupted_one():
    """The same check after build_prompt stepped off k x block (the engine's block size from its /metrics): no prompt
    of the 72 measured sat on a block edge, every card PASS but the corrupted copy, served-but-wrong in all 3 sessions."""
    summary = json.loads((OFF_BLOCK_EDGES_CHECK / "summary.json").read_text())
    verdicts = card_verdicts(summary)
    assert len(verdicts) == 9 and verdicts == {**{case: True for case in verdicts}, "native-tiered-corrupt": False}
    sizes = [
        (tokens, int(tier["windows"][0]["cache_config"]["block_size"]))
        for result in OFF_BLOCK_EDGES_CHECK.glob("*/result.json")
        for tier in json.loads(result.read_text()).get("tiers", [])
        for tokens in tier["prompt_tokens"]
    ]
    assert len(sizes) == 72 and not [size for size in sizes if on_a_block_edge(*size)]
    corrupt = json.loads((OFF_BLOCK_EDGES_CHECK / "native-tiered-corrupt" / "result.json").read_text())
    assert [check["verdict"] for check in corrupt["tiers"][-1]["greedy"]] == ["served-but-wrong"] * 3
