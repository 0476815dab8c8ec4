"""A fleet rollout that halts on the first bad rig: canaries first, then batches (`rigkit deploy --canary/--batch`).

    rigkit deploy inventory/lab.py --canary 1 --batch 2 --data serving_image=REPO@sha256:...
    rigkit deploy inventory/lab.py --canary 1 --batch 2 --on-failure rollback
    rigkit deploy inventory/lab.py --recheck-canaries          # prove the canaries again on a re-run

On an inventory with a router, a `rigkit deploy` that asks for no rollout is one: --batch 1, each rig drained from
the router first (rigkit.rollout_drain.routed_default); --all-at-once (or --batch 0) is the only way to restart
every targeted rig at once there.

The same as data (rigkit.defaults, section rollout: rollout_canary, rollout_batch, rollout_on_failure,
rollout_cache_proof), the same on every targeted rig; a flag overrides the data.

1. Before any rig is touched: every rig's settings are built from its data (bad input refuses the rollout),
   its wanted rendering computed (rigkit.stack.rendering_for: the hash a deploy will verify), and its state
   read over SSH in one round trip (the verified rendering it runs, rigkit.stack.RELEASE_HASH_FILE, and its
   ledger's current release). A rig that cannot be read refuses the rollout: it would fail in its batch.
2. The first ``canary`` targeted rigs, in inventory order, are deployed (deploy.py with --limit); the serving
   role smokes each and rolls a failing one back itself. Each canary then proves its cache through the SSH
   tunnel with validate.py's own procedure cut short (rigkit.validation.validate_tiers, one salted session,
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
rigkit.rollout_plan (settings, stages), rollout_state (what a rig says), rollout_record (the local record),
rollout_stage (the decisions per stage), rollout_proof (the cache proof), rollout_summary (the words printed),
rollout_drain (the router). `rigkit deploy --deploy rollback.py --batch N` is a rolling rollback through the router,
built from the same parts: rigkit.rollout_rollback.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from rigkit.defaults import ROLLOUT_VARIABLES
from rigkit.errors import ConfigError
from rigkit.fleet import DEFAULT_DEPLOY, ROLLBACK_DEPLOY
from rigkit.inventory import targeted
from rigkit.paths import ROLLOUTS_DIR
from rigkit.pyinfra_args import data_pairs, is_dry_run, limit_from, pyinfra_executable, without_limits
from rigkit.rollout_plan import ROLLOUT_STEP_ENV, RolloutSettings, Stage, plan_stages, rollout_settings
from rigkit.rollout_proof import prove_rig
from rigkit.rollout_drain import ROUTER_DEFAULT_BATCH, gateways_left_note, routed_default, unreachable_router_fix
from rigkit.rollout_record import RolloutRecord, load_record, record_path, resume_record, save_record
from rigkit.rollout_stage import (Failure, StageResult, StageWork, newly_upgraded, rollback_choice, rolled_back_words,
                                  stage_failures, stage_work)
from rigkit.rollout_state import ReleaseState, read_states, refuse_unreadable
from rigkit.rollout_summary import dry_run_text, format_summary, summary_width
from rigkit.router_admin import gateways


@contextlib.contextmanager
def rollout_step(label: str) -> Iterator[None]:
    """Marks the pyinfra runs started inside as driven by rigkit deploy (deploy.py checks it)."""
    previous = os.environ.get(ROLLOUT_STEP_ENV)
    os.environ[ROLLOUT_STEP_ENV] = label
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ROLLOUT_STEP_ENV, None)
        else:
            os.environ[ROLLOUT_STEP_ENV] = previous


def run_stage_deploy(label: str, deploy: str, rigs: Sequence[str], inventory: str, passthrough: Sequence[str],
                     run: Optional[Callable] = None) -> dict[str, Any]:
    """pyinfra on ``rigs`` only; rigkit.fleet_outcome.RigOutcome by rig."""
    from rigkit import fleet
    from rigkit.fleet_outcome import summarize

    run = fleet.run_pyinfra_streaming if run is None else run
    limits = [arg for rig in rigs for arg in ("--limit", rig)]
    print(f"\n--> rigkit rollout, {label}: {deploy} on {', '.join(rigs)}", flush=True)
    with rollout_step(label):
        _, output = run([pyinfra_executable(), "-y", *passthrough, *limits, inventory, deploy])
    return summarize(output, rigs)


def run_rollout(inventory: str, deploy: str, pyinfra_args: Sequence[str], hosts: Mapping[str, Mapping],
                names: Sequence[str], settings: RolloutSettings, recheck_canaries: bool = False,
                records: Path = ROLLOUTS_DIR) -> tuple[int, str]:
    """The rollout over ``names`` (targeted rigs, connection data checked); (exit status, summary). With a router
    in the inventory each rig leaves it for its deploy (rigkit.rollout_drain)."""
    from rigkit import rollout_drain
    from rigkit.hostdata import rig_settings
    from rigkit.stack import rendering_for

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
        results: list[StageResult] = []
        for stage in stages:
            work = stage_work(stage, states, wanted, record.proven, recheck_canaries, settings.cache_proof)
            results.append(result := _run_stage(stage, work, router, record, path, hosts, rigs, states, wanted,
                                                inventory, deploy, passthrough))
            if result.failures:
                break
        halted = next((result for result in results if result.failures), None)
        left: list[tuple[str, str]] = []
        rollback_lines: list[str] = []
        if halted is not None:
            roll_back, left = rollback_choice(settings.on_failure, record, states, wanted)
            # through a router one rig at a time, each drained and restored; without one, in one run
            for group in ([[rig] for rig in roll_back] if router.active else [roll_back] if roll_back else []):
                rollback_lines += _roll_back(group, router, record, hosts, states, inventory, passthrough)
            record.halted = f"{halted.stage.label}: " + "; ".join(f"{f.rig} at {f.step}" for f in halted.failures)
            save_record(record, path)
        summary = format_summary(settings, stages, results, states, left, rollback_lines, summary_width(),
                                 router_lines=routed + router.lines,
                                 commands=router.add_back)
    return (1 if halted is not None else 0), summary


def _run_stage(stage: Stage, work: StageWork, router: Any, record: RolloutRecord, path: Path,
               hosts: Mapping[str, Mapping], rigs: Mapping[str, Any], states: dict[str, ReleaseState],
               wanted: Mapping[str, str], inventory: str, deploy: str, passthrough: Sequence[str]) -> StageResult:
    """One stage: drain, deploy (which smokes), read, prove the canaries, restore the rigs that passed."""
    from rigkit.fleet_outcome import OK
    from rigkit.rollout_drain import DRAIN_STEP, RESTORE_STEP

    not_drained = router.drain_each(work.deploy)
    record.out_of_router = router.out
    save_record(record, path)
    work = replace(work, deploy=tuple(r for r in work.deploy if r not in not_drained),
                   prove=tuple(r for r in work.prove if r not in not_drained))
    result = StageResult(stage, work)
    outcomes = run_stage_deploy(stage.label, deploy, work.deploy, inventory, passthrough) if work.deploy else {}
    states.update(read_states(hosts, stage.rigs))
    record.upgraded += newly_upgraded(record, stage.rigs, states, wanted)
    save_record(record, path)
    for rig in work.prove:
        if (rig in outcomes and outcomes[rig].status != OK) or states[rig].verified != wanted[rig]:
            continue  # failed already: stage_failures names why
        print(f"--> rigkit rollout, {stage.label}: cache proof on {rig}", flush=True)
        result.proofs[rig] = proof = prove_rig(rig, hosts[rig]["data"], rigs[rig].stack)
        if proof.passed and rig not in record.proven:
            record.proven.append(rig)
        save_record(record, path)
    result.failures = [Failure(rig, DRAIN_STEP, why) for rig, why in not_drained.items()]
    result.failures += stage_failures(work, outcomes, states, wanted, result.proofs)
    not_back = router.settle(stage.rigs, {failure.rig: failure.step for failure in result.failures})
    result.failures += [Failure(rig, RESTORE_STEP, why) for rig, why in not_back.items()]
    record.out_of_router = router.out
    save_record(record, path)
    return result


def _roll_back(group: Sequence[str], router: Any, record: RolloutRecord, hosts: Mapping[str, Mapping],
               states: dict[str, ReleaseState], inventory: str, passthrough: Sequence[str]) -> list[str]:
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
    """What `rigkit deploy` targets, read before any rig is touched."""

    pyinfra_args: list[str]  # pyinfra's arguments, each --limit split
    hosts: dict[str, dict]  # the inventory's hosts with the --data pyinfra will see
    names: list[str]  # the targeted rigs (a router host is no rig), in inventory order
    sections: dict[str, dict]  # each targeted rig's resolved `rollout` section

    def check_connections(self) -> None:
        from rigkit.inventory import check_connection_data

        for name in self.names:
            check_connection_data(name, self.hosts[name]["data"])


def targeted_rigs(inventory: str, pyinfra_args: Sequence[str]) -> TargetedRigs:
    """The rigs `rigkit deploy INVENTORY [pyinfra args]` targets; rigs sharing a KV store checked (rigkit.kv_share)."""
    from rigkit.inventory import load_inventory, rigs_among, targeted
    from rigkit.kv_share import check_inventory
    from rigkit.pyinfra_args import limit_from, split_limits
    from rigkit.variables import resolve

    pyinfra_args = split_limits(pyinfra_args)
    hosts = load_inventory(inventory, data_args=data_pairs(pyinfra_args))
    check_inventory((name, host["groups"], host["data"]) for name, host in hosts.items())
    names = rigs_among(hosts, targeted(hosts, limit_from(pyinfra_args)))
    return TargetedRigs(pyinfra_args, hosts, names,
                        {name: resolve(ROLLOUT_VARIABLES, dict(hosts[name]["data"])) for name in names})


def rollout_command(args: Any) -> Optional[int]:
    """`rigkit deploy` with a rollout asked (flags or data): run it and print its summary; None when no rollout
    is asked (rigkit.fleet then runs every rig at once). ConfigError before any rig is touched."""
    flags = {"rollout_canary": args.canary, "rollout_batch": args.batch, "rollout_on_failure": args.on_failure}
    asked = any(value is not None for value in flags.values()) or bool(args.recheck_canaries)
    if Path(args.deploy).name == ROLLBACK_DEPLOY:
        from rigkit.rollout_rollback import rolling_rollback_command

        return rolling_rollback_command(args)  # --batch (or rollout_batch data) only
    if Path(args.deploy).name != DEFAULT_DEPLOY:
        if asked:
            raise ConfigError("--deploy", args.deploy, f"a rollout batches {DEFAULT_DEPLOY} and {ROLLBACK_DEPLOY} only",
                              "run it without --canary/--batch/--on-failure/--recheck-canaries (with --limit to "
                              "choose the rigs)")
        return None  # rollout data applies to deploy.py and rollback.py only
    rigs = targeted_rigs(args.inventory, args.pyinfra_args)
    if not rigs.names:
        return None  # fleet_deploy refuses it, naming the inventory's hosts
    settings = rollout_settings(rigs.sections, flags)
    defaulted = None if settings.active else routed_default(rigs.hosts, rigs.names, asked or bool(args.all_at_once))
    if defaulted:
        settings = replace(settings, batch=ROUTER_DEFAULT_BATCH)
        print(f"--> rigkit deploy: {defaulted}", flush=True)
    if not settings.active:
        return None
    if note := gateways_left_note(rigs.hosts, targeted(rigs.hosts, limit_from(rigs.pyinfra_args)), args.inventory):
        print(f"--> rigkit deploy: {note}", flush=True)
    rigs.check_connections()
    if is_dry_run(rigs.pyinfra_args):
        print(dry_run_text("rollout", plan_stages(rigs.names, settings.canary, settings.batch),
                           gateways(rigs.hosts), summary_width()), flush=True)
        return None  # rigkit.fleet runs pyinfra --dry on every targeted rig at once
    try:
        status, summary = run_rollout(args.inventory, args.deploy, rigs.pyinfra_args, rigs.hosts, rigs.names, settings,
                                      recheck_canaries=bool(args.recheck_canaries))
    except ConfigError as exc:
        raise (unreachable_router_fix(exc) if defaulted and exc.field == "router" else exc) from None
    print("\n" + summary)
    return status
