"""rigkit.validation.card.replay: a replay's fleet card against the run it repeats. Verdicts are judged on two real lab cards
(tests/fixtures/cards: the same rig, two runs 34 minutes apart); the setups they compare are made up from them,
in functions named so (the lab cards record no driver, GPU, RAM or L2 device)."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

from rigkit import cli
from rigkit.errors import ConfigError
from rigkit.validation.abstats import CV_BANDS_RULE
from rigkit.validation.card.fleet import render_fleet_markdown
from rigkit.validation.card.replay import RULE, compare, setup_of
from rigkit.validation.card.schema import PromptRecord, ReplayComparison, Reproducibility, RigCard
from rigkit.validation.card.store import RECORDED_DIR, REPLAY_JSON, keep_recorded, load_cards, render_run, write_card

CARDS = Path(__file__).parents[1] / "fixtures" / "cards"
FIRST, SECOND = CARDS / "lab-2026-12-01-1155", CARDS / "lab-2026-12-01-1229"
GIB = 2**30


def real_card(folder: Path) -> RigCard:
    (card,) = load_cards(folder)
    return card


def made_up_setup(card: RigCard, rig: str, run_id: str, **repro) -> RigCard:
    """A real card given a complete made-up setup (as validate.py's rig_facts would record on a GPU rig)."""
    setup = dict(
        knobs={"l1_size_gb": 30, "l2_enabled": True},
        driver_version="580.159.04",
        cuda_version="13.0",
        gpu_models=["NVIDIA GeForce RTX 3090"] * 2,
        power_limit_declared_w=260.0,
        power_limits_enforced_w=[260.0, 260.0],
        host_ram_bytes=64 * GIB,
        l2_device="/dev/nvme0n1p1",
        l2_filesystem="ext4",
    )
    return card.model_copy(
        update={"rig": rig, "run_id": run_id, "repro": card.repro.model_copy(update={**setup, **repro})}
    )


def made_up_replay(**repro) -> tuple[RigCard, RigCard]:
    """(recorded rig1, rig2 replaying it): the two real lab runs, the second given the first's prompts (as
    `replay=` repeats them) and the same made-up setup, except what `repro` changes."""
    recorded = made_up_setup(real_card(FIRST), "rig1", "20261201T115504Z")
    repro.setdefault("prompts", [p.model_copy() for p in recorded.repro.prompts])
    return recorded, made_up_setup(real_card(SECOND), "rig2", "20261201T122935Z", **repro)


# One change per field the cards record, each with the setting the card must name. The list (image digest,
# profile, knobs, driver/CUDA, GPU model, RAM, L2 device) and every other field of the schema's Reproducibility.
CHANGES = {
    "image_digest": ({"image_digest": "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "b" * 64}, "image digest"),
    "model_source": ({"model_source": "Qwen/Qwen3-8B@" + "c" * 40}, "model"),
    "profile": ({"profile": "cpu-lab"}, "profile"),
    "knobs": ({"knobs": {"l1_size_gb": 60, "l2_enabled": True}}, "knob l1_size_gb"),
    "driver_version": ({"driver_version": "575.64.03"}, "driver"),
    "cuda_version": ({"cuda_version": "12.9"}, "CUDA"),
    "gpu_models": ({"gpu_models": ["NVIDIA H200"]}, "GPU model"),
    # an endpoint known by its URL: its machine never read, not "a CPU"
    "machine_read": ({"machine_read": False}, "GPU model"),
    "host_ram_bytes": ({"host_ram_bytes": 128 * GIB}, "host RAM"),
    # a decode A/B at two caps: the same cards run at 260 W, then at 280 W
    "power_limit_declared_w": ({"power_limit_declared_w": 280.0}, "power limit declared"),
    "power_limits_enforced_w": ({"power_limits_enforced_w": [280.0, 280.0]}, "power limit enforced"),
    "l2_device": ({"l2_device": "/dev/nvme1n1"}, "L2 device"),
    "l2_filesystem": ({"l2_filesystem": "xfs"}, "L2 filesystem"),
    "l2_integrity": ({"l2_integrity": "checksum crc32"}, "L2 integrity"),
    "rigkit_version": ({"rigkit_version": "0.2.0"}, "rigkit version"),
    "prompts": ({"prompts": [PromptRecord(kind="code", target_tokens=3500, seed=1)]}, "prompts"),
    "output_tokens": ({"output_tokens": 32}, "output tokens"),
    "max_model_len": ({"max_model_len": 4096}, "max model len"),
    "num_gpu_blocks": ({"num_gpu_blocks": 144}, "KV pool"),
    "block_size": ({"block_size": 16}, "KV pool"),
}


def test_every_recorded_setting_has_a_case():
    assert set(CHANGES) == set(Reproducibility.model_fields)


def test_the_same_setup_lists_no_difference():
    recorded, new = made_up_replay()
    comparison = compare([recorded], [new])
    assert comparison.setup_differences == []
    assert "Setup: every setting the cards record" in render_fleet_markdown([new], [recorded])


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_a_difference_in_setup_is_called_out_with_both_values(field):
    change, setting = CHANGES[field]
    recorded, new = made_up_replay(**change)
    (difference,) = compare([recorded], [new]).setup_differences
    before, after = setup_of(recorded.repro)[setting], setup_of(new.repro)[setting]
    assert difference.setting == setting and before != after
    assert (difference.recorded, difference.new) == ({"rig1": before}, {"rig2": after})
    assert f"| {setting} | {before} (rig1) | {after} (rig2) |" in render_fleet_markdown([new], [recorded])


def test_a_knob_set_on_one_side_only_is_a_difference():
    recorded, new = made_up_replay(knobs={"l1_size_gb": 30, "l2_enabled": True, "kv_cache_dtype": "fp8"})
    (difference,) = compare([recorded], [new]).setup_differences
    assert (difference.setting, difference.recorded, difference.new) == (
        "knob kv_cache_dtype",
        {"rig1": "—"},
        {"rig2": "fp8"},
    )


def test_ram_is_compared_as_the_card_shows_it():
    """Two machines of one size report MemTotal a few MB apart: not a setup difference."""
    recorded, new = made_up_replay(host_ram_bytes=64 * GIB - 3 * 2**20)
    assert compare([recorded], [new]).setup_differences == []


def test_gpu_count_is_part_of_the_gpu_model():
    recorded, new = made_up_replay(gpu_models=["NVIDIA GeForce RTX 3090"])
    (difference,) = compare([recorded], [new]).setup_differences
    assert difference.recorded == {"rig1": "2 × NVIDIA GeForce RTX 3090"}
    assert difference.new == {"rig2": "NVIDIA GeForce RTX 3090"}


# --- verdicts, on the real lab runs --------------------------------------------------------------------------------


def _verdicts(recorded: list[RigCard], new: list[RigCard]) -> dict[str, object]:
    return {(v.figure, v.rig): v for v in compare(recorded, new).figures}


def test_a_figure_inside_both_cv_bands_reproduces():
    """warm-gpu TTFT: 53.0 ms (CV 0.8 %) then 54.3 ms (CV 3.1 %): 1.3 ms apart, bands 0.4 + 1.7 ms."""
    recorded, new = made_up_replay()
    verdict = _verdicts([recorded], [new])[("ttft:warm-gpu", "rig2")]
    old, now = recorded.tier("warm-gpu").ttft_s.samples, new.tier("warm-gpu").ttft_s.samples
    delta = statistics.fmean(now) - statistics.fmean(old)
    assert (
        abs(delta)
        <= statistics.fmean(old) * recorded.tier("warm-gpu").ttft_s.cv
        + statistics.fmean(now) * new.tier("warm-gpu").ttft_s.cv
    )
    assert verdict.verdict == "reproduces"
    assert verdict.delta == pytest.approx(delta)
    assert verdict.delta_pct == pytest.approx(100 * delta / statistics.fmean(old))
    assert verdict.text.startswith("reproduces: +1.3 ms (+2.4 %)")


def test_a_figure_beyond_the_cv_bands_differs_by_how_much():
    """cold TTFT: 102 ms (CV 3.5 %) then 202 ms (CV 25 %): 100 ms apart, bands 3.6 + 50.6 ms."""
    recorded, new = made_up_replay()
    verdict = _verdicts([recorded], [new])[("ttft:cold", "rig2")]
    assert verdict.verdict == "differs"
    assert verdict.text.startswith(
        "differs by +100.0 ms (+97.8 %), beyond the bands ±3.6 ms recorded (n=2), ±50.6 ms rig2 (n=2)"
    )
    md = render_fleet_markdown([new], [recorded])
    assert (
        "| TTFT cold (s) | 0.102 | 0.202 | 0.102–0.202 (CV 46.4%) | ✗ differs +100.0 ms (+97.8 %), "
        "bands ±3.6 ms / ±50.6 ms |" in md
    )


def test_identical_hit_counts_reproduce_and_one_fewer_block_differs():
    """Hits have no spread (every session hit 3,456 tokens): only an equal count reproduces."""
    recorded, new = made_up_replay()
    assert _verdicts([recorded], [new])[("hits:warm-connector", "rig2")].verdict == "reproduces"
    fewer = new.model_copy(deep=True)
    for proof in fewer.tier("warm-connector").proofs:
        proof.external_hits -= 128  # one 128-token block less from the connector
    verdict = _verdicts([recorded], [fewer])[("hits:warm-connector", "rig2")]
    assert verdict.verdict == "differs" and verdict.text.startswith("differs by -128 tokens (-3.7 %)")


def test_a_figure_the_recorded_run_did_not_measure_is_not_compared():
    recorded, new = made_up_replay()
    recorded = recorded.model_copy(update={"tiers": [t for t in recorded.tiers if t.expected != "warm-persistent"]})
    verdict = _verdicts([recorded], [new])[("ttft:warm-persistent", "rig2")]
    assert verdict.verdict == "not compared" and "not measured on the recorded run" in verdict.text


def test_recorded_rigs_are_pooled():
    """Two recorded rigs (the two real runs): the new rig is judged against their samples together."""
    first = made_up_setup(real_card(FIRST), "rig1", "run-a")
    second = made_up_setup(real_card(SECOND), "rig3", "run-a", prompts=first.repro.prompts)
    new = made_up_setup(real_card(SECOND), "rig2", "run-b", prompts=first.repro.prompts)
    verdict = _verdicts([first, second], [new])[("ttft:cold", "rig2")]
    assert verdict.recorded.n == 4
    assert verdict.recorded.mean == pytest.approx(
        statistics.fmean(first.tier("cold").ttft_s.samples + second.tier("cold").ttft_s.samples)
    )
    assert verdict.verdict == "reproduces"  # the pooled band spans both recorded runs


# --- the card, its JSON and its re-render ----------------------------------------------------------------------------


def test_recorded_rigs_stand_beside_the_new_ones_marked_with_their_date():
    recorded, new = made_up_replay(gpu_models=["NVIDIA H200"])
    md = render_fleet_markdown([new], [recorded])
    assert "# Fleet card — run 20261201T122935Z (replay of run 20261201T115504Z)" in md
    assert "| | rig1 (recorded 2026-12-01) | rig2 | spread (min–max, CV) | replay verdict |" in md
    assert "1/1 rigs pass. Recorded run: 1/1 passed." in md
    assert RULE in md and CV_BANDS_RULE in RULE
    assert "Replay verdict: 6 figures reproduce, 2 differ, 0 not compared." in md
    assert "Not like for like" not in md  # the replay repeated the prompts


def test_a_replay_run_dir_renders_from_its_own_json(tmp_path):
    """validate.py's order: the new card, the recorded run's cards kept, then the re-render; the recorded run may
    be gone by the time `rigkit card` re-renders."""
    recorded, new = made_up_replay(image_digest="127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "c" * 64)
    old_run, run = tmp_path / "old", tmp_path / "new"
    write_card(old_run, recorded)
    write_card(run, new)
    keep_recorded(run, old_run)
    shutil.rmtree(old_run)
    names = {p.name for p in render_run(run)}
    assert {"fleet.md", REPLAY_JSON, "fleet-ttft.png"} <= names
    assert (run / RECORDED_DIR / "rig1.card.json").exists() and not (run / "rig1.md").exists()
    comparison = ReplayComparison.model_validate_json((run / REPLAY_JSON).read_text())
    assert comparison == compare([recorded], [new])
    assert [d.setting for d in comparison.setup_differences] == ["image digest"]
    assert json.loads((run / REPLAY_JSON).read_text())["figures"][0]["verdict"] == "differs"
    assert "rig1 (recorded 2026-12-01)" in (run / "fleet.md").read_text()


def test_a_run_cannot_replay_itself(tmp_path):
    write_card(tmp_path, real_card(FIRST))
    with pytest.raises(ConfigError, match="this run's own directory"):
        keep_recorded(tmp_path, tmp_path)


def test_rigkit_card_prints_the_replay_verdicts(tmp_path, capsys):
    recorded, new = made_up_replay(cuda_version="12.9")
    write_card(tmp_path / "old", recorded)
    write_card(tmp_path / "new", new)
    keep_recorded(tmp_path / "new", tmp_path / "old")
    assert cli.main(["card", str(tmp_path / "new")]) == 0
    out = capsys.readouterr().out
    assert "replay of run 20261201T115504Z (rig1 recorded 2026-12-01): 6 figures reproduce, 2 differ" in out
    assert "✗ rig2 TTFT cold (s): differs by +100.0 ms (+97.8 %)" in out
    assert "setup differs in: CUDA" in out
