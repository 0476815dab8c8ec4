"""The card's JSON schema (versioned): what one rig's validation measured, and its verdict.

A RigCard is the only input of a re-render: everything the Markdown and the plots show is in it.
"""

from __future__ import annotations

import statistics
from datetime import datetime, timezone
from typing import Literal, Optional, Sequence

from pydantic import AliasChoices, BaseModel, Field, model_validator

import rigkit
from rigkit.validation.pays import PaysReport, RigLimits
from rigkit.validation.tiers import Tier
from rigkit.validation.ttft import less_api_overhead

SCHEMA_VERSION = 1


class StatModel(BaseModel):
    n: int
    mean: Optional[float] = None
    cv: Optional[float] = None
    samples: list[float] = Field(default_factory=list)

    @classmethod
    def of(cls, samples: Sequence[Optional[float]]) -> "StatModel":
        values = [float(v) for v in samples if v is not None]
        if not values:
            return cls(n=0)
        mean = statistics.fmean(values)
        cv = statistics.stdev(values) / mean if len(values) > 1 and mean else 0.0
        return cls(n=len(values), mean=mean, cv=cv, samples=values)


class TierProof(BaseModel):
    """The counter deltas of one measured request: why it got its label."""

    label: str
    gpu_hits: float
    gpu_queries: float
    external_hits: float
    external_queries: float
    external_kv_transfer_tokens: float
    counters_reset: bool = False
    text: str
    # LMCache's tier behind a connector hit (L1, L2, L1+L2) and how it was told: "counters" (its own
    # hit_l1/hit_l2 counters, or the chunks it loaded and those it prefetched from L2) or "inferred" (from the
    # procedure: the running LMCache does not export them)
    store_tier: Optional[str] = None
    store_tier_source: Optional[str] = None


class GreedyCheck(BaseModel):
    """A warm request's greedy completion (temperature 0, the session's seed) and its top logprobs against a reference
    run of the same session (rigkit.validation.greedy): the verdict reads the shift, the largest move of a top-k
    logprob where both runs saw the same text, against the path's tolerance measured in the same run."""

    session: str  # the salted session's id, first 8 hex digits
    same: bool  # identical text (and tokens, when the server returned them)
    # "same", "numerics" (other tokens, the shift within the tolerance: passes), "inconclusive" (other tokens and
    # no measured band to explain them: does not pass) or "served-but-wrong"; cards before the oracle: by `same`
    verdict: Literal["same", "numerics", "inconclusive", "served-but-wrong"] = "same"
    reference: str = "cold"  # the run this check compares with (the one the warm output is closest to)
    compared_with: list[str] = Field(default_factory=list)  # every reference it was compared with
    reference_text: str = Field(validation_alias=AliasChoices("reference_text", "cold_text"))
    text: str
    first_difference: Optional[int] = None  # index of the first character that differs
    first_difference_token: Optional[int] = None  # index of the first token that differs (with token ids)
    # at the first differing token: the reference's logprob of its own token minus of the warm one (nats); a lower
    # bound when the warm token was outside the reference's top-k (margin_is_bound). Shown, not judged
    margin_nats: Optional[float] = None
    margin_is_bound: bool = False
    near_tie_nats: Optional[float] = None  # cards before the shift verdict: the margin threshold they used
    logprob_drift: Optional[float] = None  # largest chosen-token logprob difference over the tokens both share
    tokens_compared: Optional[int] = None
    shift_nats: Optional[float] = None  # the largest top-k logprob move where both saw the same text
    positions_compared: int = 0  # positions the shift was read at
    tolerance_nats: Optional[float] = None  # the path's tolerance (None: nothing measured could say)
    tolerance_exact: bool = False  # the path is declared bit-exact to the GPU prefix cache
    tolerance_source: str = ""  # where the tolerance came from

    @model_validator(mode="before")
    @classmethod
    def _verdict_of_old_cards(cls, data):
        if isinstance(data, dict) and "verdict" not in data and "same" in data:
            data = {**data, "verdict": "same" if data["same"] else "served-but-wrong"}
        return data

    @property
    def cold_text(self) -> str:
        """The reference's text (named for the cold run, the only reference before warm-gpu became one)."""
        return self.reference_text


class TTFTPair(BaseModel):
    """One measured request's client TTFT beside the server histogram's delta over the same request."""

    client_s: float
    server_s: Optional[float] = None  # None: the window held no single request
    within: bool
    # the API server's cost of the same request outside the histogram's clock (rigkit.validation.ttft), subtracted from
    # client_s before the comparison; None: not measured (a card written before it was, or the 404 failed)
    api_overhead_s: Optional[float] = None

    @property
    def compared_s(self) -> float:
        return less_api_overhead(self.client_s, self.api_overhead_s)


