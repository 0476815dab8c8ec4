"""The warm-shared tier: KV one rig prefilled, served to another from the store they share (the command is
rigkit.commands.validate_shared).

For each ordered pair (A, B) of rigs on one shared store: fresh salted prompts are prefilled on A (each must be cold
there), then asked of B and labelled by B's own /metrics window (rigkit.validation.tiers.label_shared); B's greedy
output must be A's. Completions stream from the rig itself (the TTFT probe over SSH); the pairs go into B's card and
the fleet card."""

from __future__ import annotations

import itertools
import random
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

from rigkit.errors import ConfigError
from rigkit.fleet.targets import Targets
from rigkit.metrics import require_prefix_counters
from rigkit.prompts import PromptSpec
from rigkit.remote.client import ServingClient, prefill_timeout
from rigkit.remote.probe import RigProbe
from rigkit.remote.tunnel import Tunnel, connect_ssh, serving_url
from rigkit.settings.hostdata import rig_settings
from rigkit.validation.card import PromptRecord, SharedPair, TTFTClient
from rigkit.validation.card.store import record_shared, render_run
from rigkit.validation.greedy import Tolerance, band, calibrated
from rigkit.validation.measure import measure, repeat_unmeasured
from rigkit.validation.procedure import ValidationSettings, check_prompt_fits, warm_up_logprobs
from rigkit.validation.tier_run import TierRun, completion_of
from rigkit.validation.tiers import Tier, label, label_shared
from rigkit.validation.ttft import TTFT_TOLERANCE_ABS_S, TTFT_TOLERANCE_REL

# How a rig declares the shared tier (issue 15's shared mount, rigkit.kv_share): its `kv_share` knob puts its
# connector store on the mount of its kv_share section's `kv_share_source`; rigs naming the same source share one
# store, so the pairs are those within one source.
KV_SHARE_KNOB = "kv_share"
KV_SHARE_SECTION, KV_SHARE_SOURCE = "kv_share", "kv_share_source"


@dataclass
class Prefilled:
    """Salted prompts prefilled on one rig: the source of a pair, and the reference of B's greedy outputs."""

    rig: str
    run: TierRun  # expected cold, on the source
    # session -> the same prompt again on the source, unmeasured (its GPU prefix cache: with the cold run, the
    # cached-vs-fresh band the target is judged by)
    again: dict = field(default_factory=dict)


def prefill(
    rig: str,
    client: ServingClient,
    specs: Sequence[PromptSpec],
    output_tokens: int,
    timeout_s: float,
    logprobs: int = 0,
) -> Prefilled:
    """Fresh salted prompts, each sent to `rig` and labelled by its counters (expected: cold), then again (its GPU
    prefix cache: with cold, the cached-vs-fresh band the target's outputs are judged by)."""
    run, again = TierRun(Tier.COLD), {}
    for spec in specs:
        prompt = client.build_prompt(spec)
        measured = measure(client, prompt.text, output_tokens, timeout_s, seed=spec.seed, logprobs=logprobs)
        run.measured.append(measured)
        run.prompts.append(prompt)
        run.labels.append(label(measured.window, Tier.COLD, connector_configured=True))
        if logprobs and not measured.result.aborted:
            repeated = repeat_unmeasured(
                client, prompt.text, output_tokens, timeout_s, seed=spec.seed, logprobs=logprobs
            )
            if repeated is not None:
                again[prompt.session_id] = repeated
    return Prefilled(rig, run, again)


def shared_tolerance(prefilled: Prefilled, ceiling: float) -> Tolerance:
    """The target's tolerance: BAND_FACTOR x the source's cached-vs-fresh band (another engine, perhaps another GPU:
    never held bit-exact)."""
    cold = {p.session_id: completion_of(m) for p, m in zip(prefilled.run.prompts, prefilled.run.measured)}
    fresh = band((cold[s], again) for s, again in prefilled.again.items() if s in cold)
    return calibrated(None, fresh, False, ceiling)


def ask(
    prefilled: Prefilled,
    rig: str,
    client: ServingClient,
    output_tokens: int,
    timeout_s: float,
    logprobs: int,
    ceiling_nats: float,
) -> SharedPair:
    """Each prompt `prefilled` completed, sent to `rig` and labelled by `rig`'s own window (expected: warm-shared)."""
    asked = TierRun(
        Tier.WARM_SHARED,
        reference=prefilled.run,
        tolerance=shared_tolerance(prefilled, ceiling_nats),
    )
    for prompt, before in zip(prefilled.run.prompts, prefilled.run.measured):
        if before.result.aborted:  # only a completed prefill is stored whole
            continue
        measured = measure(client, prompt.text, output_tokens, timeout_s, seed=prompt.spec.seed, logprobs=logprobs)
        asked.measured.append(measured)
        asked.prompts.append(prompt)
        asked.labels.append(label_shared(measured.window))
    return SharedPair(
        source=prefilled.rig,
        target=rig,
        prefill=prefilled.run.result(),
        asked=asked.result(),
        prompts=[
            PromptRecord(kind=p.spec.kind, target_tokens=p.spec.target_tokens, seed=p.spec.seed, tokens=p.tokens)
            for p in prefilled.run.prompts
        ],
    )


def ordered_pairs(groups: Sequence[Sequence[str]]) -> list[tuple[str, str]]:
    """Every (A, B) of distinct rigs of one group (one shared store), A first: each rig is asked what every other
    rig of its store prefilled."""
    return [pair for rigs in groups for pair in itertools.permutations(rigs, 2)]


