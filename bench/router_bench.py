"""The router benchmark: N sessions × M turns through vllm-router, cache_aware beside round_robin, direct beside them.

    .venv/bin/python bench/router_bench.py [--inventory inventory/lab.py] [--rigs rig1,rig2,rig3]
        [--sessions 4] [--turns 3] [--message-tokens 128] [--reply-tokens 32] [--pairs 20]

Printed, never asserted (tests/lab/test_router_bench_lab.py asserts behaviour on the lab). One run:
- reaches every rig of the inventory (hosts of the `routers` group are gateways, not rigs) as validate.py does:
  rigkit.remote.tunnel's SSH tunnel to an API bound to the rig's loopback (the lab's rig3 in its own network namespace
  included), direct on a LAN bind;
- starts two real vllm-routers on this machine's loopback (bench/router_launcher.py), --policy cache_aware and
  --policy round_robin, both over the same rig URLs: the tunnels, so "direct" below goes through the same tunnel
  and the router's column differs from it by the router alone;
- runs N sessions × M turns through each router, then the same kind of sessions direct (session s on rig
  s mod R: a client that picks a rig and keeps it). The conversations are the soak's (rigkit/validation/soak.py): each turn
  resends the conversation so far plus a new salted user message, two sessions open at a time taking turns.
  Every message is salted with its target's name and a fresh id, so no target's prefixes can warm another's
  (nothing is restarted or evicted between them);
- per turn: the hit rate, read from the rigs' own /metrics around each request (rigkit/metrics.py: every rig
  scraped before and after, deltas summed over rigs) rather than from usage.prompt_tokens_details: the window
  also names the rig that served the request (the router does not say), and it needs no
  --enable-prompt-tokens-details on the rigs. Tokens from a cache are vllm:prompt_tokens_by_source's
  local_cache_hit + external_kv_transfer over all its prompt tokens where vLLM exports it (each token counted
  once), else the prefix-cache counters (GPU + external hits over queries). The TTFT is the client's
  (rigkit/remote/client.py's stream, timed here), median over the sessions;
- the router's own added latency: one salted prompt warmed on every rig, then --pairs times the same request
  through the router, then straight after direct to the rig the router chose (named by the /metrics window):
  the paired TTFT difference, median and 90th percentile.
Requests run one at a time, so the per-request /metrics windows are exact; the router then sees no load, which
matters: vllm-router's cache_aware sends a prompt it matches below --cache-threshold (a new session) to the
least-loaded worker, and with every load at zero that is the first one, so every session lands on one rig (the
"requests on" rows show it). Load spreading starts only under concurrent load.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, Sequence

import requests

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(BENCH_DIR))

from router_launcher import started_router  # noqa: E402

from rigkit import metrics  # noqa: E402
from rigkit.errors import ConfigError, RigkitError  # noqa: E402
from rigkit.fleet.inventory import load_inventory  # noqa: E402
from rigkit.prompts import new_session_id  # noqa: E402
from rigkit.remote.client import ServingClient, StreamResult, prefill_timeout  # noqa: E402
from rigkit.remote.tunnel import serving_url  # noqa: E402
from rigkit.settings.defaults import ROUTER_GROUP  # noqa: E402
from rigkit.settings.hostdata import rig_settings  # noqa: E402
from rigkit.validation.soak import (
    Plan,
    check_fits,
    conversation_tokens,
    next_message,
    transcript_entry,
    turn_order,
    turn_prompt,
)  # noqa: E402

CACHE_AWARE, ROUND_ROBIN, DIRECT = "cache_aware", "round_robin", "direct"
POLICIES = (CACHE_AWARE, ROUND_ROBIN)
TARGETS = (*POLICIES, DIRECT)
INVENTORY = REPO_ROOT / "inventory" / "lab.py"
PROMPT_KIND = "narrative"
# A message fills at least one KV block of the lab's CPU build (block_size 128): a later turn can only hit
# whole blocks of the conversation before it. Replies shorter than messages keep a later turn's prompt
# matching the earlier one above the router's --cache-threshold (0.3 of its characters by default).
DEFAULT_SESSIONS, DEFAULT_TURNS, DEFAULT_MESSAGE_TOKENS, DEFAULT_REPLY_TOKENS = 4, 3, 128, 32
DEFAULT_PAIRS = 20
# The latency probe's request: short, so its TTFT is the request's whole cost on the way in.
LATENCY_PROMPT_TOKENS = 128
LATENCY_MAX_TOKENS = 2


@dataclass(frozen=True)
class TurnRecord:
    """One turn of one session through one target, as the rigs' /metrics and the client saw it."""

    target: str
    session: int
    turn: int
    rig: Optional[str]  # the one rig whose prompt tokens grew over the request; None: none, or several
    cached_tokens: float
    prompt_tokens: float
    ttft_s: Optional[float]
    error: Optional[str] = None