class TTFTClient(BaseModel):
    """Where the card's client TTFT was measured, and how close to the server histogram it had to be."""

    transport: str
    tolerance_rel: float
    tolerance_abs_s: float


class TierResult(BaseModel):
    expected: str
    labels: list[str]  # one per repetition (one salted session each)
    passed: bool
    ttft_s: StatModel  # client side
    server_ttft_s: StatModel  # delta of vllm:time_to_first_token_seconds
    ttft_within_tolerance: list[bool]
    prompt_tokens: list[Optional[int]]
    aborted: list[str] = Field(default_factory=list)  # "prefill"/"decode" per aborted request
    proofs: list[TierProof]
    ttft_pairs: list[TTFTPair] = Field(default_factory=list)  # per measured request, in order
    greedy: list[GreedyCheck] = Field(default_factory=list)  # warm tiers: per session against the cold run

    @property
    def served_but_wrong(self) -> list[GreedyCheck]:
        return [check for check in self.greedy if check.verdict == "served-but-wrong"]

    @property
    def inconclusive(self) -> list[GreedyCheck]:
        """Sessions whose output differs with no measured band to explain it (does not pass)."""
        return [check for check in self.greedy if check.verdict == "inconclusive"]

    @property
    def numerics(self) -> list[GreedyCheck]:
        """Sessions whose output parted from the reference at a near tie (counted as the same output)."""
        return [check for check in self.greedy if check.verdict == "numerics"]

    @property
    def counters_label(self) -> str:
        """The tier the metric deltas prove (rigkit.validation.tiers.label), whatever the outputs were."""
        return self.labels[0] if len(set(self.labels)) == 1 else "inconsistent: " + "/".join(self.labels)

    @property
    def label(self) -> str:
        return Tier.SERVED_BUT_WRONG.value if self.served_but_wrong else self.counters_label

    @property
    def store_tier(self) -> Optional[str]:
        """e.g. "LMCache L2, by LMCache's counters" or "LMCache L1, inferred"; None without an LMCache hit."""
        tiers = {(p.store_tier, p.store_tier_source) for p in self.proofs if p.store_tier}
        if len(tiers) != 1:
            return None if not tiers else "LMCache " + "/".join(sorted(t for t, _ in tiers))
        tier, source = tiers.pop()
        return f"LMCache {tier}" + (", inferred" if source == "inferred" else ", by LMCache's counters")


class DecodeKind(BaseModel):
    kind: str
    on: StatModel
    off: StatModel
    delta_pct: float
    within_bands: bool


