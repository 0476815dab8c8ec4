"""One rig's cache validation, as plain Python: a client, a restart callable, and settings.

Procedure (each step labelled by metric deltas, see rigkit.tiers):
  1. calibrate: one shorter salted prompt measures the prefill rate (sets the long-prefill timeout);
  2. cold: each salted session prompt once (GPU hits and external hits flat);
  3. warm-gpu: the same prompt immediately again (GPU prefix hits grew);
  4. warm-connector: filler requests push the GPU pool's capacity (vllm:cache_config_info
     num_gpu_blocks × block_size) through it, evicting the prefix; then the prompt again
     (GPU hits flat, external hits grew);
  5. warm-persistent: `restart()` (compose down/up), wait ready, the prompt again (external hits grew).
A tier whose connector is configured but takes no external hit is "retrieved-but-unused": a FAIL.
Every request is greedy (temperature 0, the session's seed): a warm tier whose output differs from the cold
run's for the same session is "served-but-wrong", a FAIL whatever its counters prove (LMCache#4492).
Decode A/B (run_decode_ab) takes an `activate(arm)` callable that switches the rig to a profile.
"""

from __future__ import annotations

import json
import math
import random
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from rigkit import abstats
from rigkit.card import (Capacity, CapacityTier, DecodeAB, DecodeKind, GreedyCheck, L2Report, PromptRecord, RigCard,
                         SoakReport, SpecDecode, StatModel, TierProof, TierResult, TTFTClient, TTFTPair, fmt_bytes,
                         load_cards)
from rigkit.client import Measured, ServingClient, measure, prefill_timeout
from rigkit.errors import ConfigError
from rigkit.files.l2_janitor import (L2_JANITOR_MIN_FREE_BYTES, L2_JANITOR_UNIT, STATE_BELOW_FLOOR, STATE_REFUSED,
                                     STATUS_FILE)
from rigkit.metrics import Delta, Snapshot, require_prefix_counters
from rigkit.prompts import Prompt, PromptSpec
from rigkit.sizing import GB
from rigkit.tiers import Tier, TierLabel, label
from rigkit.ttft import TTFT_TOLERANCE_ABS_S, TTFT_TOLERANCE_REL
from rigkit.defaults import CALIBRATION_MIN_TOKENS, VALIDATION_VARIABLES as VARIABLES

# Pushing exactly the pool's size through it may leave a block or two of the prefix: overshoot.
FILLER_OVERSHOOT = 1.25
# Tokens kept free below max-model-len for the reply and the chat/BOS tokens.
CONTEXT_SLACK_TOKENS = 64
# Calibration prompt: this fraction of the session size (at least CALIBRATION_MIN_TOKENS).
CALIBRATION_FRACTION = 0.25
KB = 1000  # the card's KB/token is in decimal kilobytes, as in the user's card
# The janitor runs every few seconds: a store this much over its budget between two rounds is normal.
L2_OVER_BUDGET_TOLERANCE = 0.05
# A janitor whose status file is older than this is stuck (it writes one every round).
L2_JANITOR_STALE_S = 60.0


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

    @classmethod
    def from_data(cls, data: Mapping) -> "ValidationSettings":
        """From host/--data values named like VARIABLES (`validate_` prefix)."""
        from rigkit.variables import resolve

        values = resolve(VARIABLES, data)
        return cls(**{v.name.removeprefix("validate_"): values[v.name] for v in VARIABLES})


def compare_greedy(session_id: str, cold_text: str, text: str) -> GreedyCheck:
    """A warm request's greedy output against the cold run's of the same session."""
    differs = next((i for i, (a, b) in enumerate(zip(cold_text, text)) if a != b),
                   None if len(cold_text) == len(text) else min(len(cold_text), len(text)))
    return GreedyCheck(session=session_id[:8], same=differs is None, cold_text=cold_text, text=text,
                       first_difference=differs)


