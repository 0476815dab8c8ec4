"""Validate each rig's cache tiers and write its results card.

    pyinfra inventory/X.py validate.py
    pyinfra inventory/X.py validate.py --data validate_prompt_tokens=37000
    pyinfra inventory/X.py validate.py --data replay=results/<run-id>   # same prompts/seeds as that run
    pyinfra inventory/X.py validate.py --data validate_decode_ab=true   # + decode A/B (restarts the stack)
    pyinfra inventory/X.py validate.py --data validate_soak_sessions=20 # + soak: 20 conversations x 5 turns
    pyinfra inventory/X.py validate.py --data validate_pays_lengths=2048,8192,32768   # + where each tier pays

Per rig: reach the serving API (SSH tunnel to the rig's loopback, or direct on a LAN bind) for prompts and
/metrics, stream every completion from the rig itself (rigkit/files/ttft_probe.py run by the rig's python3 over
pyinfra's SSH connection: the client TTFT is the one the rig's own clients see, not the tunnel's), run
rigkit.validation.procedure's tier procedure (cold, warm-gpu, warm-connector, and warm-persistent after a
compose down/up on the rig), read the L2 disk tier's state on the rig (filesystem size/free against
the janitor's floor, the store against l2_budget_gb, the janitor and its evictions: a full L2 fails
the card), measure the rig's own limits (rigkit/files/rig_limits.py: the disk half by the rig's python3, the
host-to-device half in the serving container; rigkit.validation.rig_limits_probe) and, with validate_pays_lengths,
sweep context lengths (rigkit.validation.pays_sweep): each warm tier against its floor and where it pays, on the
card's section ⑤; optionally soak the stack (rigkit.validation.soak: multi-turn conversations, memory sampled on the
rig after every turn; a failed soak fails the card), then write results/<run-id>/<rig>.card.json +
Markdown + plots and re-render the fleet card. Every host of one pyinfra run shares the run id. A replay keeps
the recorded run's cards in results/<run-id>/recorded/: its fleet card sets the recorded rigs beside the new
ones, lists every setup difference and judges each figure against the recorded run (rigkit.validation.card.replay), also
written as replay.json and printed.
"""

from __future__ import annotations

import os
import shlex
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Optional

from pyinfra import host
from pyinfra.operations import python

from rigkit.errors import ConfigError
from rigkit.l2_state import read_l2
from rigkit.nvidia_smi import POWER_LIMIT_QUERY, enforced_power_limits
from rigkit.paths import REPO_ROOT, RIG_STACK_DIR
from rigkit.remote.client import ServingClient
from rigkit.remote.probe import RigProbe
from rigkit.remote.tunnel import serving_url
from rigkit.serving.commands import rendering_for, restart_commands
from rigkit.serving.release_steps import apply_rendering
from rigkit.serving.render import CONTAINER_NAME, l2_integrity
from rigkit.settings.defaults import SECRET_SETTINGS
from rigkit.settings.hostdata import rig_settings, settings_for_host
from rigkit.settings.profiles import ab_pair, load_profiles
from rigkit.settings.sizing import GB
from rigkit.validation.abstats import ARM_OFF, ARM_ON
from rigkit.validation.card import RESULTS_DIR, fmt_l2, new_run_id, render_run, write_card
from rigkit.validation.card.assemble import replay_data, to_card
from rigkit.validation.card.glance import glance_lines
from rigkit.validation.card.replay import summary_lines
from rigkit.validation.card.store import RUN_ID_ENV, keep_recorded, replay_comparison
from rigkit.validation.decode_ab import run_decode_ab
from rigkit.validation.pays_sweep import check_lengths_fit, sweep_after_tiers
from rigkit.validation.procedure import ValidationSettings, check_prompt_fits, validate_tiers
from rigkit.validation.rig_limits_probe import ProbeSizes, probe_rig_limits
from rigkit.validation.soak import check_fits, limits_from, memory_probe, plan_from, run_soak

RUN_ID = os.environ.setdefault(RUN_ID_ENV, new_run_id())


def _shell(command: str) -> Optional[str]:
    status, output = host.run_shell_command(command)
    return output.stdout.strip() if status else None


def _run_with_stdin(command: str, stdin: str) -> Optional[str]:
    """rigkit.remote.probe.RigCommand over pyinfra's connection to this host."""
    status, output = host.run_shell_command(command, _stdin=stdin)
    return output.stdout if status else None


