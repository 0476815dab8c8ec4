"""Results cards: JSON schema round trip, Markdown shape, PNGs, fleet card, `rigkit card` re-render."""

import json

import pytest

from rigkit import cli
from rigkit.card import (Capacity, CapacityTier, DecodeAB, DecodeKind, L2Report, PromptRecord, Reproducibility, RigCard,
                         StatModel, TierProof, TierResult, load_cards, render_fleet_markdown, render_rig_markdown,
                         render_run, write_card)
from rigkit.errors import ConfigError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _tier(expected, ttfts, label=None, gpu=0.0, ext=0.0):
    label = label or expected
    proof = TierProof(label=label, gpu_hits=gpu, gpu_queries=3500, external_hits=ext, external_queries=3500 if ext else 0,
                      external_kv_transfer_tokens=ext, text=f"GPU prefix hits +{gpu:.0f}/3500 queried, "
                                                            f"external hits +{ext:.0f}")
    return TierResult(expected=expected, labels=[label] * len(ttfts), passed=label == expected,
                      ttft_s=StatModel.of(ttfts), server_ttft_s=StatModel.of([t * 0.95 for t in ttfts]),
                      ttft_within_tolerance=[True] * len(ttfts), prompt_tokens=[3500] * len(ttfts),
                      proofs=[proof] * len(ttfts))


def make_card(rig="rig1", cold=(1.0, 1.1, 0.9), warm=(0.1, 0.1, 0.1), connector_label="warm-connector",
              seed=7, kb_per_token=28.7):
    decode = DecodeAB(arms={"on": "lab-example", "off": "lab-plain"}, warmup=3, measured=5, output_tokens=128,
                      kinds=[DecodeKind(kind="narrative", on=StatModel.of([50, 51, 52, 50, 51]),
                                        off=StatModel.of([51, 50, 52, 51, 50]), delta_pct=0.0, within_bands=True),
                             DecodeKind(kind="code", on=StatModel.of([48, 49, 50, 48, 49]),
                                        off=StatModel.of([49, 50, 49, 48, 50]), delta_pct=-0.4, within_bands=True)],
                      verdict="no penalty", reason="every delta lies within the CV bands")
    return RigCard(
        rig=rig, run_id="20260101T000000Z", prefill_tokens_per_s=3400.0,
        repro=Reproducibility(image_digest="127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "a" * 64,
                              profile="lab-example", knobs={"VLLM_CPU_KVCACHE_SPACE": "1"},
                              prompts=[PromptRecord(kind="narrative", target_tokens=3500, seed=seed, tokens=3498)],
                              gpu_models=[], host_ram_bytes=24 * 2**30, l2_device="/dev/loop3", l2_filesystem="ext4"),
        tiers=[_tier("cold", cold), _tier("warm-gpu", warm, gpu=3456),
               _tier("warm-connector", [0.09, 0.1, 0.11], label=connector_label,
                     ext=3456 if connector_label == "warm-connector" else 0),
               _tier("warm-persistent", [0.2, 0.25, 0.2], ext=3456)],
        decode_ab=decode,
        capacity=Capacity(kb_per_token=kb_per_token, bytes_grown=301_000_000, tokens_stored=10_500,
                          source="connector store growth",
                          tiers=[CapacityTier(name="L2 disk 1 TB", size_bytes=10**12,
                                              sessions={"3500": 9900.0, "50000": 697.0})]))


def test_json_round_trip_keeps_every_field(tmp_path):
    card = make_card()
    path = write_card(tmp_path, card)
    assert path.name == "rig1.card.json"
    data = json.loads(path.read_text())
    assert data["schema_version"] == 1
    assert load_cards(tmp_path) == [card]


def test_rig_markdown_has_the_three_tables_with_n_cv_and_proof():
    md = render_rig_markdown(make_card())
    assert "## ① Serving" in md and "## ② Cache behaviour" in md and "## ③ Capacity" in md
    assert "| Cold (re-prefill) | 1.00 s (n=3, CV 10.0%) | 1× |" in md
    assert "| ~10.0× |" in md  # warm-gpu vs cold: 1.0 s / 0.1 s
    assert "GPU prefix hits +3456/3500 queried" in md
    assert "50.8 (n=5, CV 1.6%)" in md  # decode narrative ON
    assert "28.7 KB/token" in md and "| L2 disk 1 TB | 1.0 TB | 9900.0 | 697.0 |" in md
    assert "sha256:" + "a" * 64 in md and "seed 7" in md and "/dev/loop3 / ext4" in md
    assert "**Verdict: PASS**" in md