@dataclass
class TierRun:
    """Raw measurements of one tier (one entry per session)."""

    expected: Tier
    # the cold run whose greedy output a warm tier must repeat, session by session (None: the cold tier itself)
    reference: Optional["TierRun"] = None
    measured: list[Measured] = field(default_factory=list)
    labels: list[TierLabel] = field(default_factory=list)
    prompts: list[Prompt] = field(default_factory=list)

    def greedy(self) -> list[GreedyCheck]:
        """Each completed request's output against the reference's completed one for the same session."""
        if self.reference is None:
            return []
        cold = {p.session_id: m.result.text for p, m in zip(self.reference.prompts, self.reference.measured)
                if not m.result.aborted}
        return [compare_greedy(p.session_id, cold[p.session_id], m.result.text)
                for p, m in zip(self.prompts, self.measured) if not m.result.aborted and p.session_id in cold]

    def result(self) -> TierResult:
        greedy = self.greedy()
        return TierResult(
            expected=self.expected.value,
            labels=[lab.tier.value for lab in self.labels],
            passed=bool(self.labels) and all(lab.passed for lab in self.labels)
            and not any(m.result.aborted for m in self.measured) and all(check.same for check in greedy),
            ttft_s=StatModel.of([m.result.ttft_s for m in self.measured if not m.result.aborted]),
            server_ttft_s=StatModel.of([m.window.server_ttft_mean for m in self.measured if not m.result.aborted]),
            ttft_within_tolerance=[m.ttft_check.within for m in self.measured if m.ttft_check],
            ttft_pairs=[TTFTPair(client_s=m.ttft_check.client_s, server_s=m.ttft_check.server_s,
                                 within=m.ttft_check.within) for m in self.measured if m.ttft_check],
            greedy=greedy,
            prompt_tokens=[m.result.prompt_tokens or p.tokens for m, p in zip(self.measured, self.prompts)],
            aborted=[m.result.abort_phase or "?" for m in self.measured if m.result.aborted],
            proofs=[TierProof(label=lab.tier.value, gpu_hits=lab.gpu_hits, gpu_queries=lab.gpu_queries,
                              external_hits=lab.external_hits, external_queries=lab.external_queries,
                              external_kv_transfer_tokens=lab.external_kv_transfer_tokens,
                              counters_reset=m.window.reset, text=lab.proof, store_tier=lab.store_tier,
                              store_tier_source=lab.store_tier_source)
                    for m, lab in zip(self.measured, self.labels)])


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

    def tier(self, expected: Tier) -> Optional[TierRun]:
        return next((t for t in self.tiers if t.expected == expected), None)


def _measure_tier(client: ServingClient, run: TierRun, prompt: Prompt, settings: ValidationSettings, timeout_s: float,
                  connector_configured: bool, after_restart: bool = False) -> None:
    measured = measure(client, prompt.text, settings.output_tokens, timeout_s, seed=prompt.spec.seed)
    run.measured.append(measured)
    run.prompts.append(prompt)
    run.labels.append(label(measured.window, run.expected, connector_configured, after_restart))


def filler_plan(pool_tokens: int, max_model_len: int, prompt_tokens: int, output_tokens: int) -> tuple[int, int]:
    """(filler size in tokens, number of fillers) that push FILLER_OVERSHOOT × the pool through it."""
    size = max(CALIBRATION_MIN_TOKENS, min(prompt_tokens, max_model_len - output_tokens - CONTEXT_SLACK_TOKENS))
    return size, math.ceil(pool_tokens * FILLER_OVERSHOOT / size)


def evict_gpu_pool(client: ServingClient, pool: Snapshot, settings: ValidationSettings, timeout_s: float) -> int:
    """Send salted filler prompts sized from the pool; returns how many were sent."""
    max_len = client.max_model_len or settings.prompt_tokens + settings.output_tokens + CONTEXT_SLACK_TOKENS
    if pool.gpu_pool_tokens is None:
        raise ConfigError("vllm:cache_config_info", pool.cache_config, "num_gpu_blocks/block_size missing",
                          "serve with a vLLM that exports vllm:cache_config_info (v1 engine)")
    size, count = filler_plan(pool.gpu_pool_tokens, max_len, settings.prompt_tokens, settings.output_tokens)
    rng = random.Random()
    for _ in range(count):
        filler = client.build_prompt(PromptSpec("narrative", size, rng.randrange(2**31)))
        result = client.stream_completion(filler.text, max_tokens=1, timeout_s=timeout_s)
        if result.aborted:
            raise ConfigError("filler", size, f"a filler request was aborted ({result.error})",
                              "check the engine is alive; lower validate_prompt_tokens")
    return count


