"""Soak: N multi-turn conversations × M turns against the serving API, and the verdict on them.

Each turn sends the whole conversation so far (its earlier user messages and replies) plus a new salted
user message, so the prompt's prefix grows as in a real chat. OPEN_SESSIONS conversations are open at
once and take turns (turn_order), so a conversation's prefix has to outlive another one's requests, and a
new conversation opens when one ends, so the last conversation runs well after the first. After every
turn the rig's memory is sampled (memory_probe): GPU memory used from nvidia-smi where GPUs exist, else
the serving container's cgroup memory.

The verdict (judge) fails on any error; on memory growth above the limit from the end of the first clean
conversation (no error) to the last sample; on decode retention (mean decode tok/s of the last
conversation / of the first clean one: the same turn sizes, so the same context lengths) below its
minimum; on empty replies in at least the given fraction of the answered turns. A rule that could not be
checked (no memory reading, no decode speed) fails as well: the card never passes a rule it did not measure.
"""

from __future__ import annotations

import random
import statistics
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import requests

from rigkit import metrics
from rigkit.errors import ConfigError, RigkitError
from rigkit.nvidia_smi import GPU_MEMORY_QUERY, parse_gpu_memory
from rigkit.prompts import PromptSpec
from rigkit.remote.client import ServingClient, prefill_timeout
from rigkit.serving.render import CONTAINER_NAME
from rigkit.validation.card import SoakReport, SoakTurn

if TYPE_CHECKING:
    from rigkit.validation.procedure import ValidationSettings

# Conversations open at once: each turn of one is followed by a turn of another, as on a shared rig.
OPEN_SESSIONS = 2
# A run of this many failed turns in a row means the engine stopped answering: the soak stops there.
MAX_CONSECUTIVE_ERRORS = 3
# Tokens per turn for the "User: "/"Assistant:" labels and line breaks, when checking the context fits.
TRANSCRIPT_SLACK_TOKENS = 16
MIB = 1024**2

Shell = Callable[[str], Optional[str]]


@dataclass(frozen=True)
class Limits:
    memory_growth_mib: float
    decode_retention_min: float
    empty_reply_max_fraction: float


@dataclass(frozen=True)
class Plan:
    sessions: int
    turns: int
    message_tokens: int
    reply_tokens: int
    open_sessions: int = OPEN_SESSIONS


# --- schedule --------------------------------------------------------------------------------
def turn_order(sessions: int, turns: int, open_sessions: int = OPEN_SESSIONS) -> list[tuple[int, int]]:
    """(session, turn) in the order they run: the open conversations take turns round robin, and the next
    conversation opens as soon as one ends."""
    waiting = deque(range(sessions))
    open_now = deque(waiting.popleft() for _ in range(min(open_sessions, sessions)))
    next_turn = {session: 0 for session in range(sessions)}
    order = []
    while open_now:
        session = open_now.popleft()
        order.append((session, next_turn[session]))
        next_turn[session] += 1
        if next_turn[session] < turns:
            open_now.append(session)
        elif waiting:
            open_now.append(waiting.popleft())
    return order