def test_retrieved_but_unused_tier_fails_the_card_even_with_fast_ttft():
    card = make_card(connector_label="retrieved-but-unused")
    assert not card.passed
    md = render_rig_markdown(card)
    assert "**Verdict: FAIL**" in md
    assert "tier warm-connector: labelled retrieved-but-unused" in md


def test_render_run_writes_markdown_and_real_pngs(tmp_path):
    write_card(tmp_path, make_card("rig1"))
    write_card(tmp_path, make_card("rig2", cold=(2.0, 2.2, 1.8)))
    written = render_run(tmp_path)
    names = {p.name for p in written}
    assert {"rig1.md", "rig1-ttft.png", "rig1-decode.png", "rig2.md", "fleet.md", "fleet-ttft.png"} <= names
    for name in ("rig1-ttft.png", "rig1-decode.png", "fleet-ttft.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC


def test_fleet_card_puts_rigs_side_by_side_with_spread():
    md = render_fleet_markdown([make_card("rig1"), make_card("rig2", cold=(2.0, 2.2, 1.8))])
    assert "| | rig1 | rig2 | spread (min–max, CV) |" in md
    assert "| TTFT cold (s) | 1.000 | 2.000 | 1–2 (CV 47.1%) |" in md
    assert "2/2 rigs pass." in md
    assert "Not like for like" not in md


def test_fleet_card_warns_when_rigs_ran_different_prompts():
    md = render_fleet_markdown([make_card("rig1", seed=1), make_card("rig2", seed=2)])
    assert "Not like for like" in md


def test_cli_rerenders_from_json_only(tmp_path, capsys):
    write_card(tmp_path, make_card())
    assert cli.main(["card", str(tmp_path)]) == 0
    assert (tmp_path / "rig1.md").exists()
    assert str(tmp_path / "fleet.md") in capsys.readouterr().out


def test_cli_refuses_a_directory_without_cards(tmp_path, capsys):
    assert cli.main(["card", str(tmp_path)]) == 2
    assert "no *.card.json files" in capsys.readouterr().out


def test_unknown_schema_version_is_refused(tmp_path):
    path = write_card(tmp_path, make_card())
    data = json.loads(path.read_text())
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="schema v1"):
        load_cards(tmp_path)


def test_replay_repeats_the_recorded_prompts(tmp_path):
    from rigkit.validation import Settings, replay_data

    card = make_card(seed=4242)
    card.repro.output_tokens = 32
    write_card(tmp_path, card)
    settings = Settings.from_data(replay_data(tmp_path))
    assert (settings.prompt_tokens, settings.prompt_kind, settings.seed, settings.sessions,
            settings.output_tokens) == (3500, "narrative", 4242, 1, 32)


def test_capacity_from_measured_growth_and_sessions_per_tier():
    from rigkit.validation import capacity_from

    # the user's card: 36,721 tokens -> 4.6 GB on disk; an L1 of 30 GB and an L2 of 1 TB
    capacity = capacity_from(4_600_000_000, 36_721, "L2 dir growth", {"L1 30 GB": 30 * 10**9, "L2 1 TB": 10**12},
                             [50_000, 262_144])
    assert capacity.kb_per_token == pytest.approx(125.3, abs=0.1)
    l1, l2 = capacity.tiers
    assert l1.sessions["50000"] == pytest.approx(30e9 / (4.6e9 / 36_721 * 50_000))
    assert 4 < l1.sessions["50000"] < 5 and 150 < l2.sessions["50000"] < 165
    empty = capacity_from(0, 36_721, "L2 dir growth", {}, [50_000])
    assert empty.kb_per_token is None and "no growth" in empty.source


def _l2(state="ok", level="ok", free=1_500_000_000, problems=()):
    return L2Report(path="/mnt/rigkit-l2/lmcache", mount="/mnt/rigkit-l2", fs_size_bytes=2_040_000_000,
                    fs_free_bytes=free, min_free_bytes=268_435_456, store_bytes=3_500_000, budget_bytes=500_000_000,
                    janitor="active", janitor_state="below-floor" if state == "full" else "ok", evicted_entries=12,
                    evicted_bytes=42_000_000, state=state, level=level, problems=list(problems))


def test_card_shows_one_l2_line_with_the_numbers():
    card = make_card()
    card.l2 = _l2()
    md = render_rig_markdown(card)
    assert ("**L2**: /mnt/rigkit-l2 2.0 GB, 1.5 GB free (floor 268.4 MB) · store 3.5 MB of budget 500.0 MB · "
            "janitor active (ok), evicted 12 entries (42.0 MB) since it started — OK ✓") in md
    assert card.passed and "**Verdict: PASS**" in md


