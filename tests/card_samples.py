"""Sample results cards the tests of rigkit.validation.card (tests/test_card_*.py) render, store and compare."""

from rigkit.validation.card.schema import (
    Capacity,
    CapacityTier,
    DecodeAB,
    DecodeKind,
    L2Report,
    PromptRecord,
    Reproducibility,
    RigCard,
    SoakTurn,
    StatModel,
    TierProof,
    TierResult,
)


def tier_result(expected, ttfts, label=None, gpu=0.0, ext=0.0):
    label = label or expected
    proof = TierProof(
        label=label,
        gpu_hits=gpu,
        gpu_queries=3500,
        external_hits=ext,
        external_queries=3500 if ext else 0,
        external_kv_transfer_tokens=ext,
        text=f"GPU prefix hits +{gpu:.0f}/3500 queried, external hits +{ext:.0f}",
    )
    return TierResult(
        expected=expected,
        labels=[label] * len(ttfts),
        passed=label == expected,
        ttft_s=StatModel.of(ttfts),
        server_ttft_s=StatModel.of([t * 0.95 for t in ttfts]),
        ttft_within_tolerance=[True] * len(ttfts),
        prompt_tokens=[3500] * len(ttfts),
        proofs=[proof] * len(ttfts),
    )


def make_card(
    rig="rig1", cold=(1.0, 1.1, 0.9), warm=(0.1, 0.1, 0.1), connector_label="warm-connector", seed=7, kb_per_token=28.7
):
    decode = DecodeAB(
        arms={"on": "lab-example", "off": "lab-plain"},
        warmup=3,
        measured=5,
        output_tokens=128,
        kinds=[
            DecodeKind(
                kind="narrative",
                on=StatModel.of([50, 51, 52, 50, 51]),
                off=StatModel.of([51, 50, 52, 51, 50]),
                delta_pct=0.0,
                within_bands=True,
            ),
            DecodeKind(
                kind="code",
                on=StatModel.of([48, 49, 50, 48, 49]),
                off=StatModel.of([49, 50, 49, 48, 50]),
                delta_pct=-0.4,
                within_bands=True,
            ),
        ],
        verdict="no penalty",
        reason="every delta lies within the CV bands",
    )
    return RigCard(
        rig=rig,
        run_id="20260101T000000Z",
        prefill_tokens_per_s=3400.0,
        repro=Reproducibility(
            image_digest="127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "a" * 64,
            profile="lab-example",
            knobs={"VLLM_CPU_KVCACHE_SPACE": "1"},
            prompts=[PromptRecord(kind="narrative", target_tokens=3500, seed=seed, tokens=3498)],
            gpu_models=[],
            host_ram_bytes=24 * 2**30,
            l2_device="/dev/loop3",
            l2_filesystem="ext4",
        ),
        tiers=[
            tier_result("cold", cold),
            tier_result("warm-gpu", warm, gpu=3456),
            tier_result(
                "warm-connector",
                [0.09, 0.1, 0.11],
                label=connector_label,
                ext=3456 if connector_label == "warm-connector" else 0,
            ),
            tier_result("warm-persistent", [0.2, 0.25, 0.2], ext=3456),
        ],
        decode_ab=decode,
        capacity=Capacity(
            kb_per_token=kb_per_token,
            bytes_grown=301_000_000,
            tokens_stored=10_500,
            source="connector store growth",
            tiers=[CapacityTier(name="L2 disk 1 TB", size_bytes=10**12, sessions={"3500": 9900.0, "50000": 697.0})],
        ),
    )


def l2_report(state="ok", level="ok", free=1_500_000_000, problems=()):
    return L2Report(
        path="/mnt/rigkit-l2/lmcache",
        mount="/mnt/rigkit-l2",
        fs_size_bytes=2_040_000_000,
        fs_free_bytes=free,
        min_free_bytes=268_435_456,
        store_bytes=3_500_000,
        budget_bytes=500_000_000,
        janitor="active",
        janitor_state="below-floor" if state == "full" else "ok",
        evicted_entries=12,
        evicted_bytes=42_000_000,
        state=state,
        level=level,
        problems=list(problems),
    )


def judged_soak(tps_last=38.0, memory_last=2150.0):
    """A 2 × 3 soak judged by rigkit.validation.soak (records in the order the soak runs them)."""
    from rigkit.validation.soak import Limits, Plan, judge, turn_order

    plan = Plan(sessions=2, turns=3, message_tokens=64, reply_tokens=32)
    records = [
        SoakTurn(
            session=s,
            turn=t,
            completion_tokens=32,
            decode_tps=40.0 if s == 0 else tps_last,
            memory_mib=memory_last if i == 5 else 2100.0,
        )
        for i, (s, t) in enumerate(turn_order(plan.sessions, plan.turns))
    ]
    return judge(records, plan, Limits(200.0, 0.8, 0.5), "container rigkit-serving cgroup memory")