def _rig_probe(knobs) -> Optional[RigProbe]:
    """The TTFT probe on this rig, or None (said on the console) when the rig has no python3: then the
    controller streams through the tunnel and the card names that as where the client TTFT was measured."""
    if _shell("command -v python3") is None:
        print(f"{host.name}: no python3 on the rig: client TTFT is measured on the controller, through the tunnel")
        return None
    return RigProbe.on(host.name, _run_with_stdin, knobs["bind_address"], knobs["serving_port"])


def _restart_stack(compose: str) -> None:
    """A full `down` then `up -d` (rigkit.serving.commands.restart_commands)."""
    if _shell(" && ".join(restart_commands(compose))) is None:
        raise ConfigError(
            "restart", RIG_STACK_DIR, "compose down/up failed on the rig", "run deploy.py again, then validate"
        )


def _decode_ab(data: dict, stack, compose: str, url: str, settings: ValidationSettings, probe: Optional[RigProbe]):
    """Decode A/B on this rig: the profile and its derived baseline (only the connector differs),
    interleaved; the rig ends as it was deployed (same files, so the release hash still holds)."""
    with_connector, baseline = ab_pair(load_profiles(), stack.profile.name)
    profiles = {**load_profiles(), baseline.name: baseline}
    arms = {ARM_ON: with_connector.name, ARM_OFF: baseline.name}

    def activate(arm_name: str) -> ServingClient:
        arm = settings_for_host({**data, "serving_profile": arms[arm_name]}, profiles=profiles)
        apply_rendering(host, rendering_for(arm))
        _restart_stack(compose)
        client = ServingClient(url, model=arm.knobs["served_model_name"], probe=probe)
        client.wait_ready()
        return client

    try:
        return run_decode_ab(activate, arms, settings)
    finally:
        apply_rendering(host, rendering_for(stack))
        _restart_stack(compose)
        ServingClient(url).wait_ready()


def rig_facts(l2_path: Optional[str], power_limit_declared_w: Optional[float]) -> dict:
    """What the card records to repeat the run elsewhere: GPUs, driver/CUDA, the power limit declared and
    enforced, RAM, L2 device and fs."""
    facts: dict = {"power_limit_declared_w": power_limit_declared_w}
    gpus = _shell("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null")
    if gpus:
        rows = [[cell.strip() for cell in line.split(",")] for line in gpus.splitlines()]
        facts["gpu_models"] = [row[0] for row in rows]
        facts["driver_version"] = rows[0][1] if len(rows[0]) > 1 else None
        header = _shell("nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*'")
        facts["cuda_version"] = header.split(":")[1].strip() if header else None
        limits = _shell(f"{POWER_LIMIT_QUERY} 2>/dev/null")
        facts["power_limits_enforced_w"] = enforced_power_limits(limits) if limits else []
    mem = _shell("awk '/^MemTotal:/ {print $2}' /proc/meminfo")
    if mem and mem.isdigit():
        facts["host_ram_bytes"] = int(mem) * 1024
    if l2_path:
        mount = _shell(f"findmnt -n -o SOURCE,FSTYPE --target {shlex.quote(l2_path)}")
        if mount and len(mount.split()) >= 2:
            facts["l2_device"], facts["l2_filesystem"] = mount.split()[:2]
    return facts


def _store_bytes(path: str) -> Callable[[], int]:
    def measure() -> int:
        out = _shell(f"du -sb {shlex.quote(path)} 2>/dev/null | cut -f1")
        return int(out) if out and out.isdigit() else 0

    return measure