class SpecDecode(BaseModel):
    """Speculative decoding over a window: deltas of vLLM's vllm:spec_decode_num_* counters."""

    drafts: float  # steps that drafted
    draft_tokens: float
    accepted_tokens: float
    window: str  # which requests the deltas cover

    @property
    def acceptance_rate(self) -> Optional[float]:
        """Accepted / draft tokens (vLLM's own definition, vllm/v1/spec_decode/metrics.py)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> Optional[float]:
        """Tokens per drafting step, the bonus token included: 1 + accepted / drafts."""
        return 1 + self.accepted_tokens / self.drafts if self.drafts else None


class DecodeAB(BaseModel):
    arms: dict[str, str]  # "on"/"off" -> profile name
    warmup: int
    measured: int
    output_tokens: int
    kinds: list[DecodeKind]
    verdict: str
    reason: str
    spec_decode: dict[str, SpecDecode] = Field(default_factory=dict)  # arm -> over its measured runs


class CapacityTier(BaseModel):
    name: str
    size_bytes: int
    sessions: dict[str, float]  # session size in tokens (as text) -> sessions the tier holds
    rule: Optional[str] = None  # the cache's eviction rule the sessions were counted with (None: the whole tier)


class Capacity(BaseModel):
    kb_per_token: Optional[float] = None
    bytes_grown: int = 0
    tokens_stored: int = 0
    source: str = ""
    tiers: list[CapacityTier] = Field(default_factory=list)


class PromptRecord(BaseModel):
    kind: str
    target_tokens: int
    seed: int
    tokens: Optional[int] = None


class Reproducibility(BaseModel):
    rigkit_version: str = rigkit.__version__
    image_digest: Optional[str] = None
    model_source: Optional[str] = None  # the staged model (source@revision: commit or manifest sha256)
    profile: Optional[str] = None
    knobs: dict[str, object] = Field(default_factory=dict)
    prompts: list[PromptRecord] = Field(default_factory=list)
    output_tokens: Optional[int] = None
    driver_version: Optional[str] = None
    cuda_version: Optional[str] = None
    gpu_models: list[str] = Field(default_factory=list)
    # False: the serving machine was never read (an endpoint known by its URL): no GPU listed is not "a CPU"
    machine_read: bool = True
    # nvidia_driver_power_limit_w as the rig's data declared it (None: the cards' default) and each GPU's enforced
    # limit as nvidia-smi read it during the run (watts): a decode A/B at two caps compares these
    power_limit_declared_w: Optional[float] = None
    power_limits_enforced_w: list[Optional[float]] = Field(default_factory=list)
    host_ram_bytes: Optional[int] = None
    l2_device: Optional[str] = None
    l2_filesystem: Optional[str] = None
    # what guards the L2 files against a torn write (rigkit.serving.render.l2_integrity); None: no LMCache fs L2
    l2_integrity: Optional[str] = None
    max_model_len: Optional[int] = None
    num_gpu_blocks: Optional[int] = None
    block_size: Optional[int] = None


L2Level = Literal["ok", "warn", "fail"]


class L2Report(BaseModel):
    """The L2 disk tier as validation found it (rigkit.l2_state.classify_l2 fills it)."""

    path: str
    mount: Optional[str] = None
    fs_size_bytes: Optional[int] = None
    fs_free_bytes: Optional[int] = None
    min_free_bytes: int
    store_bytes: Optional[int] = None
    budget_bytes: int
    janitor: Optional[str] = None  # systemd's word for the janitor unit; None: the connector evicts by itself
    janitor_state: Optional[str] = None  # the janitor's own state from its status file
    evicted_entries: int = 0
    evicted_bytes: int = 0
    last_eviction_reason: Optional[str] = None
    state: str  # ok, low, full, over-budget, janitor-down, unknown, export-unmounted (kv_share)
    level: L2Level
    problems: list[str] = Field(default_factory=list)  # each with its fix


class SoakTurn(BaseModel):
    """One turn of one soak conversation, as measured (rigkit.validation.soak runs them)."""

    session: int
    turn: int
    prompt_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None
    decode_tps: Optional[float] = None
    empty_reply: bool = False
    error: Optional[str] = None
    memory_mib: Optional[float] = None  # the rig's memory right after this turn (SoakReport.memory_source)


class SoakReport(BaseModel):
    """The soak's measurements and verdict (rigkit.validation.soak.judge fills it)."""

    sessions: int
    turns: int  # per session
    open_sessions: int
    message_tokens: int
    reply_tokens: int
    memory_source: str
    memory_growth_limit_mib: float
    decode_retention_min: float
    empty_reply_max_fraction: float
    turns_run: int
    errors: int
    answered: int
    empty_replies: int
    baseline_session: Optional[int] = None  # the first clean session: baseline of memory and decode speed
    last_session: Optional[int] = None
    decode_tps_baseline: Optional[float] = None
    decode_tps_last: Optional[float] = None
    decode_retention: Optional[float] = None
    memory_baseline_mib: Optional[float] = None
    memory_last_mib: Optional[float] = None
    memory_growth_mib: Optional[float] = None
    failures: list[str] = Field(default_factory=list)  # each names its rule and numbers
    records: list[SoakTurn] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def empty_fraction(self) -> Optional[float]:
        return self.empty_replies / self.answered if self.answered else None


class SharedPair(BaseModel):
    """The warm-shared tier for one ordered pair of rigs sharing a KV tier (rigkit.validation.warm_shared): salted prompts
    prefilled on `source` (each labelled cold by the source's counters), then asked of `target` (this card's rig),
    labelled by the target's own counters (rigkit.validation.tiers.label_shared), its greedy output against the source's."""

    source: str
    target: str
    prefill: TierResult  # on the source: expected cold (a warm prefill means the salt was not fresh)
    asked: TierResult  # on the target: expected warm-shared
    prompts: list[PromptRecord] = Field(default_factory=list)  # kind, size and body seed of each salted prompt

    @property
    def passed(self) -> bool:
        return self.prefill.passed and self.asked.passed

    @property
    def label(self) -> str:
        return self.asked.label


class NumericsBands(BaseModel):
    """How far numerics moved logprobs on this rig in this run (rigkit.validation.greedy.band): the GPU prefix cache
    asked twice, and against the fresh prefill; each connector tier's tolerance is derived from them."""

    repeat_nats: Optional[float] = None
    cached_vs_fresh_nats: Optional[float] = None
    ceiling_nats: float
    sessions: int
    tolerances: dict[str, Optional[float]] = Field(default_factory=dict)  # tier -> its tolerance (nats)
    exact_tiers: list[str] = Field(default_factory=list)  # tiers held to the repeat band (bit-exact paths)