def check_prompt_fits(settings: ValidationSettings, max_model_len: Optional[int]) -> None:
    """ConfigError when a session prompt and its reply do not fit the server's max-model-len (None: unknown)."""
    if max_model_len and settings.prompt_tokens + settings.output_tokens + CONTEXT_SLACK_TOKENS > max_model_len:
        raise ConfigError("validate_prompt_tokens", settings.prompt_tokens,
                          f"does not fit max-model-len {max_model_len} with the reply",
                          f"set validate_prompt_tokens <= {max_model_len - settings.output_tokens - CONTEXT_SLACK_TOKENS}")


def validate_tiers(client: ServingClient, restart: Optional[Callable[[], None]], settings: ValidationSettings,
                   connector_configured: bool = True,
                   store_bytes: Optional[Callable[[], int]] = None,
                   capacity_tiers: Optional[Mapping[str, int]] = None,
                   session_sizes: Sequence[int] = (50_000, 262_144)) -> TierValidation:
    """Run the tier procedure against a ready server. `restart` does a full down/up (None: skip tier 4)."""
    client.wait_ready()
    pool = require_prefix_counters(client.metrics())
    max_len = client.max_model_len
    check_prompt_fits(settings, max_len)
    seed = settings.seed if settings.seed is not None else random.randrange(2**31)
    failures: list[str] = []

    calibration_tokens = max(CALIBRATION_MIN_TOKENS, int(settings.prompt_tokens * CALIBRATION_FRACTION))
    calibration = client.build_prompt(PromptSpec(settings.prompt_kind, calibration_tokens, seed - 1))
    calibrated = client.stream_completion(calibration.text, max_tokens=1)
    rate = None
    if calibrated.ttft_s and calibrated.prompt_tokens:
        rate = calibrated.prompt_tokens / calibrated.ttft_s
    else:
        failures.append(f"prefill calibration failed ({calibrated.error or 'no first token'})")

    prompts = [client.build_prompt(PromptSpec(settings.prompt_kind, settings.prompt_tokens, seed + i))
               for i in range(settings.sessions)]
    timeout_s = prefill_timeout(max(p.tokens for p in prompts), rate)
    cold = TierRun(Tier.COLD)
    warm_gpu = TierRun(Tier.WARM_GPU, reference=cold)
    runs = [cold, warm_gpu]
    store_before = store_bytes() if store_bytes else None
    for prompt in prompts:
        _measure_tier(client, cold, prompt, settings, timeout_s, connector_configured)
        if cold.measured[-1].result.aborted:
            r = cold.measured[-1].result
            failures.append(f"cold prefill of session {prompt.session_id[:8]} aborted in {r.abort_phase} after "
                            f"{r.total_s:.0f} s (timeout {timeout_s:.0f} s): only the completed prefix is cached")
            continue
        _measure_tier(client, warm_gpu, prompt, settings, timeout_s, connector_configured)
    stored = [p for p, m in zip(cold.prompts, cold.measured) if not m.result.aborted]

    capacity = None
    if store_bytes is not None and store_before is not None:
        grown = store_bytes() - store_before
        tokens = sum(m.result.prompt_tokens or 0 for m in cold.measured if not m.result.aborted)
        capacity = capacity_from(grown, tokens, "connector store growth over the cold sessions",
                                 capacity_tiers or {}, [settings.prompt_tokens, *session_sizes])

    validation = TierValidation(runs, prompts, rate, pool, max_len, failures, capacity,
                                ttft_transport=client.ttft_transport)
    if not connector_configured or not stored:
        return validation

    validation.fillers_sent = evict_gpu_pool(client, pool, settings, timeout_s)
    connector = TierRun(Tier.WARM_CONNECTOR, reference=cold)
    runs.append(connector)
    for prompt in stored:
        _measure_tier(client, connector, prompt, settings, timeout_s, connector_configured)

    if restart is not None and settings.restart:
        restart()
        client.wait_ready()
        persistent = TierRun(Tier.WARM_PERSISTENT, reference=cold)
        runs.append(persistent)
        for prompt in stored:
            _measure_tier(client, persistent, prompt, settings, timeout_s, connector_configured, after_restart=True)
    return validation