@dataclass(frozen=True)
class TurnFigures:
    turn: int
    hit_rate: Optional[float]  # tokens from a cache / prompt tokens, summed over the turn's sessions
    ttft_median_s: Optional[float]
    answered: int


@dataclass(frozen=True)
class LatencyPair:
    """The same warm request through the router, then direct to the rig the router chose."""

    rig: str
    routed_ttft_s: float
    direct_ttft_s: float


@dataclass(frozen=True)
class AddedLatency:
    pairs: int
    median_s: float
    p90_s: float


@dataclass
class Results:
    plan: Plan
    rigs: list[str]
    records: list[TurnRecord] = field(default_factory=list)
    latency: dict[str, list[LatencyPair]] = field(default_factory=dict)  # policy -> pairs
    router_version: str = ""


# --- pure: what the windows and the records say ---------------------------------------------------------------


def cache_tokens(window: metrics.Delta) -> tuple[float, float]:
    """(prompt tokens served from a cache, prompt tokens) of one rig's /metrics window."""
    if window.prompt_tokens_by_source:  # each prompt token once (the prefix counters can count twice, vllm#43736)
        served = window.tokens_from("local_cache_hit") + window.tokens_from("external_kv_transfer")
        return served, window.window_prompt_tokens
    return window.prefix_cache_hits + window.external_prefix_cache_hits, window.prefix_cache_queries


def served_by(windows: Mapping[str, metrics.Delta]) -> tuple[Optional[str], float, float]:
    """(the rig that served the window's one request, cached tokens, prompt tokens), summed over rigs; the rig
    is None when no rig or more than one saw prompt tokens (then the window does not name one)."""
    per_rig = {name: cache_tokens(window) for name, window in windows.items()}
    moved = [name for name, (_, prompt) in per_rig.items() if prompt > 0]
    return (
        moved[0] if len(moved) == 1 else None,
        sum(cached for cached, _ in per_rig.values()),
        sum(prompt for _, prompt in per_rig.values()),
    )


def per_turn(records: Sequence[TurnRecord], target: str) -> list[TurnFigures]:
    """Each turn's hit rate (token-weighted over its sessions) and median TTFT, for one target."""
    mine = [r for r in records if r.target == target]
    figures = []
    for turn in sorted({r.turn for r in mine}):
        answered = [r for r in mine if r.turn == turn and not r.error]
        prompt = sum(r.prompt_tokens for r in answered)
        ttfts = [r.ttft_s for r in answered if r.ttft_s is not None]
        figures.append(
            TurnFigures(
                turn,
                sum(r.cached_tokens for r in answered) / prompt if prompt else None,
                statistics.median(ttfts) if ttfts else None,
                len(answered),
            )
        )
    return figures


def later_turns_hit_rate(records: Sequence[TurnRecord], target: str) -> Optional[float]:
    """The hit rate over every turn after a session's first (a first turn is salted: it cannot hit)."""
    later = [r for r in records if r.target == target and r.turn > 0 and not r.error]
    prompt = sum(r.prompt_tokens for r in later)
    return sum(r.cached_tokens for r in later) / prompt if prompt else None


