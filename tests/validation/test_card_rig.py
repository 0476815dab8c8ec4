"""rigkit.validation.card.rig: one rig's Markdown card (tables with n, CV and metric proof; L2 line; soak section) and its
verdict; where a failure also shows on the fleet card or survives the JSON round trip, that is checked here too."""

from card_samples import judged_soak, l2_report, make_card, tier_result

from rigkit.validation.card.fleet import render_fleet_markdown
from rigkit.validation.card.rig import render_rig_markdown
from rigkit.validation.card.store import load_cards, write_card
from rigkit.validation.card.text import fmt_seconds


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


def test_card_shows_one_l2_line_with_the_numbers():
    card = make_card()
    card.l2 = l2_report()
    md = render_rig_markdown(card)
    assert (
        "**L2**: /mnt/rigkit-l2 2.0 GB, 1.5 GB free (floor 268.4 MB) · store 3.5 MB of budget 500.0 MB · "
        "janitor active (ok), evicted 12 entries (42.0 MB) since it started — OK ✓"
    ) in md
    assert card.passed and "**Verdict: PASS**" in md


def test_full_l2_fails_the_card_and_names_the_fix(tmp_path):
    card = make_card()
    card.l2 = l2_report(
        "full",
        "fail",
        free=120_000_000,
        problems=[
            "L2 full: /mnt/rigkit-l2 has 120.0 MB free, below the floor 268.4 MB (the store is empty: "
            "something else fills the disk): free space on /mnt/rigkit-l2 or lower l2_budget_gb"
        ],
    )
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
    card.l2 = l2_report("low", "warn", free=300_000_000, problems=["L2 low: lower l2_budget_gb to at most 0.04"])
    md = render_rig_markdown(card)
    assert card.passed and "- ⚠ L2 low: lower l2_budget_gb to at most 0.04" in md and "— LOW ⚠" in md


def test_card_shows_the_soak_section_with_each_rule_and_its_numbers(tmp_path):
    card = make_card()
    card.soak = judged_soak()
    md = render_rig_markdown(card)
    assert "## ④ Stability (soak)" in md and "2 conversations × 3 turns (2 open at once" in md
    assert "| errors | 0 of 6 turns | none | ✓ |" in md
    assert "| empty replies | 0 of 6 answered (0%) | < 50% | ✓ |" in md
    assert "| decode retention | 95% (session 1: 38.0 tok/s vs first clean session 0: 40.0 tok/s) | ≥ 80% | ✓ |" in md
    assert (
        "| memory growth | +50 MiB (2,100 MiB after session 0 → 2,150 MiB at the end; container rigkit-serving "
        "cgroup memory) | ≤ 200 MiB | ✓ |"
    ) in md
    assert "Verdict: **PASS**." in md and card.passed
    write_card(tmp_path, card)
    assert load_cards(tmp_path)[0].soak == card.soak
    assert "| soak | PASS (retention 95%, +50 MiB) |" in render_fleet_markdown([card])


def test_failed_soak_fails_the_card_naming_the_rule():
    card = make_card()
    card.soak = judged_soak(tps_last=30.0, memory_last=2400.0)
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
    card.soak = judged_soak(memory_last=2099.7)
    assert "| memory growth | +0 MiB (2,100 MiB after session 0" in render_rig_markdown(card)
    assert "| soak | PASS (retention 95%, +0 MiB) |" in render_fleet_markdown([card])


def test_a_tier_proven_but_slower_than_cold_keeps_its_label_and_shows_no_gain():
    # the H200's native disk tier on the 8B-shaped model (tests/fixtures/gpu-h200-vllm0.26/native-tiered-8b-16k):
    # cold 693 ms, warm-persistent from disk 1,885 ms, proven by external hits +15,984
    card = make_card(cold=(0.6932,), warm=(0.1465,))
    card.tiers[3] = tier_result("warm-persistent", [1.8853], ext=15984)
    md = render_rig_markdown(card)
    row = next(line for line in md.splitlines() if line.startswith("| Warm — persistent"))
    assert "no gain (0.37×: no faster than recomputing)" in row and "warm-persistent ✓" in row
    assert "| ~4.7× |" in md  # warm-gpu still shows its gain


def _with_ttft_pairs(card, transport, warm_gpu_client_s=None):
    """The sample card as validate.py writes it now: where the client TTFT was measured, and per request its
    client and server figures; warm_gpu_client_s: warm-gpu's client figures (the tunnel's, say)."""
    from rigkit.validation.card.schema import TTFTClient, TTFTPair
    from rigkit.validation.ttft import ttft_agrees

    card.ttft_client = TTFTClient(transport=transport, tolerance_rel=0.05, tolerance_abs_s=0.005)
    for tier in card.tiers:
        server = [s * 1.0 for s in tier.server_ttft_s.samples]
        client = warm_gpu_client_s if tier.expected == "warm-gpu" and warm_gpu_client_s else server
        tier.ttft_pairs = [TTFTPair(client_s=c, server_s=s, within=ttft_agrees(c, s)) for c, s in zip(client, server)]
        tier.ttft_within_tolerance = [pair.within for pair in tier.ttft_pairs]
    return card


