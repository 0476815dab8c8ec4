"""A rolling rollback through the router: `rigkit deploy INVENTORY --deploy rollback.py --batch N`.

    rigkit deploy inventory/fleet.py --deploy rollback.py --batch 1
    rigkit deploy inventory/fleet.py --deploy rollback.py --batch 1 --limit rig1 --limit rig2
    rigkit deploy inventory/fleet.py --deploy rollback.py --batch 1 --data rollback_to=REPO@sha256:...

The batch is --batch, else the targeted rigs' rollout_batch data (one value for the fleet, as a rollout's:
rigkit.rollout.plan.fleet_value); 0, the default, keeps the plain run (rollback.py on every targeted rig at once, the
router untouched). The rest of a rollout's data (rollout_canary, rollout_on_failure, rollout_cache_proof) is a
deploy's and does not apply.

1. Before any rig is touched: the options a rollback has no use for (--canary, --on-failure, --recheck-canaries)
   are refused, naming the option, its value and the fix; every targeted rig's data is validated and its state read
   (a rig that cannot be read refuses the rollback); with a router in the inventory, a batch that would drain every
   rig it routes to is refused (rigkit.rollout.drain.refuse_full_drain).
2. Batch by batch, in inventory order: each rig of the batch leaves every router routing to it and finishes the
   requests it has (RouterDrain.drain_each), rollback.py runs on the batch with --limit (the serving role brings up
   each rig's stored verified rendering and smokes it), and the rigs' states are read again.
3. A rig is back when its run succeeded and its ledger's current entry is a rollback whose smoke passed and whose
   rendering is the verified one the rig runs (rollback_failure); it goes back into the router. Any other rig halts
   the rollback: it stays out of the router, and the summary names the step and why, and prints the command that
   adds it back. The rollout's local record (rigkit.rollout.record, out_of_router) keeps it, written after each
   drain and each batch: the re-run that gets its rollback verified puts it back (it finds it out of the router
   already, so rolls it back without another drain). Later batches are untouched: each serves the release it had.

The pieces are the rollout's: its drain (rigkit.rollout.drain), its stages (rigkit.rollout.stage_runner),
the rigs' states (rigkit.rollout.state), the stages and failures (rigkit.rollout.plan, rigkit.rollout.stage) and the
summary's lines (rigkit.rollout.summary). Without a router in the inventory the batches run without drains.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from rigkit.errors import ConfigError
from rigkit.fleet.pyinfra_args import is_dry_run, without_limits
from rigkit.fleet.targets import Targets
from rigkit.paths import ROLLBACK_DEPLOY, ROLLOUTS_DIR
from rigkit.rollout import drain as rollout_drain
from rigkit.rollout.drain import ROUTER_DEFAULT_BATCH, routed_default, unreachable_router_fix
from rigkit.rollout.plan import Stage, fleet_value, plan_stages, refuse_rollout_options
from rigkit.rollout.record import RolloutRecord, load_record, record_path, save_record
from rigkit.rollout.router_admin import gateways
from rigkit.rollout.run import targeted_rigs
from rigkit.rollout.stage import Failure, StageResult, StageWork, run_failure
from rigkit.rollout.stage_runner import StageContext, run_drained_stage
from rigkit.rollout.state import ReleaseState, read_states, refuse_unreadable
from rigkit.rollout.summary import dry_run_text, summary_text, summary_width
from rigkit.serving.ledger import ROLLBACK_KIND, SHORT_DIGEST, SMOKE_PASS
from rigkit.settings.defaults import ROLLOUT_VARIABLES
from rigkit.settings.hostdata import rig_settings

# `rigkit deploy` options a rolling rollback refuses: why each makes no sense with rollback.py
# the step a summary names when a rig's ledger says its rollback is not done, and why
VERIFY_STEP = "verify the rollback"
NO_RELEASE = "its ledger holds no release"
NOT_A_ROLLBACK = "its ledger's current entry is a {kind}, not a rollback ({release})"
SMOKE_NOT_PASSED = "its rollback's smoke is {smoke}, not {passed} ({note})"
NOT_VERIFIED = "its rollback's rendering {entry} is not the verified rendering the rig runs ({verified})"


def rollback_batch(per_rig: Mapping[str, Mapping[str, Any]], flag: Optional[int]) -> int:
    """How many rigs roll back at a time: --batch (``flag``), else the rigs' one rollout_batch (0: all at once)."""
    batch = next(variable for variable in ROLLOUT_VARIABLES if variable.name == "rollout_batch")
    return fleet_value(batch, per_rig, flag)


def rollback_failure(rig: str, outcome: Optional[Any], state: ReleaseState) -> Optional[Failure]:
    """Why ``rig`` is not back after its rollback.py run, None when it is: the run must have succeeded (``outcome``:
    rigkit.fleet.outcome.RigOutcome) and the rig's ledger's current entry (``state``, read after the run) must be a
    rollback whose smoke passed and whose rendering is the verified one the rig runs. A rollback.py run that failed
    may leave a passing rollback entry (the serving role's automatic rollback after it): the run decides first."""
    if failure := run_failure(rig, outcome, state):
        return failure
    current = state.current
    if current is None:
        return Failure(rig, VERIFY_STEP, NO_RELEASE)
    if current.kind != ROLLBACK_KIND:
        return Failure(rig, VERIFY_STEP, NOT_A_ROLLBACK.format(kind=current.kind, release=current.summary()))
    if current.smoke != SMOKE_PASS:
        return Failure(
            rig,
            VERIFY_STEP,
            SMOKE_NOT_PASSED.format(
                smoke=current.smoke or "not checked", passed=SMOKE_PASS, note=current.note or "no note"
            ),
        )
    if not state.verified or current.rendering != state.verified:
        return Failure(
            rig,
            VERIFY_STEP,
            NOT_VERIFIED.format(
                entry=(current.rendering or "none")[:SHORT_DIGEST], verified=state.verified[:SHORT_DIGEST] or "none"
            ),
        )
    return None