# --- verdict ---------------------------------------------------------------------------------
def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def judge(records: Sequence[SoakTurn], plan: Plan, limits: Limits, memory_source: str) -> SoakReport:
    """The soak's verdict from its turns (in the order they ran), each failing rule named with its numbers."""
    failures: list[str] = []
    planned = plan.sessions * plan.turns
    errors = [r for r in records if r.error]
    answered = [r for r in records if not r.error]
    empty = [r for r in answered if r.empty_reply]
    if errors:
        first = errors[0]
        failures.append(
            f"{len(errors)} of {len(records)} turns failed (first: session {first.session} turn "
            f"{first.turn}: {first.error})"
        )
    if len(records) < planned:
        failures.append(
            f"only {len(records)} of {planned} turns ran: the soak stopped after "
            f"{MAX_CONSECUTIVE_ERRORS} failed turns in a row"
        )

    empty_fraction = len(empty) / len(answered) if answered else None
    if empty_fraction is None:
        failures.append("no turn was answered: empty replies not measured")
    elif empty_fraction >= limits.empty_reply_max_fraction:
        limit = 100 * limits.empty_reply_max_fraction
        failures.append(
            f"{len(empty)} of {len(answered)} answered turns got an empty reply "
            f"({100 * empty_fraction:.0f}%, the limit is below {limit:.0f}%)"
        )

    by_session: dict[int, list[SoakTurn]] = {}
    for record in records:
        by_session.setdefault(record.session, []).append(record)
    complete = [s for s, turns in by_session.items() if len(turns) == plan.turns]
    clean = [s for s in complete if not any(r.error for r in by_session[s])]
    # the first clean session is the one that ENDED first: its last turn is the memory baseline
    end_index = {s: max(i for i, r in enumerate(records) if r.session == s) for s in by_session}
    baseline = min(clean, key=end_index.__getitem__) if clean else None
    last = max(by_session, key=end_index.__getitem__) if by_session else None

    tps_baseline = tps_last = retention = None
    if baseline is None:
        failures.append(
            "no conversation ran all its turns without an error: no baseline for decode retention and memory growth"
        )
    else:
        tps_baseline = _mean([r.decode_tps for r in by_session[baseline]])
        tps_last = _mean([r.decode_tps for r in by_session[last] if not r.error])
        if baseline == last:
            failures.append(
                f"decode retention not measured: session {baseline} is both the first clean and "
                "the last conversation (run at least 2 sessions)"
            )
        elif not tps_baseline or tps_last is None:
            failures.append(
                f"decode retention not measured: no decode speed in session "
                f"{baseline if not tps_baseline else last} (replies of fewer than 2 tokens?)"
            )
        else:
            retention = tps_last / tps_baseline
            if retention < limits.decode_retention_min:
                failures.append(
                    f"decode retention {100 * retention:.1f}%: session {last} decoded {tps_last:.1f} "
                    f"tok/s vs {tps_baseline:.1f} tok/s in the first clean session {baseline} "
                    f"(at least {100 * limits.decode_retention_min:.0f}%)"
                )

    memory_baseline = records[end_index[baseline]].memory_mib if baseline is not None else None
    memory_last = records[-1].memory_mib if records else None
    growth = memory_last - memory_baseline if memory_baseline is not None and memory_last is not None else None
    if baseline is not None:
        if growth is None:
            failures.append(
                f"memory growth not measured: {memory_source} gave no reading "
                f"{'after session ' + str(baseline) if memory_baseline is None else 'after the last turn'}"
            )
        elif growth > limits.memory_growth_mib:
            failures.append(
                f"memory grew {growth:,.1f} MiB ({memory_baseline:,.0f} MiB after the first clean "
                f"session {baseline} -> {memory_last:,.0f} MiB after the last turn; {memory_source}), "
                f"more than {limits.memory_growth_mib:,.0f} MiB"
            )

    return SoakReport(
        sessions=plan.sessions,
        turns=plan.turns,
        open_sessions=plan.open_sessions,
        message_tokens=plan.message_tokens,
        reply_tokens=plan.reply_tokens,
        memory_source=memory_source,
        memory_growth_limit_mib=limits.memory_growth_mib,
        decode_retention_min=limits.decode_retention_min,
        empty_reply_max_fraction=limits.empty_reply_max_fraction,
        turns_run=len(records),
        errors=len(errors),
        answered=len(answered),
        empty_replies=len(empty),
        baseline_session=baseline,
        last_session=last,
        decode_tps_baseline=tps_baseline,
        decode_tps_last=tps_last,
        decode_retention=retention,
        memory_baseline_mib=memory_baseline,
        memory_last_mib=memory_last,
        memory_growth_mib=growth,
        failures=failures,
        records=list(records),
    )


# --- memory on the rig -----------------------------------------------------------------------
# Prints the serving container's cgroup memory in use and the memory.stat line it is read with:
# cgroup v2 (memory.current, inactive_file) or v1 (memory.usage_in_bytes, total_inactive_file; the lab's VM).
CGROUP_MEMORY_COMMAND = (
    f"pid=$(docker inspect -f '{{{{.State.Pid}}}}' {CONTAINER_NAME} 2>/dev/null) && [ \"${{pid:-0}}\" -gt 0 ] "
    "&& v2=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/$pid/cgroup) "
    "&& v1=/sys/fs/cgroup/memory$(sed -n 's/^[0-9]*:memory://p' /proc/$pid/cgroup) "
    '&& if [ -r $v2/memory.current ]; then echo "current $(cat $v2/memory.current)"; '
    "grep '^inactive_file ' $v2/memory.stat; "
    "else echo \"current $(cat $v1/memory.usage_in_bytes)\" && grep '^total_inactive_file ' $v1/memory.stat; fi"
)


def gpu_used_mib(text: str) -> Optional[float]:
    """GPU memory in use (MiB, every GPU summed) from GPU_MEMORY_QUERY output; None: no GPU listed."""
    gpus = parse_gpu_memory(text) if text.strip() else []
    return float(sum(g.total_mib - g.free_mib for g in gpus)) if gpus else None


def cgroup_used_mib(text: str) -> Optional[float]:
    """The container's memory in use (MiB) from CGROUP_MEMORY_COMMAND output, as `docker stats` counts it:
    the cgroup's usage less its inactive page cache (reclaimed first, e.g. the connector's disk writes)."""
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            values[name.removeprefix("total_")] = int(value)
    if "current" not in values:
        return None
    return (values["current"] - values.get("inactive_file", 0)) / MIB


@dataclass(frozen=True)
class MemoryProbe:
    source: str  # what is measured, for the card
    command: str
    parse: Callable[[str], Optional[float]]

    def read(self, shell: Shell) -> Optional[float]:
        output = shell(self.command)
        return self.parse(output) if output else None


GPU_PROBE = MemoryProbe("GPU memory used, nvidia-smi (all GPUs)", f"{GPU_MEMORY_QUERY} 2>/dev/null", gpu_used_mib)
CGROUP_PROBE = MemoryProbe(
    f"container {CONTAINER_NAME} cgroup memory less inactive page cache (no GPU)",
    CGROUP_MEMORY_COMMAND,
    cgroup_used_mib,
)