def replay_data(run_dir: Path) -> dict:
    """Host-data values that repeat a recorded run's prompts (sizes, kind, seeds, sessions) on another rig."""
    card = load_cards(run_dir)[0]
    prompts = card.repro.prompts
    if not prompts:
        raise ConfigError("replay", str(run_dir), "the recorded card lists no prompts", "replay a full validation run")
    data = {"validate_prompt_tokens": prompts[0].target_tokens, "validate_prompt_kind": prompts[0].kind,
            "validate_seed": prompts[0].seed, "validate_sessions": len(prompts)}
    if card.repro.output_tokens:
        data["validate_output_tokens"] = card.repro.output_tokens
    return data


def capacity_from(bytes_grown: int, tokens_stored: int, source: str, tier_sizes: Mapping[str, int],
                  session_sizes: Sequence[int]) -> Capacity:
    """KB/token from measured growth, and how many sessions of each size every tier holds."""
    if bytes_grown <= 0 or tokens_stored <= 0:
        return Capacity(bytes_grown=bytes_grown, tokens_stored=tokens_stored, source=source + " (no growth seen)")
    per_token = bytes_grown / tokens_stored
    tiers = [CapacityTier(name=name, size_bytes=size,
                          sessions={str(s): size / (per_token * s) for s in session_sizes})
             for name, size in tier_sizes.items()]
    return Capacity(kb_per_token=per_token / KB, bytes_grown=bytes_grown, tokens_stored=tokens_stored,
                    source=source, tiers=tiers)


@dataclass
class L2Probe:
    """What the rig says about its L2 tier (l2_probe_command's output, parsed); None: not readable."""

    mount: Optional[str] = None
    fs_size_bytes: Optional[int] = None
    fs_free_bytes: Optional[int] = None
    store_bytes: Optional[int] = None
    janitor: Optional[str] = None
    now: Optional[float] = None
    janitor_status: Optional[dict] = None


def l2_probe_command(path: str, janitor_unit: str, janitor_status_file: str) -> str:
    """One shell command, run on the rig, printing key=value lines that parse_l2_probe reads."""
    quoted = shlex.quote(path)
    df = f"df -B1 --output={{}} -- {quoted} 2>/dev/null | tail -n 1"
    return "; ".join([
        f"echo \"mount=$({df.format('target')})\"",
        f"echo \"fs_size=$({df.format('size')} | tr -d ' ')\"",
        f"echo \"fs_free=$({df.format('avail')} | tr -d ' ')\"",
        f"echo \"store_bytes=$(du -sb -- {quoted} 2>/dev/null | cut -f1)\"",
        f"echo \"janitor=$(systemctl is-active {shlex.quote(janitor_unit)} 2>/dev/null)\"",
        "echo \"now=$(date +%s)\"",
        f"echo \"janitor_status=$(cat {shlex.quote(janitor_status_file)} 2>/dev/null)\"",
    ])


def parse_l2_probe(text: str) -> L2Probe:
    values = dict(line.split("=", 1) for line in text.split("\n") if "=" in line)  # as the shell wrote them

    def number(key: str) -> Optional[int]:
        value = values.get(key, "").strip()
        return int(value) if value.isdigit() else None

    try:
        status = json.loads(values.get("janitor_status", "")) or None
    except ValueError:
        status = None
    return L2Probe(mount=values.get("mount", "").strip() or None, fs_size_bytes=number("fs_size"),
                   fs_free_bytes=number("fs_free"), store_bytes=number("store_bytes"),
                   janitor=values.get("janitor", "").strip() or None,
                   now=float(number("now")) if number("now") is not None else None,
                   janitor_status=status if isinstance(status, dict) else None)


