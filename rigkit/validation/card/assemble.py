"""A validation's results card: to_card assembles it from the measured tiers; replay_data reads a recorded card's
prompts back as the validation data that repeats them on another rig."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Sequence

from rigkit.errors import ConfigError
from rigkit.validation.card import DecodeAB, L2Report, PromptRecord, RigCard, SoakReport, TTFTClient, load_cards
from rigkit.validation.card.pays import does_it_pay
from rigkit.validation.decode_ab import spec_decode_over
from rigkit.validation.pays import RigLimits, SweepPoint
from rigkit.validation.procedure import TierValidation, ValidationSettings
from rigkit.validation.ttft import TTFT_TOLERANCE_ABS_S, TTFT_TOLERANCE_REL


def to_card(
    rig: str,
    run_id: str,
    validation: TierValidation,
    settings: ValidationSettings,
    connector_configured: bool = True,
    decode_ab: Optional[DecodeAB] = None,
    repro: Optional[Mapping] = None,
    l2: Optional[L2Report] = None,
    soak: Optional[SoakReport] = None,
    speculative: bool = False,
    rig_limits: Optional[RigLimits] = None,
    sweep: Sequence[SweepPoint] = (),
    declared_kv_bytes_per_token: Optional[float] = None,
) -> RigCard:
    """The rig's results card (rigkit.validation.card renders it). ``speculative``: the stack serves with a speculative
    config, so its tier requests must have drafted tokens. ``rig_limits``: what rigkit/files/rig_limits.py measured;
    ``sweep``: the points of validate_pays_lengths (rigkit.validation.pays_sweep); ``declared_kv_bytes_per_token``:
    the settings' figure (Settings.kv_bytes_per_token), the floor's when the run measured no store growth."""
    windows = [m.window for tier in validation.tiers for m in tier.measured]
    spec = spec_decode_over(windows, f"the {len(windows)} measured tier requests")
    failures = list(validation.failures)
    if speculative and spec is None:
        failures.append(
            "speculative decoding is configured but vLLM counted no draft token over the measured "
            "requests (vllm:spec_decode_num_draft_tokens_total): check the speculative_config "
            "reached the engine (its log, the container's command line)"
        )
    card = RigCard(
        rig=rig,
        run_id=run_id,
        connector_configured=connector_configured,
        prefill_tokens_per_s=validation.prefill_tokens_per_s,
        ttft_client=TTFTClient(
            transport=validation.ttft_transport, tolerance_rel=TTFT_TOLERANCE_REL, tolerance_abs_s=TTFT_TOLERANCE_ABS_S
        )
        if validation.ttft_transport
        else None,
        tiers=[t.result() for t in validation.tiers],
        decode_ab=decode_ab,
        spec_decode=spec,
        capacity=validation.capacity,
        l2=l2,
        soak=soak,
        failures=failures,
        not_applicable=dict(validation.not_applicable),
        numerics=validation.numerics,
        power=validation.power,
    )
    card.repro = card.repro.model_copy(update=dict(repro or {}))
    card.repro.prompts = [
        PromptRecord(kind=p.spec.kind, target_tokens=p.spec.target_tokens, seed=p.spec.seed, tokens=p.tokens)
        for p in validation.prompts
    ]
    card.repro.output_tokens = settings.output_tokens
    card.repro.max_model_len = validation.max_model_len
    card.repro.num_gpu_blocks = validation.pool.num_gpu_blocks
    card.repro.block_size = validation.pool.block_size
    card.rig_limits = rig_limits
    card.pays = does_it_pay(card, sweep, declared_kv_bytes_per_token)
    return card


def replay_data(run_dir: Path) -> dict:
    """Host-data values that repeat a recorded run's prompts (sizes, kind, seeds, sessions) on another rig."""
    card = load_cards(run_dir)[0]
    prompts = card.repro.prompts
    if not prompts:
        raise ConfigError("replay", str(run_dir), "the recorded card lists no prompts", "replay a full validation run")
    data = {
        "validate_prompt_tokens": prompts[0].target_tokens,
        "validate_prompt_kind": prompts[0].kind,
        "validate_seed": prompts[0].seed,
        "validate_sessions": len(prompts),
    }
    if card.repro.output_tokens:
        data["validate_output_tokens"] = card.repro.output_tokens
    return data