def _validate() -> None:
    from rigkit.facts.docker import ComposeCommand

    data = host.data.dict()
    replayed = None
    if data.get("replay"):
        replayed = Path(data["replay"]) if Path(data["replay"]).is_absolute() else REPO_ROOT / data["replay"]
        data.update(replay_data(replayed))
    rig = rig_settings(data)
    stack = rig.stack
    settings = ValidationSettings.from_data(data)
    knobs = stack.knobs
    # what the declared context cannot hold is refused before any rig is asked (the server's is checked again)
    check_prompt_fits(settings, knobs["max_model_len"])
    check_lengths_fit(settings.pays_lengths, settings.output_tokens, knobs["max_model_len"])
    if settings.soak_sessions:
        check_fits(plan_from(settings), knobs["max_model_len"])
    compose = host.get_fact(ComposeCommand)
    if compose is None:
        raise ConfigError(
            "compose",
            None,
            "neither `docker compose` nor `docker-compose` on the rig",
            "run deploy.py (the docker role installs compose)",
        )
    l2_path = knobs["l2_path"] if stack.l2_active else None
    tier_sizes, tier_rules = {}, {}
    if stack.l1_gib:
        l1 = f"L1 RAM {stack.l1_gib} GiB"
        tier_sizes[l1] = stack.l1_bytes
        if stack.l1_eviction:
            tier_rules[l1] = stack.l1_eviction
    if l2_path:
        tier_sizes[f"L2 disk {knobs['l2_budget_gb']:g} GB"] = int(knobs["l2_budget_gb"] * GB)
    with ExitStack() as tunnels:
        url = tunnels.enter_context(
            serving_url(data, knobs["bind_address"], knobs["serving_port"], inventory_name=host.name)
        )
        # LMCache's own counters (its lookups, per tier where exported) are on its HTTP API, which the stack binds
        # to the rig's loopback: a second tunnel, scraped with vLLM's /metrics in every window
        lmcache = [
            tunnels.enter_context(serving_url(data, "127.0.0.1", port, inventory_name=host.name)) + "/metrics"
            for knob, port in stack.listen_ports.items()
            if knob == "lmcache_http_port"
        ]
        probe = _rig_probe(knobs)
        client = ServingClient(url, model=knobs["served_model_name"], extra_metrics_urls=lmcache, probe=probe)
        if settings.soak_sessions:  # refuse a soak that cannot fit before the tiers take their minutes
            client.wait_ready()
            check_fits(plan_from(settings), client.max_model_len)
        try:
            result = validate_tiers(
                client,
                lambda: _restart_stack(compose),
                settings,
                connector_configured=stack.profile.connector is not None,
                store_bytes=_store_bytes(l2_path) if l2_path else None,
                capacity_tiers=tier_sizes,
                capacity_rules=tier_rules,
                not_applicable=stack.tiers_not_applicable,
                store_chunk_tokens=stack.store_chunk_tokens,
                bit_exact_tiers=stack.bit_exact_tiers,
            )
        except Exception:
            l2 = read_l2(_shell, stack)  # a full L2 disk is a likely cause of a dead engine: say so
            if l2 is not None and l2.level != "ok":
                print(f"{host.name}: {fmt_l2(l2)}\n" + "\n".join(f"  {problem}" for problem in l2.problems))
            raise
        sizes = ProbeSizes.of(
            result.pool.block_size, stack.gpu_kv_bytes_per_token, stack.store_chunk_tokens, stack.kv_bytes_per_token
        )
        rig_limits = probe_rig_limits(_run_with_stdin, l2_path, CONTAINER_NAME, sizes)
        sweep = []
        if settings.pays_lengths:
            sweep = sweep_after_tiers(
                client,
                result,
                settings,
                connector_configured=stack.profile.connector is not None,
                progress=lambda line: print(f"{host.name}: {line}"),
            )
        soak = None
        if settings.soak_sessions:
            probe = memory_probe(_shell)
            soak = run_soak(
                client,
                plan_from(settings),
                limits_from(settings),
                lambda: probe.read(_shell),
                probe.source,
                seed=settings.seed,
                prompt_kind=settings.prompt_kind,
                prefill_tokens_per_s=result.prefill_tokens_per_s,
            )
        decode_ab = _decode_ab(data, stack, compose, url, settings, probe) if settings.decode_ab else None
    repro = {
        "profile": stack.profile.name,
        "image_digest": stack.image,
        "model_source": stack.knobs["model_source"],
        "l2_integrity": l2_integrity(stack),
        "knobs": {k: v for k, v in knobs.items() if k not in SECRET_SETTINGS},
        **rig_facts(l2_path, rig.nvidia_driver["nvidia_driver_power_limit_w"]),
    }
    card = to_card(
        host.name,
        RUN_ID,
        result,
        settings,
        stack.profile.connector is not None,
        decode_ab=decode_ab,
        repro=repro,
        l2=read_l2(_shell, stack),
        soak=soak,
        speculative=stack.knobs["speculative_config"] is not None,
        rig_limits=rig_limits,
        sweep=sweep,
        declared_kv_bytes_per_token=stack.kv_bytes_per_token,
    )
    run_dir = REPO_ROOT / RESULTS_DIR / RUN_ID
    write_card(run_dir, card)
    if replayed is not None:  # the replay's fleet card sets the recorded rigs beside this run's
        keep_recorded(run_dir, replayed)
    render_run(run_dir)
    print("\n".join(glance_lines(card, run_dir / f"{host.name}.md")))  # the greedy texts are on the card
    comparison = replay_comparison(run_dir) if replayed is not None else None
    if comparison:
        print("\n".join(summary_lines(comparison)) + f"\n  -> {run_dir / 'fleet.md'}")


python.call(name="Validate cache tiers and write the results card", function=_validate)
