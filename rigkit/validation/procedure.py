"""One rig's cache validation, as plain Python: a client, a restart callable, and settings.

Procedure (each step labelled by metric deltas, see rigkit.validation.tiers):
  1. calibrate: one shorter salted prompt measures the prefill rate (sets the long-prefill timeout);
  2. cold: each salted session prompt once (GPU hits and external hits flat);
  3. warm-gpu: the same prompt immediately again (GPU prefix hits grew);
  4. warm-connector: filler requests push the GPU pool's capacity (vllm:cache_config_info
     num_gpu_blocks × block_size) through it, evicting the prefix; then the prompt again
     (GPU hits flat, external hits grew);
  5. warm-persistent: `restart()` (compose down/up), wait ready, the prompt again (external hits grew).
A tier the stack cannot have (`not_applicable`, from Settings.tiers_not_applicable: no connector, or nothing that
outlives a restart) gets no step; the card says "not applicable" once, with why, and it does not fail the card.
A tier whose connector is configured but takes no external hit is "retrieved-but-unused": a FAIL.
Every request is greedy (temperature 0, the session's seed) and asks for its top logprobs. Each session's warm-gpu
request is repeated once, unmeasured: with cold, the bands numerics moves logprobs by on this rig (repeat,
cached-vs-fresh), from which each connector tier's tolerance is derived. A warm tier whose logprobs moved further from
its references (cold, and warm-gpu, the same cached-prefix path) is "served-but-wrong", a FAIL whatever its counters
prove (LMCache#4492); other tokens with no measured band to explain them are "inconclusive" (rigkit.validation.greedy).
With validate_power_selftest and a reachable store, self-test sessions measure the check's power
(rigkit.validation.power); their damaged entries are deleted and the engine restarted once more afterwards (a damaged
load can leave NaN in the KV pool: on the lab's vLLM CPU, a later short prompt got NaN logits until a restart).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from rigkit.errors import ConfigError
from rigkit.metrics import Snapshot, require_prefix_counters
from rigkit.prompts import Prompt, PromptSpec
from rigkit.remote.client import ServingClient, ServingError, prefill_timeout
from rigkit.settings.defaults import CALIBRATION_MIN_TOKENS
from rigkit.settings.defaults import VALIDATION_VARIABLES as VARIABLES
from rigkit.settings.eviction import EvictionRule
from rigkit.settings.sizing import KB
from rigkit.settings.variables import resolve
from rigkit.validation.card import Capacity, CapacityTier, NumericsBands, Power
from rigkit.validation.greedy import Completion, Tolerance, calibrated, calibration_bands
from rigkit.validation.measure import measure, repeat_unmeasured
from rigkit.validation.power import (
    StoreAccess,
    clean_up_selftest,
    damage_selftest,
    measure_power,
    prefill_selftest,
)
from rigkit.validation.tier_run import TierRun
from rigkit.validation.tiers import Tier, label

# Pushing exactly the pool's size through it may leave a block or two of the prefix: overshoot.
FILLER_OVERSHOOT = 1.25
# Tokens kept free below max-model-len for the reply and the chat/BOS tokens.
CONTEXT_SLACK_TOKENS = 64
# Calibration prompt: this fraction of the session size (at least CALIBRATION_MIN_TOKENS).
CALIBRATION_FRACTION = 0.25
# A one-token request asking for logprobs, sent before anything is timed (see validate_tiers).
LOGPROBS_WARMUP_PROMPT = "Warm-up of the logprobs path."


def capacity_from(
    bytes_grown: int,
    tokens_stored: int,
    source: str,
    tier_sizes: Mapping[str, int],
    session_sizes: Sequence[int],
    rules: Optional[Mapping[str, EvictionRule]] = None,
) -> Capacity:
    """KB/token from measured growth, and how many sessions of each size every tier holds: by its cache's eviction
    rule (`rules`, tier name -> rule: whole sessions held before an eviction fires), else the whole tier's size."""
    if bytes_grown <= 0 or tokens_stored <= 0:
        return Capacity(bytes_grown=bytes_grown, tokens_stored=tokens_stored, source=source + " (no growth seen)")
    per_token = bytes_grown / tokens_stored
    rules = rules or {}

    def held(name: str, size: int, tokens: int) -> float:
        rule = rules.get(name)
        return rule.sessions_held(size, per_token * tokens) if rule else size / (per_token * tokens)

    tiers = [
        CapacityTier(
            name=name,
            size_bytes=size,
            sessions={str(s): held(name, size, s) for s in session_sizes},
            rule=rules[name].text if name in rules else None,
        )
        for name, size in tier_sizes.items()
    ]
    return Capacity(
        kb_per_token=per_token / KB, bytes_grown=bytes_grown, tokens_stored=tokens_stored, source=source, tiers=tiers
    )