def prompt_specs(settings: ValidationSettings, seed: int) -> list[PromptSpec]:
    return [PromptSpec(settings.prompt_kind, settings.prompt_tokens, seed + i) for i in range(settings.sessions)]


def run_pairs(
    clients: Mapping[str, ServingClient], settings: Mapping[str, ValidationSettings], groups: Sequence[Sequence[str]]
) -> list[SharedPair]:
    """The warm-shared tier over every ordered pair within each group of rigs sharing one store (`clients`: rig
    name -> client); each pair's prompts follow its source's settings and must fit both rigs."""
    for client in clients.values():
        client.wait_ready()
        require_prefix_counters(client.metrics())
    for source, target in ordered_pairs(groups):
        for rig in (source, target):
            check_prompt_fits(settings[source], clients[rig].max_model_len)
    for client in clients.values():
        # before any pair is timed: vLLM CPU compiles its logprobs path at the first such request (10.7 s in the lab)
        warm_up_logprobs(client, max(chosen.top_logprobs for chosen in settings.values()))
    pairs = []
    for source, target in ordered_pairs(groups):
        chosen = settings[source]
        seed = chosen.seed if chosen.seed is not None else random.randrange(2**31)
        timeout_s = prefill_timeout(chosen.prompt_tokens, None)
        prefilled = prefill(
            source, clients[source], prompt_specs(chosen, seed), chosen.output_tokens, timeout_s, chosen.top_logprobs
        )
        pairs.append(
            ask(
                prefilled,
                target,
                clients[target],
                chosen.output_tokens,
                timeout_s,
                chosen.top_logprobs,
                chosen.numerics_ceiling_nats,
            )
        )
    return pairs


# --- the command: the rigs of an inventory, reached as validate.py reaches them -------------------------------


def sharing_groups(sources: Mapping[str, Optional[str]]) -> list[list[str]]:
    """The targeted rigs (name -> the shared store's source, None: not sharing) grouped by store, in inventory
    order; ConfigError when no store is shared by two of them."""
    groups: dict[str, list[str]] = {}
    for name, source in sources.items():
        if source is not None:
            groups.setdefault(source, []).append(name)
    pairs = [rigs for rigs in groups.values() if len(rigs) > 1]
    if not pairs:
        shown = ", ".join(f"{name}: {source or 'not shared'}" for name, source in sources.items()) or "no rig"
        raise ConfigError(
            KV_SHARE_KNOB,
            shown,
            "no shared KV store is declared by two of the targeted rigs: a "
            "warm-shared pair needs a rig that prefills and another that reads the same store",
            f"deploy and validate with --data {KV_SHARE_KNOB}=true on at least two rigs naming the same "
            f"{KV_SHARE_SOURCE} (or --limit to such rigs)",
        )
    return pairs


def rig_client(stack: ExitStack, name: str, data: Mapping, knobs: Mapping) -> ServingClient:
    """A client of the rig's API (through a tunnel when it binds the rig's loopback) whose completions stream
    from the rig itself (rigkit's TTFT probe over an SSH connection of its own), as validate.py measures."""
    url = stack.enter_context(serving_url(data, knobs["bind_address"], knobs["serving_port"], inventory_name=name))
    ssh = Tunnel(lambda: connect_ssh(data, name), "127.0.0.1", knobs["serving_port"])
    stack.callback(ssh.close)
    probe = None
    if ssh.run("command -v python3", "") is not None:
        probe = RigProbe.on(name, ssh.run, knobs["bind_address"], knobs["serving_port"])
    else:
        print(f"{name}: no python3 on the rig: client TTFT is measured on the controller, through the tunnel")
    return ServingClient(url, model=knobs["served_model_name"], probe=probe)


def validate_shared(targets: Targets, run_dir: Path) -> list[SharedPair]:
    """Every pair of the targeted sharing rigs, recorded in run_dir's cards; ConfigError before any rig is asked."""
    names = targets.names
    rigs = {name: rig_settings(targets.data(name)) for name in names}
    groups = sharing_groups(
        {
            name: rigs[name].sections.get(KV_SHARE_SECTION, {}).get(KV_SHARE_SOURCE)
            if rigs[name].stack.knobs.get(KV_SHARE_KNOB)
            else None
            for name in names
        }
    )
    sharing = [name for rigs_of_store in groups for name in rigs_of_store]
    settings = {name: ValidationSettings.from_data(targets.data(name)) for name in sharing}
    with ExitStack() as stack:
        clients = {name: rig_client(stack, name, targets.data(name), rigs[name].stack.knobs) for name in sharing}
        pairs = run_pairs(clients, settings, groups)
        transports = {name: client.ttft_transport for name, client in clients.items()}
    record_shared(
        run_dir,
        pairs,
        {
            name: TTFTClient(
                transport=transport, tolerance_rel=TTFT_TOLERANCE_REL, tolerance_abs_s=TTFT_TOLERANCE_ABS_S
            )
            for name, transport in transports.items()
        },
    )
    render_run(run_dir)
    return pairs


def pair_line(pair: SharedPair) -> str:
    proof = pair.asked.proofs[0].text if pair.asked.proofs else "no request completed"
    prefill = "" if pair.prefill.passed else f"; prefill on {pair.source} labelled {pair.prefill.label} (not cold)"
    return f"{pair.source} -> {pair.target}: {pair.label} {'✓' if pair.passed else '✗'} ({proof}{prefill})"