def memory_probe(shell: Shell) -> MemoryProbe:
    """GPU memory where nvidia-smi lists GPUs on the rig, else the serving container's cgroup memory."""
    return GPU_PROBE if GPU_PROBE.read(shell) is not None else CGROUP_PROBE


# --- the run ---------------------------------------------------------------------------------
def plan_from(settings: ValidationSettings) -> Plan:
    return Plan(settings.soak_sessions, settings.soak_turns, settings.soak_message_tokens, settings.soak_reply_tokens)


def limits_from(settings: ValidationSettings) -> Limits:
    return Limits(
        settings.soak_memory_growth_mib, settings.soak_decode_retention_min, settings.soak_empty_reply_max_fraction
    )


def conversation_tokens(plan: Plan) -> int:
    """The longest prompt of a conversation: every turn's message and reply, the last reply still to come."""
    return plan.turns * (plan.message_tokens + plan.reply_tokens + TRANSCRIPT_SLACK_TOKENS)


def check_fits(plan: Plan, max_model_len: Optional[int]) -> None:
    if max_model_len is None or conversation_tokens(plan) <= max_model_len:
        return
    per_turn = plan.message_tokens + plan.reply_tokens + TRANSCRIPT_SLACK_TOKENS
    raise ConfigError(
        "validate_soak_turns",
        plan.turns,
        f"a conversation of {plan.turns} turns of ~{per_turn} tokens reaches "
        f"~{conversation_tokens(plan)} tokens, over the served max-model-len {max_model_len}",
        f"validate_soak_turns <= {max_model_len // per_turn}, or lower validate_soak_message_tokens / "
        "validate_soak_reply_tokens",
    )


def next_message(
    client: ServingClient, prompt_kind: str, message_tokens: int, rng: random.Random, session_id: Optional[str] = None
) -> str:
    """A new user message of about `message_tokens`, salted (client.build_prompt): a new salt on every message,
    so no earlier run (nor another run's conversation) can have cached any of the conversation."""
    return client.build_prompt(PromptSpec(prompt_kind, message_tokens, rng.randrange(2**31)), session_id).text


def turn_prompt(transcript: Sequence[str], message: str) -> str:
    """A turn's prompt: the whole conversation so far plus the new user message."""
    return "".join(transcript) + f"User: {message}\nAssistant:"


def transcript_entry(message: str, reply: str) -> str:
    """What a turn adds to the conversation: its user message and the reply."""
    return f"User: {message}\nAssistant:{reply}\n"


def _turn(
    client: ServingClient, transcript: list[str], message: str, plan: Plan, timeout_s: float, session: int, turn: int
) -> SoakTurn:
    """One turn: the conversation so far plus `message`; the reply is appended to `transcript`."""
    prompt = turn_prompt(transcript, message)
    before = client.metrics()
    # ignore_eos off: a real reply ends when the model ends it, so an empty reply can happen and is counted
    result = client.stream_completion(prompt, max_tokens=plan.reply_tokens, timeout_s=timeout_s, ignore_eos=False)
    window = metrics.delta(before, client.metrics())
    transcript.append(transcript_entry(message, result.text))
    tokens = result.completion_tokens or 0
    # the server's own decode time first: a tunnel may deliver the stream in bursts
    tps = (window.server_decode_tps(tokens) if tokens else None) or result.decode_tps
    return SoakTurn(
        session=session,
        turn=turn,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        decode_tps=tps,
        empty_reply=not result.aborted and not result.text.strip(),
        error=result.error,
    )


def run_soak(
    client: ServingClient,
    plan: Plan,
    limits: Limits,
    read_memory: Callable[[], Optional[float]],
    memory_source: str,
    seed: Optional[int] = None,
    prompt_kind: str = "narrative",
    prefill_tokens_per_s: Optional[float] = None,
) -> SoakReport:
    """Run the conversations in turn_order, sample memory after every turn, and judge them.

    read_memory() reads the rig's memory in MiB (None: unreadable), e.g. lambda: memory_probe(shell).read(shell).
    """
    check_fits(plan, client.max_model_len)
    rng = random.Random(seed)
    timeout_s = prefill_timeout(conversation_tokens(plan), prefill_tokens_per_s)
    transcripts: dict[int, list[str]] = {s: [] for s in range(plan.sessions)}
    records: list[SoakTurn] = []
    failed_in_a_row = 0
    for session, turn in turn_order(plan.sessions, plan.turns, plan.open_sessions):
        try:
            message = next_message(client, prompt_kind, plan.message_tokens, rng)
            record = _turn(client, transcripts[session], message, plan, timeout_s, session, turn)
        except (RigkitError, requests.RequestException, ValueError) as exc:
            record = SoakTurn(session=session, turn=turn, error=f"{type(exc).__name__}: {exc}")
        records.append(record.model_copy(update={"memory_mib": read_memory()}))
        failed_in_a_row = failed_in_a_row + 1 if record.error else 0
        if failed_in_a_row >= MAX_CONSECUTIVE_ERRORS:
            break
    return judge(records, plan, limits, memory_source)