def test_client_ttft_on_the_rig_agreeing_with_the_histogram_gives_no_warning():
    card = _with_ttft_pairs(make_card(), "rig1's loopback (rigkit's probe, run by the rig's python3 over SSH)")
    md = render_rig_markdown(card)
    assert (
        "Client TTFT measured on rig1's loopback (rigkit's probe, run by the rig's python3 over SSH); within "
        "max(5 %, 5 ms) of the server histogram's figure for the same request: 12/12 requests."
    ) in md
    assert "⚠" not in md and card.passed


def test_client_ttft_off_the_histogram_warns_naming_the_transport_and_keeps_the_pass():
    # the lab rig's card through the tunnel: warm-gpu 83 ms against a histogram of ~95 ms x 0.95 here
    card = _with_ttft_pairs(
        make_card(), "the controller, through http://127.0.0.1:40123", warm_gpu_client_s=[0.140, 0.096, 0.094]
    )
    md = render_rig_markdown(card)
    assert (
        "- ⚠ warm-gpu: client TTFT outside max(5 %, 5 ms) of the server histogram on 1 of 3 requests (worst: "
        "client 140 ms, server 95 ms, +45 ms), measured on the controller, through http://127.0.0.1:40123"
    ) in md
    assert "11/12 requests" in md
    assert card.passed and "**Verdict: PASS**" in md  # the labels come from counters: timing warns, never fails


def test_client_ttft_far_below_the_histogram_warns_too():
    # 10 ms on the client against ~95 ms in the histogram: a broken measurement, warned as one above it is
    card = _with_ttft_pairs(make_card(), "rig1's loopback (test)", warm_gpu_client_s=[0.010, 0.096, 0.094])
    md = render_rig_markdown(card)
    assert (
        "- ⚠ warm-gpu: client TTFT outside max(5 %, 5 ms) of the server histogram on 1 of 3 requests (worst: "
        "client 10 ms, server 95 ms, -85 ms), measured on rig1's loopback (test)"
    ) in md
    assert "11/12 requests" in md


def test_the_card_states_the_api_overhead_it_took_off_and_warns_on_the_figure_it_compared():
    from rigkit.validation.card.schema import TTFTPair

    card = _with_ttft_pairs(make_card(), "rig1's loopback (test)")
    for tier in card.tiers:  # each request's client figure 10 ms above the histogram, all of it the API's
        tier.ttft_pairs = [
            TTFTPair(client_s=p.server_s + 0.010, server_s=p.server_s, within=True, api_overhead_s=0.010)
            for p in tier.ttft_pairs
        ]
    warm_gpu = next(tier for tier in card.tiers if tier.expected == "warm-gpu")
    miss = warm_gpu.ttft_pairs[0]
    warm_gpu.ttft_pairs[0] = miss.model_copy(update={"client_s": miss.server_s + 0.030, "within": False})
    md = render_rig_markdown(card)
    assert (
        "each request's API overhead was subtracted (the same body under a model name the server refuses with "
        "404, timed just before it): median 10 ms over 12 requests"
    ) in md
    assert (
        f"(worst: client {fmt_seconds(miss.server_s + 0.030)} less 10 ms API overhead, server "
        f"{fmt_seconds(miss.server_s)}, +20 ms)"
    ) in md


def test_a_card_written_before_the_transport_was_recorded_renders_as_before(tmp_path):
    import json

    write_card(tmp_path, make_card())
    (path,) = tmp_path.glob("*.card.json")
    data = json.loads(path.read_text())
    assert data.pop("ttft_client", "absent") is None
    for tier in data["tiers"]:
        del tier["ttft_pairs"], tier["greedy"]
    path.write_text(json.dumps(data))
    (loaded,) = load_cards(tmp_path)
    assert loaded.ttft_client is None and loaded.tiers[0].greedy == [] and loaded.tiers[0].ttft_pairs == []
    assert "Client TTFT within tolerance of the server histogram: 12/12 requests." in render_rig_markdown(loaded)


def test_the_setup_shows_the_declared_and_the_enforced_power_limit_on_a_gpu_rig_only(tmp_path):
    card = make_card()
    assert "GPU power limit" not in render_rig_markdown(card)  # the sample is a CPU rig
    card.repro.gpu_models = ["NVIDIA GeForce RTX 3090"] * 2
    card.repro.power_limits_enforced_w = [350.0, 350.0]
    assert "| GPU power limit | declared none (the cards' default), enforced 350 W |" in render_rig_markdown(card)
    card.repro.power_limit_declared_w, card.repro.power_limits_enforced_w = 260.0, [260.0, 350.0]
    md = render_rig_markdown(card)
    assert "| GPU power limit | declared 260 W, enforced GPU 0 260 W, GPU 1 350 W |" in md
    write_card(tmp_path, card)
    (reloaded,) = load_cards(tmp_path)
    assert reloaded.repro.power_limits_enforced_w == [260.0, 350.0]


def test_a_card_that_measured_nothing_does_not_pass():
    """Issue 43: all() of nothing is True; a card with no tier and no shared pair proves nothing."""
    from rigkit.validation.card import RigCard

    assert not RigCard(rig="r", run_id="x").passed
