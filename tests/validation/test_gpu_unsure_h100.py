"""Issue 39's open end on an H100: a model as unsure as the issue's (the tiny Qwen3 trained on Python's standard library
only until its loss was under 1.5, TRAIN_LOSS; median top-1 margin 0.94 nats on the code prompts, a third of the
tokens under 0.5; the issue's model: 0.69 and 40 %), validated at 3,500 tokens with the power self-test
(tests/fixtures/gpu-h100-vllm0.26/gpu-check-2026-12-06-unsure, bench/gpu).

What it showed, held here: every clean card passes on so unsure a model (no near tie read as wrong); the native fs
tier, bit-exact, catches all four damages; on LMCache's L2 (tolerance 3 x its cached-vs-fresh band) the one-layer damage
moved the logprobs less than the tolerance and was missed, and the card says so instead of claiming "few-bytes" (caught
only because it gives NaN logits) as its smallest catch. Replayed through rigkit's validate_tiers, the same verdicts."""

from __future__ import annotations

import json
import statistics

import pytest
from gpu_replay import GPU_FIXTURES, replay_with_power, top_margins

from rigkit.validation import power
from rigkit.validation.card import RigCard, render_run, write_card
from rigkit.validation.power import DAMAGE_NAMES, smallest_caught

RUN = GPU_FIXTURES.parent / "gpu-h100-vllm0.26" / "gpu-check-2026-12-06-unsure"
STACKS = ["native-offload-3500", "native-tiered-3500", "lmcache-mp-l2-3500"]


def card(name: str) -> RigCard:
    return RigCard.model_validate_json((RUN / "cards" / f"{name}.card.json").read_text())


def margins() -> list[float]:
    return top_margins([RUN / "native-offload-3500" / "record.jsonl.gz"])


def test_the_model_is_about_as_unsure_of_the_prompts_as_the_issues():
    trained = json.loads((RUN / "training.json").read_text())
    assert trained["corpus"] == "stdlib" and trained["final_loss"] > 1.0
    found = margins()
    near_ties = sum(m < 0.5 for m in found) / len(found)
    print(f"median top-1 margin {statistics.median(found):.2f} nats, {near_ties:.0%} under 0.5 ({len(found)} tokens)")
    assert statistics.median(found) < 1.0 and near_ties > 0.3


@pytest.mark.parametrize("name", STACKS)
def test_every_clean_card_passes_on_the_unsure_model(name):
    checked = card(name)
    assert checked.passed, checked.failures
    assert all(check.verdict == "same" for tier in checked.tiers for check in tier.greedy)


def test_the_bit_exact_fs_tier_catches_every_damage():
    table = card("native-tiered-3500").power
    assert [row.caught for row in table.rows] == [True] * len(DAMAGE_NAMES)
    assert table.smallest_caught == "few-bytes" and table.restarted_after


def test_on_lmcache_one_layer_moved_less_than_the_tolerance_and_the_card_says_it_was_missed(tmp_path):
    checked = card("lmcache-mp-l2-3500")
    table = checked.power
    missed = [row for row in table.rows if not row.caught]
    assert [row.damage for row in missed] == ["one-layer"]
    assert missed[0].shift_nats < table.tolerance_nats == pytest.approx(3 * checked.numerics.cached_vs_fresh_nats)
    assert smallest_caught(table.rows) == "every-block"  # the capture predates this reading: it said few-bytes
    checked.power = table.model_copy(update={"smallest_caught": smallest_caught(table.rows)})
    write_card(tmp_path, checked)
    render_run(tmp_path)
    text = (tmp_path / "lmcache-mp-l2-3500.md").read_text()
    assert "every larger one caught too, is **every-block**" in text and "**Missed: one-layer**" in text


@pytest.mark.parametrize("name", ["native-tiered-3500", "lmcache-mp-l2-3500"])
def test_replayed_through_rigkit_the_verdicts_and_the_power_table_come_out_the_same(name, monkeypatch):
    monkeypatch.setattr(power, "SETTLE_S", 0.0)
    validation, recorded = replay_with_power(RUN, name)
    assert [t.result().passed for t in validation.tiers] == [t["passed"] for t in recorded["tiers"]] == [True] * 4
    assert [(r.damage, r.verdict, r.caught) for r in validation.power.rows] == [
        (r["damage"], r["verdict"], r["caught"]) for r in recorded["power"]["rows"]
    ]
