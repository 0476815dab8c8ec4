"""A fleet rollout that halts on the first bad rig: canaries first, then batches (`rigkit deploy --canary/--batch`).

    rigkit deploy inventory/lab.py --canary 1 --batch 2 --data serving_image=REPO@sha256:...
    rigkit deploy inventory/lab.py --canary 1 --batch 2 --on-failure rollback
    rigkit deploy inventory/lab.py --recheck-canaries          # prove the canaries again on a re-run

On an inventory with a router, a `rigkit deploy` that asks for no rollout is one: --batch 1, each rig drained from
the router first (rigkit.rollout.drain.routed_default); --all-at-once (or --batch 0) is the only way to restart
every targeted rig at once there.

The same as data (rigkit.settings.defaults, section rollout: rollout_canary, rollout_batch, rollout_on_failure,
rollout_cache_proof), the same on every targeted rig; a flag overrides the data.

1. Before any rig is touched: every rig's settings are built from its data (bad input refuses the rollout),
   its wanted rendering computed (rigkit.serving.commands.rendering_for: the hash a deploy will verify), and its state
   read over SSH in one round trip (the verified rendering it runs, rigkit.serving.commands.RELEASE_HASH_FILE, and its
   ledger's current release). A rig that cannot be read refuses the rollout: it would fail in its batch.
2. The first ``canary`` targeted rigs, in inventory order, are deployed (deploy.py with --limit); the serving
   role smokes each and rolls a failing one back itself. Each canary then proves its cache through the SSH
   tunnel with validate.py's own procedure cut short (rigkit.validation.procedure.validate_tiers, one salted session,
   no restart): cold, warm-gpu (GPU prefix hits grew), GPU eviction by fillers, warm-connector (external
   hits grew).
3. The other rigs follow ``batch`` at a time. After each stage the rigs are read again: a rig whose run
   failed, whose verified rendering is not the wanted one, or whose cache proof failed halts the rollout.
   Rigs not reached were never in a pyinfra run: they serve their old release untouched.
4. On a halt, ``on_failure`` decides about the rigs this rollout upgraded: left on the new release, or
   rolled back with rollback.py --limit (their stored verified rendering, by digest), then read again.

Where the fleet stands comes from the rigs: a rig already verified on its wanted rendering is not deployed
again. What the ledgers cannot say is kept in a local record (ROLLOUTS_DIR/<inventory>.json, written after
every stage): which release each rig verified before this rollout started (the rollback's check), which
rigs this rollout upgraded (what the rollback knob acts on) and which canaries passed the cache proof. A
re-run of the same rollout (same wanted renderings) after the controller was killed continues from there:
a canary that passed is neither deployed nor proven again unless --recheck-canaries asks.

This module runs it (the pyinfra runs, the stages, the rollback); the parts are plain modules of their own:
rigkit.rollout.plan (settings, stages), rollout_state (what a rig says), rollout_record (the local record),
rollout_stage (the decisions per stage), rollout_proof (the cache proof), rollout_summary (the words printed),
rollout_drain (the router). `rigkit deploy --deploy rollback.py --batch N` is a rolling rollback through the router,
built from the same parts: rigkit.rollout.rollback.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from rigkit.errors import ConfigError
from rigkit.fleet.deploy import provision_stores
from rigkit.fleet.inventory import rigs_among, targeted
from rigkit.fleet.outcome import OK
from rigkit.fleet.pyinfra_args import (
    data_pairs,
    is_dry_run,
    limit_from,
    split_limits,
    without_limits,
)
from rigkit.fleet.stage import stage_inventory
from rigkit.fleet.targets import Targets, select
from rigkit.paths import DEFAULT_DEPLOY, ROLLBACK_DEPLOY, ROLLOUTS_DIR
from rigkit.rollout import drain as rollout_drain
from rigkit.rollout.drain import ROUTER_DEFAULT_BATCH, gateways_left_note, routed_default, unreachable_router_fix
from rigkit.rollout.plan import (
    RolloutSettings,
    Stage,
    plan_stages,
    refuse_rollout_options,
    rollout_settings,
)
from rigkit.rollout.proof import prove_rig
from rigkit.rollout.record import RolloutRecord, load_record, record_path, resume_record, save_record
from rigkit.rollout.router_admin import gateways
from rigkit.rollout.stage import (
    Failure,
    StageResult,
    StageWork,
    newly_upgraded,
    rollback_choice,
    rolled_back_words,
    stage_failures,
    stage_work,
)
from rigkit.rollout.stage_runner import StageContext, run_drained_stage, run_stage_deploy
from rigkit.rollout.state import ReleaseState, read_states, refuse_unreadable
from rigkit.rollout.summary import dry_run_text, format_summary, summary_width
from rigkit.serving.commands import rendering_for
from rigkit.settings.defaults import ROLLOUT_VARIABLES
from rigkit.settings.hostdata import rig_settings
from rigkit.settings.variables import resolve


def run_rollout(
    inventory: str,
    deploy: str,
    pyinfra_args: Sequence[str],
    hosts: Mapping[str, Mapping],
    names: Sequence[str],
    settings: RolloutSettings,
    recheck_canaries: bool = False,
    records: Path = ROLLOUTS_DIR,
) -> tuple[int, str]:
    """The rollout over ``names`` (targeted rigs, connection data checked); (exit status, summary). With a router
    in the inventory each rig leaves it for its deploy (rigkit.rollout.drain)."""
    rigs = {name: rig_settings(dict(hosts[name]["data"])) for name in names}  # bad input: nothing touched yet
    wanted = {name: rendering_for(rig.stack).hash for name, rig in rigs.items()}
    stages = plan_stages(names, settings.canary, settings.batch)
    path = record_path(inventory, records)
    existing = load_record(path)
    out_of_router = existing.out_of_router if existing is not None else {}
    with rollout_drain.router_session(hosts, names, out_of_router) as router:
        router.refuse_full_drain(stages)  # before any rig is touched
        routed = [router.describe()] if router.active else []  # as it began
        states = refuse_unreadable(read_states(hosts, names))
        record = resume_record(existing, inventory, wanted, states)
        record.halted, record.out_of_router = "", router.out
        save_record(record, path)
        passthrough = without_limits(pyinfra_args)

        def remember() -> None:
            record.out_of_router = router.out
            save_record(record, path)

        context = StageContext(inventory, deploy, passthrough, hosts, router, states, remember, read_states)
        results: list[StageResult] = []
        for stage in stages:
            work = stage_work(stage, states, wanted, record.proven, recheck_canaries, settings.cache_proof)
            results.append(result := _run_stage(stage, work, context, record, path, rigs, wanted))
            if result.failures:
                break
        halted = next((result for result in results if result.failures), None)
        left: list[tuple[str, str]] = []
        rollback_lines: list[str] = []
        if halted is not None:
            roll_back, left = rollback_choice(settings.on_failure, record, states, wanted)
            # through a router one rig at a time, each drained and restored; without one, in one run
            for group in [[rig] for rig in roll_back] if router.active else [roll_back] if roll_back else []:
                rollback_lines += _roll_back(group, router, record, hosts, states, inventory, passthrough)
            record.halted = f"{halted.stage.label}: " + "; ".join(f"{f.rig} at {f.step}" for f in halted.failures)
            save_record(record, path)
        summary = format_summary(
            settings,
            stages,
            results,
            states,
            left,
            rollback_lines,
            summary_width(),
            router_lines=routed + router.lines,
            commands=router.add_back,
        )
    return (1 if halted is not None else 0), summary


def _run_stage(
    stage: Stage,
    work: StageWork,
    context: StageContext,
    record: RolloutRecord,
    path: Path,
    rigs: Mapping[str, Any],
    wanted: Mapping[str, str],
) -> StageResult:
    """One stage (rigkit.rollout.stage_runner): drain, deploy (which smokes), read, prove the canaries, restore the
    rigs that passed."""
    result = StageResult(stage, work)

    def judge(ran: tuple[str, ...], outcomes: Mapping[str, Any]) -> list[Failure]:
        drained_out = set(work.deploy) - set(ran)
        result.work = replace(work, deploy=ran, prove=tuple(r for r in work.prove if r not in drained_out))
        record.upgraded += newly_upgraded(record, stage.rigs, context.states, wanted)
        save_record(record, path)
        for rig in result.work.prove:
            if (rig in outcomes and outcomes[rig].status != OK) or context.states[rig].verified != wanted[rig]:
                continue  # failed already: stage_failures names why
            print(f"--> rigkit rollout, {stage.label}: cache proof on {rig}", flush=True)
            result.proofs[rig] = proof = prove_rig(rig, context.hosts[rig]["data"], rigs[rig].stack)
            if proof.passed and rig not in record.proven:
                record.proven.append(rig)
            save_record(record, path)
        return stage_failures(result.work, outcomes, context.states, wanted, result.proofs)

    _, result.failures = run_drained_stage(stage, work.deploy, context, judge, read=stage.rigs)
    return result


def _roll_back(
    group: Sequence[str],
    router: Any,
    record: RolloutRecord,
    hosts: Mapping[str, Mapping],
    states: dict[str, ReleaseState],
    inventory: str,
    passthrough: Sequence[str],
) -> list[str]:
    """rollback.py on ``group`` (drained first, restored when back on its release); the summary's lines."""
    lines = []
    not_drained = router.drain_each(group)
    lines += [f"{rig}: not rolled back ({why})" for rig, why in not_drained.items()]
    group = [rig for rig in group if rig not in not_drained]
    if group:
        run_stage_deploy("rollback", ROLLBACK_DEPLOY, group, inventory, passthrough)
        states.update(read_states(hosts, group))
    for rig in group:
        back, words = rolled_back_words(rig, record, states[rig])
        lines.append(words)
        if back:  # no longer on the release: a re-run deploys and proves it again
            record.upgraded.remove(rig)
            record.proven = [r for r in record.proven if r != rig]
            if why := router.restore(rig):
                router.keep_out(rig, f"the router did not take it back: {why}")
        else:
            router.keep_out(rig, "its rollback failed")
    record.out_of_router = router.out
    return lines