@dataclass
class ValidationSettings:
    """Validation settings; defaults live in VARIABLES only: build with ValidationSettings.from_data({...})."""

    prompt_tokens: int
    sessions: int
    prompt_kind: str
    output_tokens: int
    decode_tokens: int
    decode_prompt_tokens: int
    seed: Optional[int]
    restart: bool
    decode_ab: bool
    soak_sessions: int
    soak_turns: int
    soak_message_tokens: int
    soak_reply_tokens: int
    soak_memory_growth_mib: float
    soak_decode_retention_min: float
    soak_empty_reply_max_fraction: float
    top_logprobs: int
    numerics_ceiling_nats: float
    power_selftest: bool
    pays_lengths: tuple[int, ...]

    @classmethod
    def from_data(cls, data: Mapping) -> "ValidationSettings":
        """From host/--data values named like VARIABLES (`validate_` prefix)."""
        values = resolve(VARIABLES, data)
        return cls(**{v.name.removeprefix("validate_"): values[v.name] for v in VARIABLES})


@dataclass
class TierValidation:
    tiers: list[TierRun]
    prompts: list[Prompt]
    prefill_tokens_per_s: Optional[float]
    pool: Snapshot
    max_model_len: Optional[int]
    failures: list[str]
    capacity: Optional[Capacity] = None
    fillers_sent: int = 0
    ttft_transport: str = ""  # where the client TTFT was measured (ServingClient.ttft_transport)
    # tier value -> why this stack cannot have it (no step was run for it)
    not_applicable: dict[str, str] = field(default_factory=dict)
    numerics: Optional[NumericsBands] = None
    power: Optional[Power] = None

    def tier(self, expected: Tier) -> Optional[TierRun]:
        return next((t for t in self.tiers if t.expected == expected), None)


def filler_plan(pool_tokens: int, max_model_len: int, prompt_tokens: int, output_tokens: int) -> tuple[int, int]:
    """(filler size in tokens, number of fillers) that push FILLER_OVERSHOOT × the pool through it."""
    size = max(CALIBRATION_MIN_TOKENS, min(prompt_tokens, max_model_len - output_tokens - CONTEXT_SLACK_TOKENS))
    return size, math.ceil(pool_tokens * FILLER_OVERSHOOT / size)


def evict_gpu_pool(client: ServingClient, pool: Snapshot, settings: ValidationSettings, timeout_s: float) -> int:
    """Send salted filler prompts sized from the pool; returns how many were sent."""
    max_len = client.max_model_len or settings.prompt_tokens + settings.output_tokens + CONTEXT_SLACK_TOKENS
    if pool.gpu_pool_tokens is None:
        raise ConfigError(
            "vllm:cache_config_info",
            pool.cache_config,
            "num_gpu_blocks/block_size missing",
            "serve with a vLLM that exports vllm:cache_config_info (v1 engine)",
        )
    size, count = filler_plan(pool.gpu_pool_tokens, max_len, settings.prompt_tokens, settings.output_tokens)
    rng = random.Random()
    for _ in range(count):
        filler = client.build_prompt(PromptSpec("narrative", size, rng.randrange(2**31)))
        result = client.stream_completion(filler.text, max_tokens=1, timeout_s=timeout_s)
        if result.aborted:
            raise ConfigError(
                "filler",
                size,
                f"a filler request was aborted ({result.error})",
                "check the engine is alive; lower validate_prompt_tokens",
            )
    return count


def stored_tokens(prompt_tokens: int, chunk_tokens: Optional[int]) -> int:
    """Tokens of a prompt a store that keeps whole chunks holds (LMCache: 3,500 tokens -> 13 x 256 = 3,328)."""
    return prompt_tokens // chunk_tokens * chunk_tokens if chunk_tokens else prompt_tokens


def check_prompt_fits(settings: ValidationSettings, max_model_len: Optional[int]) -> None:
    """ConfigError when a session prompt and its reply, or a decode A/B prompt and its tokens, do not fit the
    max-model-len (the server's, or the declared knob before any host is touched; None: unknown)."""
    if max_model_len and settings.prompt_tokens + settings.output_tokens + CONTEXT_SLACK_TOKENS > max_model_len:
        raise ConfigError(
            "validate_prompt_tokens",
            settings.prompt_tokens,
            f"does not fit max-model-len {max_model_len} with the reply "
            f"(validate_output_tokens {settings.output_tokens})",
            f"set validate_prompt_tokens <= {max_model_len - settings.output_tokens - CONTEXT_SLACK_TOKENS}",
        )
    decode = settings.decode_prompt_tokens + settings.decode_tokens + CONTEXT_SLACK_TOKENS
    if max_model_len and settings.decode_ab and decode > max_model_len:
        raise ConfigError(
            "validate_decode_tokens",
            settings.decode_tokens,
            f"with validate_decode_prompt_tokens {settings.decode_prompt_tokens} does not fit "
            f"max-model-len {max_model_len}",
            f"set validate_decode_tokens <= {max_model_len - settings.decode_prompt_tokens - CONTEXT_SLACK_TOKENS}",
        )