def test_full_l2_fails_the_card_and_names_the_fix(tmp_path):
    card = make_card()
    card.l2 = _l2("full", "fail", free=120_000_000,
                  problems=["L2 full: /mnt/rigkit-l2 has 120.0 MB free, below the floor 268.4 MB (the store is empty: "
                            "something else fills the disk): free space on /mnt/rigkit-l2 or lower l2_budget_gb"])
    assert not card.passed
    md = render_rig_markdown(card)
    assert "**Verdict: FAIL**" in md and "— FULL ✗" in md
    assert "- ✗ L2 full: /mnt/rigkit-l2 has 120.0 MB free" in md and "free space on /mnt/rigkit-l2" in md
    write_card(tmp_path, card)
    assert load_cards(tmp_path)[0].l2 == card.l2
    fleet = render_fleet_markdown([card, make_card("rig2")])
    assert "| L2 | full ✗ (120.0 MB free) | — | |" in fleet and "1/2 rigs pass." in fleet


def test_low_l2_is_a_warning_that_keeps_the_pass():
    card = make_card()
    card.l2 = _l2("low", "warn", free=300_000_000, problems=["L2 low: lower l2_budget_gb to at most 0.04"])
    md = render_rig_markdown(card)
    assert card.passed and "- ⚠ L2 low: lower l2_budget_gb to at most 0.04" in md and "— LOW ⚠" in md


def _soak(tps_last=38.0, memory_last=2150.0):
    """A 2 × 3 soak judged by rigkit.soak (records in the order the soak runs them)."""
    from rigkit.card import SoakTurn
    from rigkit.soak import Limits, Plan, judge, turn_order

    plan = Plan(sessions=2, turns=3, message_tokens=64, reply_tokens=32)
    records = [SoakTurn(session=s, turn=t, completion_tokens=32, decode_tps=40.0 if s == 0 else tps_last,
                        memory_mib=memory_last if i == 5 else 2100.0)
               for i, (s, t) in enumerate(turn_order(plan.sessions, plan.turns))]
    return judge(records, plan, Limits(200.0, 0.8, 0.5), "container rigkit-serving cgroup memory")


def test_card_shows_the_soak_section_with_each_rule_and_its_numbers(tmp_path):
    card = make_card()
    card.soak = _soak()
    md = render_rig_markdown(card)
    assert "## ④ Stability (soak)" in md and "2 conversations × 3 turns (2 open at once" in md
    assert "| errors | 0 of 6 turns | none | ✓ |" in md
    assert "| empty replies | 0 of 6 answered (0%) | < 50% | ✓ |" in md
    assert ("| decode retention | 95% (session 1: 38.0 tok/s vs first clean session 0: 40.0 tok/s) | ≥ 80% | ✓ |"
            in md)
    assert ("| memory growth | +50 MiB (2,100 MiB after session 0 → 2,150 MiB at the end; container rigkit-serving "
            "cgroup memory) | ≤ 200 MiB | ✓ |") in md
    assert "Verdict: **PASS**." in md and card.passed
    write_card(tmp_path, card)
    assert load_cards(tmp_path)[0].soak == card.soak
    assert "| soak | PASS (retention 95%, +50 MiB) |" in render_fleet_markdown([card])


def test_failed_soak_fails_the_card_naming_the_rule():
    card = make_card()
    card.soak = _soak(tps_last=30.0, memory_last=2400.0)
    assert not card.passed
    md = render_rig_markdown(card)
    assert "**Verdict: FAIL**" in md
    assert "- ✗ soak: decode retention 75.0%: session 1 decoded 30.0 tok/s vs 40.0 tok/s" in md
    assert "- ✗ soak: memory grew 300.0 MiB (2,100 MiB after the first clean session 0 -> 2,400 MiB" in md
    assert "| decode retention | 75% " in md and "≥ 80% | ✗ |" in md and "≤ 200 MiB | ✗ |" in md
    assert "| soak | FAIL (retention 75%, +300 MiB) |" in render_fleet_markdown([card])


def test_card_without_a_soak_says_it_was_not_run():
    md = render_rig_markdown(make_card())
    assert "## ④ Stability (soak)\n\nNot run in this run (`validate_soak_sessions` = 0)." in md
    assert "| soak |" not in render_fleet_markdown([make_card()])


def test_soak_memory_growth_below_half_a_mib_reads_plus_zero():
    card = make_card()
    card.soak = _soak(memory_last=2099.7)
    assert "| memory growth | +0 MiB (2,100 MiB after session 0" in render_rig_markdown(card)
    assert "| soak | PASS (retention 95%, +0 MiB) |" in render_fleet_markdown([card])