@dataclass(frozen=True)
class TargetedRigs:
    """What a rollout or a rolling rollback targets, read before any rig is touched."""

    pyinfra_args: list[str]  # pyinfra's arguments, each --limit split
    hosts: dict[str, dict]  # the inventory's hosts with the --data pyinfra will see
    names: list[str]  # the targeted rigs (a router host is no rig), in inventory order
    sections: dict[str, dict]  # each targeted rig's resolved `rollout` section


def targeted_rigs(inventory: str, pyinfra_args: Sequence[str], targets: Optional[Targets] = None) -> TargetedRigs:
    """The rigs `rigkit deploy INVENTORY [pyinfra args]` targets (rigkit.fleet.targets, unless the command picked
    them already) with their rollout sections."""
    pyinfra_args = split_limits(pyinfra_args)
    if targets is None:
        targets = select(inventory, limit_from(pyinfra_args), data_pairs(pyinfra_args), rigs_only=False)
    names = rigs_among(targets.hosts, targets.names)
    return TargetedRigs(
        pyinfra_args, targets.hosts, names, {name: resolve(ROLLOUT_VARIABLES, targets.data(name)) for name in names}
    )


def refuse_rollout_flags(args: Any) -> None:
    """ConfigError for rollout flags a deploy file cannot take (before the inventory is read): a rolling rollback
    takes --batch only; a deploy file other than deploy.py and rollback.py takes none."""
    deploy = Path(args.deploy).name
    if deploy == ROLLBACK_DEPLOY:
        refuse_rollout_options(
            {"--canary": args.canary, "--on-failure": args.on_failure, "--recheck-canaries": args.recheck_canaries}
        )
    elif deploy != DEFAULT_DEPLOY and (
        any(value is not None for value in (args.canary, args.batch, args.on_failure)) or args.recheck_canaries
    ):
        raise ConfigError(
            "--deploy",
            args.deploy,
            f"a rollout batches {DEFAULT_DEPLOY} and {ROLLBACK_DEPLOY} only",
            "run it without --canary/--batch/--on-failure/--recheck-canaries (with --limit to choose the rigs)",
        )


