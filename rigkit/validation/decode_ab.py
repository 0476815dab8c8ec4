"""Decode A/B: decode tok/s with the connector on and off, measured interleaved (rigkit.validation.abstats holds the
schedule and the verdict); and speculative decoding's acceptance summed over measured request windows.

run_decode_ab takes an `activate(arm)` callable that switches the rig to a profile.
"""

from __future__ import annotations

import random
from typing import Callable, Mapping, Optional, Sequence

from rigkit.errors import ConfigError
from rigkit.metrics import Delta
from rigkit.prompts import PromptSpec
from rigkit.remote.client import ServingClient
from rigkit.validation import abstats
from rigkit.validation.card import DecodeAB, DecodeKind, SpecDecode, StatModel
from rigkit.validation.measure import measure
from rigkit.validation.procedure import ValidationSettings


def spec_decode_over(windows: Sequence[Delta], what: str) -> Optional[SpecDecode]:
    """Speculative decoding summed over request windows (each a /metrics delta around one request), or None
    when they drafted no token (speculative decoding off, or its config never reached the engine)."""
    spec = SpecDecode(
        drafts=sum(w.spec_decode_drafts for w in windows),
        draft_tokens=sum(w.spec_decode_draft_tokens for w in windows),
        accepted_tokens=sum(w.spec_decode_accepted_tokens for w in windows),
        window=what,
    )
    return spec if spec.draft_tokens else None


def run_decode_ab(
    activate: Callable[[str], ServingClient],
    arms: Mapping[str, str],
    settings: ValidationSettings,
    warmup: int = abstats.WARMUP_RUNS,
    measured: int = abstats.MEASURED_RUNS,
    kinds: Sequence[str] = abstats.PROMPT_KINDS,
) -> DecodeAB:
    """Decode tok/s with the connector on and off, interleaved A/B/A/B.

    activate(arm) switches the rig to arms[arm] (a profile name) and returns a ready client;
    it is called once per visit, so a rig that serves both arms at once can return at no cost.
    """
    samples: dict[str, dict[str, list[float]]] = {
        arm: {k: [] for k in kinds} for arm in (abstats.ARM_ON, abstats.ARM_OFF)
    }
    windows: dict[str, list[Delta]] = {abstats.ARM_ON: [], abstats.ARM_OFF: []}
    rng = random.Random(settings.seed)
    visit, client = -1, None
    for step in abstats.ab_schedule((abstats.ARM_ON, abstats.ARM_OFF), kinds, warmup, measured):
        if step.visit != visit:
            visit, client = step.visit, activate(step.arm)
        prompt = client.build_prompt(PromptSpec(step.kind, settings.decode_prompt_tokens, rng.randrange(2**31)))
        if not step.measured:
            client.stream_completion(prompt.text, max_tokens=settings.decode_tokens)
            continue
        run = measure(client, prompt.text, settings.decode_tokens)
        # the server's own decode time: a tunnel or proxy may deliver a stream in bursts, which
        # makes client-side chunk timing read impossibly fast
        tps = (
            run.window.server_decode_tps(run.result.completion_tokens or 0) if run.result.completion_tokens else None
        ) or run.result.decode_tps
        if run.result.aborted or tps is None:
            raise ConfigError(
                "decode A/B",
                step.arm,
                f"a measured {step.kind} run failed ({run.result.error})",
                "check the engine is alive after the profile switch",
            )
        samples[step.arm][step.kind].append(tps)
        windows[step.arm].append(run.window)
    verdict = abstats.compare(samples)
    spec = {
        arm: spec_decode_over(arm_windows, f"the {len(arm_windows)} measured decode runs")
        for arm, arm_windows in windows.items()
    }
    return DecodeAB(
        arms=dict(arms),
        warmup=warmup,
        measured=measured,
        output_tokens=settings.decode_tokens,
        kinds=[
            DecodeKind(
                kind=c.kind,
                on=StatModel.of(c.on.samples),
                off=StatModel.of(c.off.samples),
                delta_pct=c.delta_pct,
                within_bands=c.within_bands,
            )
            for c in verdict.kinds
        ],
        verdict=verdict.verdict,
        reason=verdict.reason,
        spec_decode={arm: value for arm, value in spec.items() if value is not None},
    )