def classify_l2(probe: L2Probe, path: str, budget_bytes: int, min_free_bytes: int, janitor_unit: Optional[str],
                now: Optional[float] = None) -> L2Report:
    """The L2 tier's state from the rig's numbers. janitor_unit: the unit that must keep the store under its
    budget (None when the connector evicts by itself). Worst first: full, janitor-down, unknown, low, over-budget."""
    status = probe.janitor_status or {}
    mount = probe.mount or path
    found: list[tuple[str, str, str]] = []  # (state, level, problem with its fix)
    free, store = probe.fs_free_bytes, probe.store_bytes
    if free is not None and free < min_free_bytes:
        why = ("the store is empty: something else fills the disk"
               if status.get("state") == STATE_BELOW_FLOOR or not store else
               f"the store holds {fmt_bytes(store)}")
        found.append(("full", "fail", f"L2 full: {mount} has {fmt_bytes(free)} free, below the floor "
                      f"{fmt_bytes(min_free_bytes)} ({why}): free space on {mount} or lower l2_budget_gb"))
    if janitor_unit:
        if probe.janitor != "active":
            found.append(("janitor-down", "fail", f"L2 janitor {janitor_unit} is {probe.janitor or 'unknown'}: nothing "
                          f"keeps the store under l2_budget_gb nor {mount} above its floor: run deploy.py "
                          f"(journalctl -u {janitor_unit} says why it stopped)"))
        elif status.get("state") == STATE_REFUSED:
            found.append(("janitor-down", "fail", f"L2 janitor refuses to work: {status.get('message')}"))
        elif not status:
            found.append(("unknown", "warn", f"L2 janitor {janitor_unit} is active but wrote no status: "
                          f"run deploy.py (an older janitor writes none)"))
        else:
            now = probe.now if now is None else now
            age = (now - status.get("updated_at", 0)) if now is not None else 0
            if age > L2_JANITOR_STALE_S:
                found.append(("janitor-down", "warn", f"L2 janitor {janitor_unit} last reported {age:.0f} s ago: "
                              f"it is stuck; journalctl -u {janitor_unit}, then systemctl restart {janitor_unit}"))
    if free is None or store is None:
        found.append(("unknown", "warn", f"L2 state of {path} unknown (df/du read nothing on the rig): "
                      "check that the path exists there (run deploy.py)"))
    else:
        headroom, room_to_budget = free - min_free_bytes, budget_bytes - store
        if 0 <= headroom < room_to_budget:
            most = (store + headroom) / GB
            found.append(("low", "warn", f"L2 low: {mount} has {fmt_bytes(free)} free: the store ({fmt_bytes(store)}) "
                          f"can grow only {fmt_bytes(headroom)} more before the floor {fmt_bytes(min_free_bytes)}, not "
                          f"the {fmt_bytes(room_to_budget)} its budget allows: free space on {mount} or lower "
                          f"l2_budget_gb to at most {most:.3g}"))
        if store > budget_bytes * (1 + L2_OVER_BUDGET_TOLERANCE):
            found.append(("over-budget", "warn", f"L2 store {fmt_bytes(store)} over its budget {fmt_bytes(budget_bytes)}"
                          + (": the janitor is not keeping up" if janitor_unit else
                             ": the connector does not evict to l2_budget_gb; lower its own disk limit")))
    level = "fail" if any(f[1] == "fail" for f in found) else "warn" if found else "ok"
    last = status.get("last_eviction") or {}
    return L2Report(path=path, mount=probe.mount, fs_size_bytes=probe.fs_size_bytes, fs_free_bytes=free,
                    min_free_bytes=min_free_bytes, store_bytes=store, budget_bytes=budget_bytes,
                    janitor=probe.janitor if janitor_unit else None, janitor_state=status.get("state"),
                    evicted_entries=status.get("evicted_entries", 0), evicted_bytes=status.get("evicted_bytes", 0),
                    last_eviction_reason=last.get("reason"),
                    state=next((f[0] for f in found if f[1] == level), "ok"), level=level,
                    problems=[f[2] for f in found])


def l2_probe_for(stack) -> str:
    """The L2 probe of a stack (hostdata.Settings) with an L2 tier: its path, the janitor's unit and status file."""
    return l2_probe_command(stack.knobs["l2_path"], L2_JANITOR_UNIT, STATUS_FILE)


def read_l2(shell: Callable[[str], Optional[str]], stack) -> Optional[L2Report]:
    """The L2 tier of a rig now, read through `shell` (runs a command on the rig, returns its stdout or
    None); None when the stack (hostdata.Settings) has no L2 tier."""
    if not stack.l2_active:
        return None
    path = stack.knobs["l2_path"]
    janitor_unit = L2_JANITOR_UNIT if stack.runs_l2_janitor else None
    probe = parse_l2_probe(shell(l2_probe_for(stack)) or "")
    return classify_l2(probe, path, int(stack.knobs["l2_budget_gb"] * GB), L2_JANITOR_MIN_FREE_BYTES, janitor_unit)