def warm_up_logprobs(client: ServingClient, top_logprobs: int) -> None:
    """One unmeasured one-token request asking for logprobs, before anything on this engine is timed (a no-op when
    the oracle asks for none). Its prompt shares no prefix with a measured one (those open with their salted
    "Session <id>." header, rigkit.prompts) and is shorter than one KV block: it caches nothing a measured
    prompt could hit. ConfigError when
    the engine cannot give logprobs."""
    if not top_logprobs:
        return
    # vLLM CPU compiles its sampler's logprobs path (torch inductor) at the first request asking for logprobs:
    # tens of seconds that must not land in the calibration or a measured window
    try:
        warmup = client.stream_completion(LOGPROBS_WARMUP_PROMPT, max_tokens=1, logprobs=top_logprobs)
        problem = warmup.error or ("" if warmup.tokens else "the reply carried no logprobs")
    except ServingError as exc:
        problem = str(exc)
    if problem:
        raise ConfigError(
            "validate_top_logprobs",
            top_logprobs,
            f"a one-token request asking for logprobs failed: {problem}",
            "give the engine what logprobs need (vLLM CPU compiles that path: g++ and the Python "
            "headers in the image), or set validate_top_logprobs: 0 (then any difference in "
            "the output is served-but-wrong)",
        )