def rollout_command(args: Any, targets: Optional[Targets] = None) -> Optional[int]:
    """`rigkit deploy` (deploy.py) with a rollout asked (flags or data, or a router in the inventory): run it and
    print its summary; None when no rollout is asked (rigkit.fleet.deploy then runs every rig at once). ConfigError
    before any rig is touched."""
    refuse_rollout_flags(args)
    flags = {"rollout_canary": args.canary, "rollout_batch": args.batch, "rollout_on_failure": args.on_failure}
    asked = any(value is not None for value in flags.values()) or bool(args.recheck_canaries)
    rigs = targeted_rigs(args.inventory, args.pyinfra_args, targets)
    if not rigs.names:
        return None  # no rig among the targets: one run over them (a gateway)
    settings = rollout_settings(rigs.sections, flags)
    defaulted = None if settings.active else routed_default(rigs.hosts, rigs.names, asked or bool(args.all_at_once))
    if defaulted:
        settings = replace(settings, batch=ROUTER_DEFAULT_BATCH)
        print(f"--> rigkit deploy: {defaulted}", flush=True)
    if not settings.active:
        return None
    if note := gateways_left_note(rigs.hosts, targeted(rigs.hosts, limit_from(rigs.pyinfra_args)), args.inventory):
        print(f"--> rigkit deploy: {note}", flush=True)
    if is_dry_run(rigs.pyinfra_args):
        print(
            dry_run_text(
                "rollout",
                plan_stages(rigs.names, settings.canary, settings.batch),
                gateways(rigs.hosts),
                summary_width(),
            ),
            flush=True,
        )
        return None  # rigkit.fleet.deploy runs pyinfra --dry on every targeted rig at once
    # every targeted rig holds its model before the first canary is released (staging stops no engine); a fresh
    # rig's store gets its disk first
    provision_stores(args.inventory, rigs.hosts, rigs.names, rigs.pyinfra_args)
    stage_inventory(rigs.hosts, rigs.names)
    try:
        status, summary = run_rollout(
            args.inventory,
            args.deploy,
            rigs.pyinfra_args,
            rigs.hosts,
            rigs.names,
            settings,
            recheck_canaries=bool(args.recheck_canaries),
        )
    except ConfigError as exc:
        raise (unreachable_router_fix(exc) if defaulted and exc.field == "router" else exc) from None
    print("\n" + summary)
    return status