class PowerRow(BaseModel):
    """One damage of the self-test (rigkit.validation.power): what it changed and whether the verdict caught it."""

    damage: str
    description: str
    files: int
    bytes_damaged: int
    label: str  # the tier the damaged session's counters prove
    verdict: str  # the served-right verdict of its output
    shift_nats: Optional[float] = None
    caught: bool


class Power(BaseModel):
    """The served-right check's power on this rig and model: each damage to a copy of the tier's store."""

    tier: str
    tolerance_nats: Optional[float] = None
    rows: list[PowerRow] = Field(default_factory=list)
    smallest_caught: Optional[str] = None
    note: str = ""
    # after the measurement: the damaged entries deleted (their count) and the engine restarted (a damaged load can
    # leave NaN in the engine's KV pool, answering later requests wrongly: seen on vLLM CPU); None: not done
    entries_removed: Optional[int] = None
    restarted_after: bool = False


class RigCard(BaseModel):
    schema_version: Literal[1] = SCHEMA_VERSION
    rig: str
    run_id: str
    created_at: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    repro: Reproducibility = Field(default_factory=Reproducibility)
    connector_configured: bool = True
    prefill_tokens_per_s: Optional[float] = None
    ttft_client: Optional[TTFTClient] = None  # None: a card written before the client's place was recorded
    tiers: list[TierResult] = Field(default_factory=list)
    decode_ab: Optional[DecodeAB] = None
    spec_decode: Optional[SpecDecode] = None  # over the measured tier requests
    capacity: Optional[Capacity] = None
    l2: Optional[L2Report] = None
    soak: Optional[SoakReport] = None
    # tier -> why this stack cannot have it (validation ran no step for it; it does not fail the card)
    not_applicable: dict[str, str] = Field(default_factory=dict)
    # the warm-shared tier: prompts another rig prefilled, asked of this one (rigkit validate-shared)
    shared: list[SharedPair] = Field(default_factory=list)
    failures: list[str] = Field(default_factory=list)
    numerics: Optional[NumericsBands] = None  # the bands the served-right verdict was measured against
    power: Optional[Power] = None  # the self-test: the smallest damage the verdict catches here
    # issue 42: the rig's own limits (rigkit/files/rig_limits.py) and each warm tier against the floor they set, with
    # the sweep of context lengths when validate_pays_lengths asked for one (rigkit.validation.pays)
    rig_limits: Optional[RigLimits] = None
    pays: Optional[PaysReport] = None

    @property
    def passed(self) -> bool:
        """Nothing measured is no pass: a card needs a tier or a shared pair, each of them passed."""
        return (
            bool(self.tiers or self.shared)
            and not self.failures
            and all(t.passed for t in self.tiers)
            and (self.l2 is None or self.l2.level != "fail")
            and (self.soak is None or self.soak.passed)
            and all(pair.passed for pair in self.shared)
        )

    def tier(self, expected: str) -> Optional[TierResult]:
        return next((t for t in self.tiers if t.expected == expected), None)


# --- A replay compared with the run it repeats (rigkit.validation.card.replay builds it; written as replay.json) ---------------

Verdict = Literal["reproduces", "differs", "not compared"]


class RecordedRig(BaseModel):
    """A rig of the recorded run, as the replay's fleet card shows it beside the new rigs."""

    rig: str
    run_id: str
    created_at: str
    passed: bool


class SetupDifference(BaseModel):
    """One setting that is not the same on every rig compared: each rig's value, as its card shows it."""

    setting: str
    recorded: dict[str, str]  # recorded rig -> value
    new: dict[str, str]  # rig of this run -> value


class FigureVerdict(BaseModel):
    """One figure of one rig of this run against the recorded run (its rigs' samples pooled)."""

    figure: str  # rigkit.validation.card.figures.Figure.key
    title: str
    rig: str
    recorded: StatModel
    new: Optional[StatModel] = None
    delta: Optional[float] = None  # new − recorded, in the figure's unit
    delta_pct: Optional[float] = None  # of the recorded mean; None when that is 0
    verdict: Verdict
    text: str  # the verdict in words, with the difference and the bands


class ReplayComparison(BaseModel):
    schema_version: Literal[1] = SCHEMA_VERSION
    run_id: str
    recorded_run: str
    recorded: list[RecordedRig]
    rigs: list[str]
    rule: str
    setup_differences: list[SetupDifference]
    figures: list[FigureVerdict]

    def count(self, verdict: str) -> int:
        return sum(f.verdict == verdict for f in self.figures)
