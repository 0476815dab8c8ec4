"""The rollout's decisions per stage, as plain functions over the rigs' states: what a stage still has to do,
which of its rigs halt the rollout and why, which rigs it upgraded, and after a halt which of them the
rollback knob (rollout_on_failure) brings back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from rigkit.fleet.outcome import OK
from rigkit.rollout.plan import Stage
from rigkit.rollout.proof import Proof
from rigkit.rollout.record import RolloutRecord
from rigkit.rollout.state import ReleaseState
from rigkit.serving.ledger import SHORT_DIGEST
from rigkit.settings.defaults import ROLLOUT_LEAVE, ROLLOUT_ROLLBACK

# Why a rig of a stage failed: the words the summary prints.
NOT_ON_RELEASE = "its deploy reported success but the rig does not run the wanted rendering (verified {got})"
PROOF_FAILED = "cache proof failed: {why}"


@dataclass(frozen=True)
class StageWork:
    deploy: tuple[str, ...]  # rigs to run deploy.py on
    prove: tuple[str, ...]  # canaries to prove the cache on
    already: tuple[str, ...]  # rigs already verified on their wanted rendering (left alone)


def stage_work(
    stage: Stage,
    states: Mapping[str, ReleaseState],
    wanted: Mapping[str, str],
    proven: Sequence[str],
    recheck_canaries: bool = False,
    cache_proof: bool = True,
) -> StageWork:
    """What a stage still has to do, from where its rigs stand: a rig on its wanted rendering is not deployed
    again, a canary that passed its proof is not proven again, unless ``recheck_canaries``."""
    on_target = [rig for rig in stage.rigs if states[rig].verified == wanted[rig]]
    deploy = [rig for rig in stage.rigs if rig not in on_target]
    if not stage.canary:
        return StageWork(tuple(deploy), (), tuple(on_target))
    if recheck_canaries:
        deploy = list(stage.rigs)
    # a canary deployed again (rolled back since its proof, say) is proven again
    prove = [rig for rig in stage.rigs if cache_proof and (recheck_canaries or rig not in proven or rig in deploy)]
    return StageWork(tuple(deploy), tuple(prove), tuple(r for r in on_target if r not in deploy))


@dataclass(frozen=True)
class Failure:
    rig: str
    step: str
    why: str


def run_failure(rig: str, outcome: Optional[Any], state: ReleaseState) -> Optional[Failure]:
    """Why ``rig`` halts whatever it was to run: its pyinfra run failed (``outcome``: rigkit.fleet.outcome.RigOutcome,
    None when it was in no run), or it could not be read afterwards; None when neither."""
    if outcome is not None and outcome.status != OK:
        return Failure(rig, outcome.step or outcome.status, outcome.reason or outcome.status)
    if state.unreadable:
        return Failure(rig, "read the rig", state.unreadable)
    return None


def stage_failures(
    work: StageWork,
    outcomes: Mapping[str, Any],
    states: Mapping[str, ReleaseState],
    wanted: Mapping[str, str],
    proofs: Mapping[str, Proof],
) -> list[Failure]:
    """Every rig of the stage that halts the rollout: its run failed (``outcomes``: rigkit.fleet.outcome.RigOutcome by
    rig), it does not run its wanted rendering afterwards, or its cache proof failed."""
    failures = []
    for rig in dict.fromkeys(work.deploy + work.prove):
        if failure := run_failure(rig, outcomes.get(rig), states[rig]):
            failures.append(failure)
        elif states[rig].verified != wanted[rig]:
            got = states[rig].verified[:SHORT_DIGEST] or "none"
            failures.append(Failure(rig, "verify", NOT_ON_RELEASE.format(got=got)))
        elif rig in proofs and not proofs[rig].passed:
            failures.append(Failure(rig, "cache proof", PROOF_FAILED.format(why=proofs[rig].words)))
    return failures


def newly_upgraded(
    record: RolloutRecord, rigs: Sequence[str], states: Mapping[str, ReleaseState], wanted: Mapping[str, str]
) -> list[str]:
    """Rigs of ``rigs`` now verified on their wanted rendering that ran another one when the rollout began."""
    return [
        rig
        for rig in rigs
        if states[rig].verified == wanted[rig]
        and record.before[rig]["rendering"] != wanted[rig]
        and rig not in record.upgraded
    ]


def rollback_choice(
    on_failure: str, record: RolloutRecord, states: Mapping[str, ReleaseState], wanted: Mapping[str, str]
) -> tuple[list[str], list[tuple[str, str]]]:
    """(rigs to roll back, [(rig, why it is left)]) for the rigs this rollout upgraded, after a halt."""
    upgraded = [rig for rig in record.upgraded if states[rig].verified == wanted[rig]]
    if on_failure != ROLLOUT_ROLLBACK:
        return [], [(rig, f"left on the new release (rollout_on_failure={ROLLOUT_LEAVE})") for rig in upgraded]
    roll_back, left = [], []
    for rig in upgraded:
        if record.before[rig]["rendering"]:
            roll_back.append(rig)
        else:
            left.append((rig, "left on the new release: it ran no verified release before this rollout"))
    # on it before this record began (another run, another controller): whose upgrade it was is unknown
    left += [
        (
            rig,
            "left on the new release: it ran it already when this rollout's record began "
            "(roll it back by hand if this rollout upgraded it)",
        )
        for rig, before in record.before.items()
        if before["rendering"] == wanted.get(rig) and states.get(rig, ReleaseState()).verified == wanted[rig]
    ]
    return roll_back, left


def rolled_back_words(rig: str, record: RolloutRecord, state: ReleaseState) -> tuple[bool, str]:
    """Whether rollback.py brought ``rig`` back to the rendering it verified before the rollout, in words."""
    before = record.before[rig]
    if state.verified and state.verified == before["rendering"]:
        return True, f"{rig}: rolled back, serves {state.release_words()} (as before the rollout)"
    got = state.unreadable or (state.verified[:SHORT_DIGEST] or "no verified rendering")
    return False, (
        f"{rig}: NOT back on its release from before the rollout ({before['image']}, rendering "
        f"{before['rendering'][:SHORT_DIGEST]}): now {got}; roll it back by hand: pyinfra -y INVENTORY "
        f"rollback.py --limit {rig} --data rollback_to={before['image']}"
    )


@dataclass
class StageResult:
    stage: Stage
    work: StageWork
    proofs: dict[str, Proof] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