def format_rollback_summary(
    batch: int,
    stages: Sequence[Stage],
    results: Sequence[StageResult],
    states: Mapping[str, ReleaseState],
    router_lines: Sequence[str] = (),
    commands: Sequence[str] = (),
    width: int = 100,
) -> str:
    """What the rolling rollback did, batch by batch, and what to do next (rigkit.rollout.summary.summary_text)."""
    put_back = (
        "; the same command run again puts it back into the router once its rollback is verified, or by "
        "hand with the command above"
        if commands
        else ""
    )
    return summary_text(
        f"--> rigkit rollback: {ROLLBACK_DEPLOY} in batches of {batch}, halting at the first rig not "
        "back on a verified rollback",
        stages,
        results,
        states,
        lambda result, rig: "rolled back and verified",
        f"rollback complete: {sum(len(s.rigs) for s in stages)} rigs on a verified rollback",
        f"Next: fix what the failed rig reports (its own log: docker logs rigkit-serving){put_back}. "
        "Rigs rolled back before it stay rolled back; rigs not reached serve the release they had: "
        "run the same command again to roll them back (a rig already rolled back finds its rollback "
        "done, No Change).",
        width,
        router_lines,
        commands=commands,
        untouched="each serves the release it had",
    )


def run_rolling_rollback(
    inventory: str,
    pyinfra_args: Sequence[str],
    hosts: Mapping[str, Mapping],
    names: Sequence[str],
    batch: int,
    records: Path = ROLLOUTS_DIR,
) -> tuple[int, str]:
    """rollback.py over ``names`` (targeted rigs, connection data checked), ``batch`` at a time, each rig out of the
    inventory's routers while it rolls back; (exit status, summary). ConfigError before any rig is touched. The rigs
    out of a router are kept in the rollout's record (its other fields as they were; a new record names no
    rollout)."""
    for name in names:
        rig_settings(dict(hosts[name]["data"]))  # bad input: nothing touched yet
    stages = plan_stages(names, 0, batch)
    path = record_path(inventory, records)
    record = load_record(path) or RolloutRecord(target="", inventory=inventory)
    with rollout_drain.router_session(hosts, names, record.out_of_router) as router:
        router.refuse_full_drain(stages)  # before any rig is touched
        routed = [router.describe("rollback")] if router.active else []  # as it began

        def remember() -> None:
            record.out_of_router = router.out
            save_record(record, path)

        states = refuse_unreadable(read_states(hosts, names))
        passthrough = without_limits(pyinfra_args)
        context = StageContext(inventory, ROLLBACK_DEPLOY, passthrough, hosts, router, states, remember, read_states)
        results: list[StageResult] = []
        for stage in stages:
            results.append(result := _roll_back_stage(stage, context))
            if result.failures:
                break
        summary = format_rollback_summary(
            batch,
            stages,
            results,
            states,
            width=summary_width(),
            router_lines=routed + router.lines,
            commands=router.add_back,
        )
    return (1 if results[-1].failures else 0), summary


def _roll_back_stage(stage: Stage, context: StageContext) -> StageResult:
    """One batch (rigkit.rollout.stage_runner): drain, rollback.py, read, back into the router only the rigs whose
    rollback is verified."""

    def judge(ran: tuple[str, ...], outcomes: Mapping[str, Any]) -> list[Failure]:
        return [failure for rig in ran if (failure := rollback_failure(rig, outcomes.get(rig), context.states[rig]))]

    ran, failures = run_drained_stage(stage, stage.rigs, context, judge)
    return StageResult(stage, StageWork(ran, (), ()), failures=failures)


def rolling_rollback_command(args: Any, targets: Optional[Targets] = None) -> Optional[int]:
    """`rigkit deploy --deploy rollback.py` with a batch (--batch, or rollout_batch data, or a router in the
    inventory): run it and print its summary; None without one (rigkit.fleet.deploy then runs rollback.py on every
    rig at once). ConfigError before any rig is touched."""
    refuse_rollout_options(
        {"--canary": args.canary, "--on-failure": args.on_failure, "--recheck-canaries": args.recheck_canaries}
    )
    rigs = targeted_rigs(args.inventory, args.pyinfra_args, targets)
    if not rigs.names:
        return None  # no rig among the targets: one run over them (a gateway)
    batch = rollback_batch(rigs.sections, args.batch)
    defaulted = (
        None if batch else routed_default(rigs.hosts, rigs.names, args.batch is not None or bool(args.all_at_once))
    )
    if defaulted:
        batch = ROUTER_DEFAULT_BATCH
        print(f"--> rigkit deploy: {defaulted}", flush=True)
    if not batch:
        return None
    if is_dry_run(rigs.pyinfra_args):
        print(
            dry_run_text("rollback", plan_stages(rigs.names, 0, batch), gateways(rigs.hosts), summary_width()),
            flush=True,
        )
        return None  # rigkit.fleet.deploy runs pyinfra --dry on every targeted rig at once
    try:
        status, summary = run_rolling_rollback(args.inventory, rigs.pyinfra_args, rigs.hosts, rigs.names, batch)
    except ConfigError as exc:
        raise (unreachable_router_fix(exc) if defaulted and exc.field == "router" else exc) from None
    print("\n" + summary)
    return status