def validate_tiers(
    client: ServingClient,
    restart: Optional[Callable[[], None]],
    settings: ValidationSettings,
    connector_configured: bool = True,
    store_bytes: Optional[Callable[[], int]] = None,
    capacity_tiers: Optional[Mapping[str, int]] = None,
    capacity_rules: Optional[Mapping[str, EvictionRule]] = None,
    session_sizes: Sequence[int] = (50_000, 262_144),
    not_applicable: Optional[Mapping[str, str]] = None,
    store_chunk_tokens: Optional[int] = None,
    bit_exact_tiers: Sequence[str] = (),
    store: Optional[StoreAccess] = None,
    model_layers: Optional[int] = None,
) -> TierValidation:
    """Run the tier procedure against a ready server. `restart` does a full down/up (None: skip tier 4).

    not_applicable: tier value -> why the stack cannot have it (Settings.tiers_not_applicable): its step is not run.
    store_chunk_tokens: the connector stores whole chunks of this many tokens (LMCache's chunk_size): the capacity
    line divides the store's growth by the tokens it stored, not by the prompt tokens.
    capacity_rules: capacity tier name -> the eviction rule its cache follows (rigkit.settings.eviction.rule_for).
    bit_exact_tiers: tiers held to the GPU prefix cache's repeat band (Settings.bit_exact_tiers).
    store, model_layers: the connector's store as this process reaches it, and the model's layers: with
    validate_power_selftest, the self-test measures the verdict's power on the persistent tier.
    """
    skipped = dict(not_applicable or {})
    if Tier.WARM_CONNECTOR.value in skipped:
        connector_configured = False
    client.wait_ready()
    pool = require_prefix_counters(client.metrics())
    max_len = client.max_model_len
    check_prompt_fits(settings, max_len)
    seed = settings.seed if settings.seed is not None else random.randrange(2**31)
    failures: list[str] = []

    warm_up_logprobs(client, settings.top_logprobs)
    calibration_tokens = max(CALIBRATION_MIN_TOKENS, int(settings.prompt_tokens * CALIBRATION_FRACTION))
    calibration = client.build_prompt(PromptSpec(settings.prompt_kind, calibration_tokens, seed - 1))
    calibrated_prefill = client.stream_completion(calibration.text, max_tokens=1)
    rate = None
    if calibrated_prefill.ttft_s and calibrated_prefill.prompt_tokens:
        rate = calibrated_prefill.prompt_tokens / calibrated_prefill.ttft_s
    else:
        failures.append(f"prefill calibration failed ({calibrated_prefill.error or 'no first token'})")

    prompts = [
        client.build_prompt(PromptSpec(settings.prompt_kind, settings.prompt_tokens, seed + i))
        for i in range(settings.sessions)
    ]
    timeout_s = prefill_timeout(max(p.tokens for p in prompts), rate)

    def ask(run: TierRun, prompt: Prompt, after_restart: bool = False) -> None:
        """One prompt measured into `run`, labelled by its window (rigkit.validation.power.Ask)."""
        measured = measure(
            client,
            prompt.text,
            settings.output_tokens,
            timeout_s,
            seed=prompt.spec.seed,
            logprobs=settings.top_logprobs,
        )
        run.measured.append(measured)
        run.prompts.append(prompt)
        run.labels.append(label(measured.window, run.expected, connector_configured, after_restart))

    ceiling = settings.numerics_ceiling_nats
    cold = TierRun(Tier.COLD)
    # the reference path the bands are read on: held to the ceiling alone
    reference_path = Tolerance(ceiling, False, "validate_numerics_ceiling_nats (warm-gpu is the reference path)")
    warm_gpu = TierRun(Tier.WARM_GPU, reference=cold, tolerance=reference_path)
    runs = [cold, warm_gpu]
    repeats: dict[str, Completion] = {}
    store_before = store_bytes() if store_bytes else None
    for prompt in prompts:
        ask(cold, prompt)
        if cold.measured[-1].result.aborted:
            r = cold.measured[-1].result
            failures.append(
                f"cold prefill of session {prompt.session_id[:8]} aborted in {r.abort_phase} after "
                f"{r.total_s:.0f} s (timeout {timeout_s:.0f} s): only the completed prefix is cached"
            )
            continue
        ask(warm_gpu, prompt)
        if settings.top_logprobs:
            repeated = repeat_unmeasured(
                client,
                prompt.text,
                settings.output_tokens,
                timeout_s,
                seed=prompt.spec.seed,
                logprobs=settings.top_logprobs,
            )
            if repeated is not None:
                repeats[prompt.session_id] = repeated
    stored = [p for p, m in zip(cold.prompts, cold.measured) if not m.result.aborted]
    repeat_band, fresh_band = calibration_bands(cold.completions(), warm_gpu.completions(), repeats)
    tolerances = {
        tier.value: calibrated(repeat_band, fresh_band, tier.value in bit_exact_tiers, ceiling)
        for tier in (Tier.WARM_CONNECTOR, Tier.WARM_PERSISTENT)
    }
    numerics = NumericsBands(
        repeat_nats=repeat_band,
        cached_vs_fresh_nats=fresh_band,
        ceiling_nats=ceiling,
        sessions=len(repeats),
        tolerances={Tier.WARM_GPU.value: ceiling, **{name: t.nats for name, t in tolerances.items()}},
        exact_tiers=list(bit_exact_tiers),
    )

    capacity = None
    if store_bytes is not None and store_before is not None:
        grown = store_bytes() - store_before
        tokens = sum(
            stored_tokens(m.result.prompt_tokens or 0, store_chunk_tokens)
            for m in cold.measured
            if not m.result.aborted
        )
        source = "connector store growth over the cold sessions" + (
            f" (whole {store_chunk_tokens}-token chunks stored)" if store_chunk_tokens else ""
        )
        sizes = [settings.prompt_tokens, *session_sizes]
        capacity = capacity_from(grown, tokens, source, capacity_tiers or {}, sizes, capacity_rules)

    validation = TierValidation(
        runs,
        prompts,
        rate,
        pool,
        max_len,
        failures,
        capacity,
        ttft_transport=client.ttft_transport,
        not_applicable=skipped,
        numerics=numerics,
    )
    if not connector_configured or not stored:
        return validation

    persistent_runs = restart is not None and settings.restart and Tier.WARM_PERSISTENT.value not in skipped
    selftest = None
    if settings.power_selftest and store is not None and persistent_runs:
        selftest = prefill_selftest(client, store, settings.prompt_kind, settings.prompt_tokens, seed, ask)

    validation.fillers_sent = evict_gpu_pool(client, pool, settings, timeout_s)
    connector = TierRun(
        Tier.WARM_CONNECTOR, reference=cold, same_path=warm_gpu, tolerance=tolerances[Tier.WARM_CONNECTOR.value]
    )
    runs.append(connector)
    for prompt in stored:
        ask(connector, prompt)

    if persistent_runs:
        damaged = damage_selftest(store, selftest, model_layers) if selftest else []
        restart()
        client.wait_ready()
        warm_up_logprobs(client, settings.top_logprobs)  # a new engine compiles its logprobs path again
        tolerance = tolerances[Tier.WARM_PERSISTENT.value]
        persistent = TierRun(Tier.WARM_PERSISTENT, reference=cold, same_path=warm_gpu, tolerance=tolerance)
        runs.append(persistent)
        for prompt in stored:
            ask(persistent, prompt, after_restart=True)
        if selftest:
            validation.power = measure_power(selftest, damaged, tolerance, ask)
            # the engine loaded damaged KV: a rig is left as it was found, never serving from a poisoned pool
            validation.power.entries_removed = clean_up_selftest(store, selftest)
            restart()
            client.wait_ready()
            validation.power.restarted_after = True
    return validation
