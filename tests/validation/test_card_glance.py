"""rigkit.validation.card.glance: a rig card in a few lines (per tier: TTFT, times faster than cold, the proof in a few words,
the verdict), as validate.py, `rigkit demo` and `rigkit card` print it; on real lab and H200 cards."""

from pathlib import Path

import pytest
from card_samples import make_card

from rigkit.lab.demo import validation_lines
from rigkit.validation.card.glance import glance_lines, proof_words, run_lines, tier_glance
from rigkit.validation.card.store import load_cards

FIXTURES = Path(__file__).parents[1] / "fixtures"
LAB_RUN = FIXTURES / "cards" / "lab-2026-12-01-1229"


def rows(lines: list[str]) -> dict[str, list[str]]:
    """The table's rows by tier, split on runs of two blanks."""
    return {
        cells[0]: cells
        for cells in ([c for c in line.strip().split("  ") if c] for line in lines[2:])
        if cells and cells[0] in ("cold", "warm-gpu", "warm-connector", "warm-persistent")
    }


def test_a_real_lab_card_reads_tier_ttft_times_faster_proof_and_verdict():
    (card,) = load_cards(LAB_RUN)
    lines = glance_lines(card, LAB_RUN / "lab-vllm.md")
    assert lines[0] == f"lab-vllm: PASS — {LAB_RUN / 'lab-vllm.md'}"
    table = rows(lines)
    assert [c.strip() for c in table["cold"]] == ["cold", "202 ms (n=2)", "1×", "no cache hit", "✓ cold"]
    assert [c.strip() for c in table["warm-gpu"]] == [
        "warm-gpu",
        "54 ms (n=2)",
        "3.7×",
        "GPU prefix hits +3,456",
        "✓ warm-gpu",
    ]
    assert table["warm-persistent"][3].strip() == "connector hits +3,456, GPU +0"


def test_a_tier_labelled_otherwise_says_what_it_was_and_what_was_expected():
    card = make_card(connector_label="mixed")
    glance = tier_glance(card, card.tier("warm-connector"))
    assert (glance.verdict, glance.passed) == ("✗ mixed (expected warm-connector)", False)
    assert glance_lines(card)[0] == "rig1: FAIL"


def test_served_but_wrong_says_how_many_sessions_differ():
    from rigkit.validation.card.schema import GreedyCheck

    card = make_card()
    tier = card.tier("warm-gpu")
    tier.greedy = [
        GreedyCheck(session="aa", same=True, cold_text="x", text="x"),
        GreedyCheck(session="bb", same=False, cold_text="x", text="y", first_difference=0),
    ]
    tier.passed = False
    assert tier_glance(card, tier).verdict == ("✗ served-but-wrong (logprobs of 1/2 sessions moved past its tolerance)")


@pytest.mark.parametrize(
    "gpu, external, words",
    [
        (0, 0, "no cache hit"),
        (3456, 0, "GPU prefix hits +3,456"),
        (0, 3456, "connector hits +3,456, GPU +0"),
        (128, 3328, "GPU hits +128, connector +3,328"),
    ],
)
def test_proof_words(gpu, external, words):
    proof = make_card().tier("cold").proofs[0].model_copy(update={"gpu_hits": gpu, "external_hits": external})
    assert proof_words(proof) == words


def test_a_slower_warm_tier_says_so():
    card = make_card(warm=(2.0, 2.0, 2.0))
    assert tier_glance(card, card.tier("warm-gpu")).faster == "0.50× (slower)"


def test_the_demo_ends_with_the_cards_at_a_glance_and_the_run_directory(tmp_path):
    lines = validation_lines(0, LAB_RUN)
    assert lines[0] == "validation: ok"
    assert any(line.startswith("lab-vllm: PASS") for line in lines)
    assert lines[-1].startswith(f"run directory: {LAB_RUN}")
    assert validation_lines(1, tmp_path)[0].startswith("validation: FAILED (exit 1) before any card was written")


def test_run_lines_name_each_rigs_card():
    cards = [make_card("rig1"), make_card("rig2")]
    lines = run_lines(cards, Path("results/r"))
    assert "rig2: PASS — results/r/rig2.md" in lines
