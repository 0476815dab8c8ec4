"""The one skeleton every stage of a rollout and of a rolling rollback runs: its rigs leave the router, the deploy
file runs on those that left, the rigs are read again, the caller judges them (a rollout proves its canaries here),
and the router takes back the rigs that passed. Which rigs are out of the router is saved after the drain and after
the stage, so a re-run knows them."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from rigkit.fleet import pyinfra_args as pyinfra_args_module
from rigkit.fleet.outcome import RigOutcome, summarize
from rigkit.fleet.pyinfra_args import pyinfra_executable
from rigkit.rollout.drain import DRAIN_STEP, RESTORE_STEP
from rigkit.rollout.plan import ROLLOUT_STEP_ENV, Stage
from rigkit.rollout.stage import Failure
from rigkit.rollout.state import ReleaseState, read_states


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


def run_stage_deploy(
    label: str,
    deploy: str,
    rigs: Sequence[str],
    inventory: str,
    passthrough: Sequence[str],
    run: Optional[Callable] = None,
) -> dict[str, RigOutcome]:
    """pyinfra on ``rigs`` only; rigkit.fleet.outcome.RigOutcome by rig."""
    run = pyinfra_args_module.run_pyinfra_streaming if run is None else run
    limits = [arg for rig in rigs for arg in ("--limit", rig)]
    print(f"\n--> rigkit rollout, {label}: {deploy} on {', '.join(rigs)}", flush=True)
    with rollout_step(label):
        _, output = run([pyinfra_executable(), "-y", *passthrough, *limits, inventory, deploy])
    return summarize(output, rigs)


@dataclass
class StageContext:
    """What every stage of one run shares."""

    inventory: str
    deploy: str  # the deploy file each stage runs
    passthrough: Sequence[str]  # pyinfra's arguments without --limit
    hosts: Mapping[str, Mapping]
    router: Any  # rigkit.rollout.drain.RouterDrain (inactive without a router)
    states: dict[str, ReleaseState]  # each rig's state, updated after each stage
    remember: Callable[[], None]  # saves the rigs out of the router in the run's record
    read: Callable[[Mapping[str, Mapping], Sequence[str]], dict[str, ReleaseState]] = read_states


# (the rigs the deploy ran on, their outcomes) -> the failures the caller sees in them
Judge = Callable[[tuple[str, ...], Mapping[str, RigOutcome]], list[Failure]]


def run_drained_stage(
    stage: Stage, rigs: Sequence[str], context: StageContext, judge: Judge, read: Optional[Sequence[str]] = None
) -> tuple[tuple[str, ...], list[Failure]]:
    """Drain ``rigs``, run the deploy on those drained, read ``read`` again (default: those it ran on), judge, and
    settle ``stage.rigs`` back into the router (a rig with a failure stays out); (rigs run on, failures)."""
    not_drained = context.router.drain_each(rigs)
    context.remember()
    ran = tuple(rig for rig in rigs if rig not in not_drained)
    outcomes = run_stage_deploy(stage.label, context.deploy, ran, context.inventory, context.passthrough) if ran else {}
    reread = ran if read is None else tuple(read)
    if reread:
        context.states.update(context.read(context.hosts, reread))
    failures = [Failure(rig, DRAIN_STEP, why) for rig, why in not_drained.items()]
    failures += judge(ran, outcomes)
    not_back = context.router.settle(stage.rigs, {failure.rig: failure.step for failure in failures})
    failures += [Failure(rig, RESTORE_STEP, why) for rig, why in not_back.items()]
    context.remember()
    return ran, failures