def spec_decode_over(windows: Sequence[Delta], what: str) -> Optional[SpecDecode]:
    """Speculative decoding summed over request windows (each a /metrics delta around one request), or None
    when they drafted no token (speculative decoding off, or its config never reached the engine)."""
    spec = SpecDecode(drafts=sum(w.spec_decode_drafts for w in windows),
                      draft_tokens=sum(w.spec_decode_draft_tokens for w in windows),
                      accepted_tokens=sum(w.spec_decode_accepted_tokens for w in windows), window=what)
    return spec if spec.draft_tokens else None


def run_decode_ab(activate: Callable[[str], ServingClient], arms: Mapping[str, str], settings: ValidationSettings,
                  warmup: int = abstats.WARMUP_RUNS, measured: int = abstats.MEASURED_RUNS,
                  kinds: Sequence[str] = abstats.PROMPT_KINDS) -> DecodeAB:
    """Decode tok/s with the connector on and off, interleaved A/B/A/B.

    activate(arm) switches the rig to arms[arm] (a profile name) and returns a ready client;
    it is called once per visit, so a rig that serves both arms at once can return at no cost.
    """
    samples: dict[str, dict[str, list[float]]] = {arm: {k: [] for k in kinds} for arm in (abstats.ARM_ON,
                                                                                         abstats.ARM_OFF)}
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
        tps = (run.window.server_decode_tps(run.result.completion_tokens or 0)
               if run.result.completion_tokens else None) or run.result.decode_tps
        if run.result.aborted or tps is None:
            raise ConfigError("decode A/B", step.arm, f"a measured {step.kind} run failed ({run.result.error})",
                              "check the engine is alive after the profile switch")
        samples[step.arm][step.kind].append(tps)
        windows[step.arm].append(run.window)
    verdict = abstats.compare(samples)
    spec = {arm: spec_decode_over(arm_windows, f"the {len(arm_windows)} measured decode runs")
            for arm, arm_windows in windows.items()}
    return DecodeAB(arms=dict(arms), warmup=warmup, measured=measured, output_tokens=settings.decode_tokens,
                    kinds=[DecodeKind(kind=c.kind, on=StatModel.of(c.on.samples), off=StatModel.of(c.off.samples),
                                      delta_pct=c.delta_pct, within_bands=c.within_bands) for c in verdict.kinds],
                    verdict=verdict.verdict, reason=verdict.reason,
                    spec_decode={arm: value for arm, value in spec.items() if value is not None})


def to_card(rig: str, run_id: str, validation: TierValidation, settings: ValidationSettings,
            connector_configured: bool = True, decode_ab: Optional[DecodeAB] = None,
            repro: Optional[Mapping] = None, l2: Optional[L2Report] = None,
            soak: Optional[SoakReport] = None, speculative: bool = False) -> RigCard:
    """The rig's results card (rigkit.card renders it). ``speculative``: the stack serves with a speculative
    config, so its tier requests must have drafted tokens."""
    windows = [m.window for tier in validation.tiers for m in tier.measured]
    spec = spec_decode_over(windows, f"the {len(windows)} measured tier requests")
    failures = list(validation.failures)
    if speculative and spec is None:
        failures.append("speculative decoding is configured but vLLM counted no draft token over the measured "
                        "requests (vllm:spec_decode_num_draft_tokens_total): check the speculative_config "
                        "reached the engine (its log, the container's command line)")
    card = RigCard(rig=rig, run_id=run_id, connector_configured=connector_configured,
                   prefill_tokens_per_s=validation.prefill_tokens_per_s,
                   ttft_client=TTFTClient(transport=validation.ttft_transport, tolerance_rel=TTFT_TOLERANCE_REL,
                                          tolerance_abs_s=TTFT_TOLERANCE_ABS_S) if validation.ttft_transport else None,
                   tiers=[t.result() for t in validation.tiers], decode_ab=decode_ab, spec_decode=spec,
                   capacity=validation.capacity, l2=l2, soak=soak, failures=failures)
    card.repro = card.repro.model_copy(update=dict(repro or {}))
    card.repro.prompts = [PromptRecord(kind=p.spec.kind, target_tokens=p.spec.target_tokens, seed=p.spec.seed,
                                       tokens=p.tokens) for p in validation.prompts]
    card.repro.output_tokens = settings.output_tokens
    card.repro.max_model_len = validation.max_model_len
    card.repro.num_gpu_blocks = validation.pool.num_gpu_blocks
    card.repro.block_size = validation.pool.block_size
    return card