def sessions_on_one_rig(records: Sequence[TurnRecord], target: str) -> tuple[int, int]:
    """(sessions whose every turn the same rig served, sessions)."""
    rigs: dict[int, set] = {}
    for r in records:
        if r.target == target:
            rigs.setdefault(r.session, set()).add(r.rig if not r.error else None)
    return sum(1 for served in rigs.values() if len(served) == 1 and None not in served), len(rigs)


def requests_per_rig(records: Sequence[TurnRecord], target: str) -> Counter:
    return Counter(r.rig for r in records if r.target == target and not r.error and r.rig is not None)


def added_latency(pairs: Sequence[LatencyPair]) -> Optional[AddedLatency]:
    """The router's added TTFT: median and 90th percentile of routed - direct over the pairs."""
    differences = sorted(p.routed_ttft_s - p.direct_ttft_s for p in pairs)
    if not differences:
        return None
    p90 = statistics.quantiles(differences, n=10, method="inclusive")[-1] if len(differences) > 1 else differences[0]
    return AddedLatency(len(differences), statistics.median(differences), p90)


def _percent(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ms(value: Optional[float], signed: bool = False) -> str:
    return "-" if value is None else f"{1000 * value:+.1f} ms" if signed else f"{1000 * value:.1f} ms"


def format_table(results: Results) -> str:
    """One table: a row per figure, cache_aware and round_robin side by side, direct beside them."""
    width, label_width = 14, 40
    records = results.records

    def row(label: str, cells: Sequence[str]) -> str:
        return f"{label:<{label_width}}" + "".join(f"{cell:>{width}}" for cell in cells)

    lines = [row("", TARGETS)]
    figures = {target: {f.turn: f for f in per_turn(records, target)} for target in TARGETS}
    for turn in range(results.plan.turns):
        cells = [figures[t].get(turn) for t in TARGETS]
        lines.append(row(f"turn {turn + 1} hit rate", [_percent(f.hit_rate if f else None) for f in cells]))
        lines.append(row(f"turn {turn + 1} TTFT median", [_ms(f.ttft_median_s if f else None) for f in cells]))
    lines.append(row("later turns hit rate", [_percent(later_turns_hit_rate(records, t)) for t in TARGETS]))
    lines.append(row("sessions kept on one rig", ["{}/{}".format(*sessions_on_one_rig(records, t)) for t in TARGETS]))
    counts = {t: requests_per_rig(records, t) for t in TARGETS}
    for rig in results.rigs:
        lines.append(row(f"requests on {rig}", [str(counts[t][rig]) for t in TARGETS]))
    lines.append(row("failed requests", [str(sum(1 for r in records if r.target == t and r.error)) for t in TARGETS]))
    latency = {policy: added_latency(results.latency.get(policy, ())) for policy in POLICIES}
    pairs = max((figure.pairs for figure in latency.values() if figure), default=0)
    lines.append(
        row(
            f"router's added TTFT, median ({pairs} pairs)",
            [_ms(latency[p].median_s if latency[p] else None, signed=True) for p in POLICIES] + ["-"],
        )
    )
    lines.append(
        row(
            "router's added TTFT, 90th percentile",
            [_ms(latency[p].p90_s if latency[p] else None, signed=True) for p in POLICIES] + ["-"],
        )
    )
    return "\n".join(lines)


# --- the rigs ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchRig:
    name: str
    data: Mapping
    bind_address: str
    serving_port: int
    model: str


def bench_rigs(hosts: Mapping[str, dict], names: Optional[Sequence[str]] = None) -> list[BenchRig]:
    """The rigs of an inventory (load_inventory's hosts; hosts of the routers group are gateways), or `names`."""
    rigs = {name: host for name, host in hosts.items() if ROUTER_GROUP not in host.get("groups", ())}
    unknown = [name for name in names or () if name not in rigs]
    if unknown:
        raise ConfigError(
            "--rigs", ",".join(unknown), "names no rig of the inventory", f"name rigs of {', '.join(rigs)}"
        )
    chosen = list(names) if names else list(rigs)
    if not chosen:
        raise ConfigError("inventory", None, "lists no rig", "pass an inventory with serving rigs")
    out = []
    for name in chosen:
        knobs = rig_settings(rigs[name]["data"]).stack.knobs
        out.append(
            BenchRig(
                name, rigs[name]["data"], knobs["bind_address"], int(knobs["serving_port"]), knobs["served_model_name"]
            )
        )
    return out


@contextmanager
def rig_urls(rigs: Sequence[BenchRig]) -> Iterator[dict[str, str]]:
    """Every rig's API URL as the controller reaches it (a tunnel to a loopback bind), open for the block."""
    with ExitStack() as stack:
        yield {
            rig.name: stack.enter_context(serving_url(rig.data, rig.bind_address, rig.serving_port, rig.name))
            for rig in rigs
        }


# --- the run ----------------------------------------------------------------------------------------------------


def scrape(rig_clients: Mapping[str, ServingClient]) -> dict[str, metrics.Snapshot]:
    return {name: client.metrics() for name, client in rig_clients.items()}


def served_request(
    client: ServingClient, rig_clients: Mapping[str, ServingClient], prompt: str, max_tokens: int, timeout_s: float
) -> tuple[Optional[str], float, float, StreamResult]:
    """One streamed request through `client` with every rig's /metrics scraped around it. A connection closed
    before any response is asked again once, saying so: seen once in the lab through vllm-router 0.1.17
    (RemoteDisconnected between turns: a pooled connection closed while idle), no policy's doing."""
    for attempt in (1, 2):
        before = scrape(rig_clients)
        try:
            result = client.stream_completion(prompt, max_tokens=max_tokens, timeout_s=timeout_s)
            break
        except requests.ConnectionError as exc:
            if attempt == 2:
                raise
            print(f"{client.base_url}: connection closed before a response ({exc}); asked again once")
    after = scrape(rig_clients)
    rig, cached, prompt_tokens = served_by({name: metrics.delta(before[name], after[name]) for name in rig_clients})
    return rig, cached, prompt_tokens, result


def run_sessions(
    target: str,
    session_client: Callable[[int], ServingClient],
    rig_clients: Mapping[str, ServingClient],
    writer: ServingClient,
    plan: Plan,
    rng: random.Random,
) -> list[TurnRecord]:
    """The soak's conversations (turn_order), each turn through session_client(session), every message salted
    with the target's name; `writer` sizes the messages (its /tokenize)."""
    timeout_s = prefill_timeout(conversation_tokens(plan), None)
    transcripts: dict[int, list[str]] = {s: [] for s in range(plan.sessions)}
    records = []
    for session, turn in turn_order(plan.sessions, plan.turns, plan.open_sessions):
        try:
            message = next_message(writer, PROMPT_KIND, plan.message_tokens, rng, f"{target}-{new_session_id()}")
            rig, cached, prompt_tokens, result = served_request(
                session_client(session),
                rig_clients,
                turn_prompt(transcripts[session], message),
                plan.reply_tokens,
                timeout_s,
            )
            transcripts[session].append(transcript_entry(message, result.text))
            records.append(TurnRecord(target, session, turn, rig, cached, prompt_tokens, result.ttft_s, result.error))
        except (RigkitError, requests.RequestException, ValueError) as exc:
            records.append(TurnRecord(target, session, turn, None, 0.0, 0.0, None, f"{type(exc).__name__}: {exc}"))
    return records


def measure_added_latency(
    policy: str,
    router_client: ServingClient,
    rig_clients: Mapping[str, ServingClient],
    writer: ServingClient,
    pairs: int,
    rng: random.Random,
) -> list[LatencyPair]:
    """`pairs` times: the warm request through the router, then direct to the rig that served it."""
    prompt = next_message(writer, PROMPT_KIND, LATENCY_PROMPT_TOKENS, rng, f"latency-{policy}-{new_session_id()}")
    timeout_s = prefill_timeout(LATENCY_PROMPT_TOKENS, None)
    for client in rig_clients.values():  # warm on every rig: wherever the router sends it, it is a hit
        client.stream_completion(prompt, max_tokens=LATENCY_MAX_TOKENS, timeout_s=timeout_s)
    out = []
    for _ in range(pairs):
        rig, _, _, routed = served_request(router_client, rig_clients, prompt, LATENCY_MAX_TOKENS, timeout_s)
        if rig is None or routed.ttft_s is None:
            continue  # no rig named (or the request broke): nothing to pair it with
        direct = rig_clients[rig].stream_completion(prompt, max_tokens=LATENCY_MAX_TOKENS, timeout_s=timeout_s)
        if direct.ttft_s is not None:
            out.append(LatencyPair(rig, routed.ttft_s, direct.ttft_s))
    return out


def router_version() -> str:
    try:
        return metadata.version("vllm-router")
    except metadata.PackageNotFoundError:
        return "not installed"


def run_bench(
    urls: Mapping[str, str],
    plan: Plan,
    pairs: int,
    model: Optional[str] = None,
    seed: Optional[int] = None,
    progress: Callable[[str], None] = print,
) -> Results:
    """Both routers over `urls` (rig name -> API URL), the sessions through each and direct, the latency pairs."""
    names = list(urls)
    rig_clients = {name: ServingClient(url, model=model) for name, url in urls.items()}
    writer = rig_clients[names[0]]
    check_fits(plan, writer.max_model_len)
    model = writer.model
    rng = random.Random(seed)
    results = Results(plan, names, router_version=router_version())
    with ExitStack() as stack:
        routers = {policy: stack.enter_context(started_router(policy, list(urls.values()))) for policy in POLICIES}
        for policy, router in routers.items():
            progress(f"{plan.sessions} sessions x {plan.turns} turns through vllm-router --policy {policy}")
            client = ServingClient(router.url, model=model)
            results.records += run_sessions(policy, lambda _session: client, rig_clients, writer, plan, rng)
        progress(f"{plan.sessions} sessions x {plan.turns} turns direct (session s on rig s mod {len(names)})")
        results.records += run_sessions(
            DIRECT, lambda session: rig_clients[names[session % len(names)]], rig_clients, writer, plan, rng
        )
        for policy, router in routers.items():
            progress(f"router's added latency, {policy}: {pairs} pairs")
            results.latency[policy] = measure_added_latency(
                policy, ServingClient(router.url, model=model), rig_clients, writer, pairs, rng
            )
    return results


def report(results: Results) -> str:
    plan = results.plan
    head = (
        f"router bench: {plan.sessions} sessions x {plan.turns} turns ({plan.open_sessions} open at a time), "
        f"messages ~{plan.message_tokens} tokens, replies {plan.reply_tokens} tokens; vllm-router "
        f"{results.router_version}; rigs {', '.join(results.rigs)}"
    )
    notes = (
        "hit rate: prompt tokens the serving rig took from a cache (GPU or connector) / prompt tokens, from the "
        "rigs' /metrics; TTFT: the client's, here; direct: session s on rig s mod "
        f"{len(results.rigs)}, through the same tunnels the routers use; added TTFT: routed - direct, the same "
        "warm request, paired"
    )
    return "\n".join([head, format_table(results), notes])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", default=str(INVENTORY), help="pyinfra inventory of the rigs (default: the lab)")
    parser.add_argument("--rigs", help="comma-separated rigs of the inventory (default: every rig)")
    parser.add_argument("--sessions", type=int, default=DEFAULT_SESSIONS)
    parser.add_argument("--turns", type=int, default=DEFAULT_TURNS)
    parser.add_argument("--message-tokens", type=int, default=DEFAULT_MESSAGE_TOKENS)
    parser.add_argument("--reply-tokens", type=int, default=DEFAULT_REPLY_TOKENS)
    parser.add_argument("--pairs", type=int, default=DEFAULT_PAIRS, help="routed/direct pairs per policy")
    parser.add_argument("--seed", type=int, help="seed of the messages' bodies (the salts are always fresh)")
    args = parser.parse_args()
    rigs = bench_rigs(load_inventory(args.inventory), args.rigs.split(",") if args.rigs else None)
    plan = Plan(args.sessions, args.turns, args.message_tokens, args.reply_tokens)
    with rig_urls(rigs) as urls:
        results = run_bench(urls, plan, args.pairs, model=rigs[0].model, seed=args.seed)
    print()
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
