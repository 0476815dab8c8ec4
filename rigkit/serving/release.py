"""What follows a release on a rig, decided from plain values: record it, verify it, store its rendering,
prune, or roll back to the last known-good release, or refuse.

No pyinfra and no host here. Each decision takes what the rig answered (the ledger, how bringing a
rendering up went, the smoke report, the texts of a stored rendering) and returns the steps to carry
out, in order; rigkit.serving.release_steps carries them out on the rig and roles/serving.py sequences the
decisions. The order of the steps is part of the contract: a stored rendering is written before the
ledger names it, and the release hash file last, so a run killed in between redoes the release.

A rollback is the same path with another rendering: ``restore`` picks what any rollback brings up
(automatic, or rollback.py's ``kind="rollback"``), ``judge_release`` judges a rollback.py release as it
judges a deploy, and ``judge_rollback`` judges an automatic rollback's own bring-up.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

from rigkit.serving.ledger import ROLLBACK_KIND, SHORT_DIGEST, SMOKE_FAIL, SMOKE_PASS, Ledger, Release, Rendering
from rigkit.serving.smoke import SmokeReport

# Of the wait's output, what a release that never became ready keeps in its ledger note.
NOTE_TAIL_LINES = 12
NOTE_TAIL_CHARS = 600
# A rollback that failed too: its note carries the error, cut to this length.
ROLLBACK_FAILED_NOTE_CHARS = 2000
REPLACEMENT_NOTE = "re-rendered with today's data: {why}"
STORED_MISSING = "stored rendering missing"
FIX_NOT_ROLLED_BACK = "fix the release, or roll back with rollback.py --data rollback_to=REPO@sha256:..."
FIX_NOT_RE_RENDERED = (
    "fix the release, or put the settings the last known-good release was verified with back in the data and deploy"
)
FIX_ROLLBACK_FAILED = "inspect the rig (docker logs rigkit-serving) and deploy a release that starts"
FIX_ROLLED_BACK = "fix the release and deploy it again; the rig serves the last known-good release"


@dataclass(frozen=True)
class Outcome:
    """How bringing a rendering up went: it answered (``smoke``: the report, None when smoke was not run)
    or it never became ready (``why_not_ready``: the wait's output tail, or the error)."""

    ready: bool
    why_not_ready: str = ""
    smoke: Optional[SmokeReport] = None

    @property
    def verdict(self) -> Optional[str]:
        """The ledger's smoke verdict: fail when never ready, None when not smoke-checked."""
        if not self.ready:
            return SMOKE_FAIL
        if self.smoke is None:
            return None
        return SMOKE_PASS if self.smoke.passed else SMOKE_FAIL


def never_ready(output_lines: Sequence[str]) -> Outcome:
    """A release whose wait failed, with the tail of what it printed (a dying container's last words)."""
    return Outcome(ready=False, why_not_ready="\n".join(list(output_lines)[-NOTE_TAIL_LINES:])[-NOTE_TAIL_CHARS:])


# --- steps: what the rig is to do, in order ---------------------------------------------------------


@dataclass(frozen=True)
class StoreRendering:
    """Keep a verified rendering on the rig for later rollbacks."""

    rendering: Rendering


@dataclass(frozen=True)
class WriteLedger:
    """Write the ledger file with this text."""

    text: str


@dataclass(frozen=True)
class RecordHash:
    """Write the release hash file: the rig runs exactly this verified rendering."""

    rendering_hash: str


@dataclass(frozen=True)
class Prune:
    """Remove images and stored renderings no rollback needs any more."""

    images: tuple[str, ...]
    renderings: tuple[str, ...]


@dataclass(frozen=True)
class Refuse:
    """Fail the rig: a rigkit.errors.PreflightError("release", image, problem, fix)."""

    image: str
    problem: str
    fix: str


Step = Union[StoreRendering, WriteLedger, RecordHash, Prune, Refuse]


@dataclass
class Plan:
    """The steps to carry out and the ledger they leave; ``failed``: the release that needs a rollback."""

    ledger: Ledger
    steps: list[Step] = field(default_factory=list)
    failed: Optional[Release] = None


@dataclass(frozen=True)
class Restore:
    """What a rollback brings up (None: nothing can be), the ledger note saying which rendering that is (none
    when nothing is brought up: nothing is recorded), and a warning for the operator when it is not the stored one."""

    rendering: Optional[Rendering]
    note: str = ""
    warning: str = ""
    # why no rendering can be brought up, when that is not plain "nothing stored, nothing renders"
    refused: str = ""


@dataclass(frozen=True)
class RollBack:
    """Bring ``rendering`` up in place of the failed release; ``note`` goes into its ledger entry."""

    target: Release
    rendering: Rendering
    note: str


# --- decisions ---------------------------------------------------------------------------------------


def joined(*notes: str) -> str:
    return "; ".join(note for note in notes if note)


def entry_of(rendering: Rendering, kind: str, note: str) -> Release:
    """The ledger entry of a rendering brought up (verdict still open)."""
    return Release(
        image=rendering.image,
        profile=rendering.profile,
        knobs_hash=rendering.knobs_hash,
        kind=kind,
        note=note,
        rendering=rendering.hash,
        model=rendering.model,
    )


def verified_steps(ledger: Ledger, rendering: Rendering, store: bool) -> list[Step]:
    """Store (before the ledger names it), write the ledger, then the hash file: last, once all else is on the rig."""
    return ([StoreRendering(rendering)] if store else []) + [WriteLedger(ledger.to_json()), RecordHash(rendering.hash)]


def judge_release(
    ledger: Ledger, released: Rendering, kind: str, note: str, outcome: Outcome, keep_images: int
) -> Plan:
    """A release (deploy, or rollback.py's) was brought up: record it with its verdict; verified (or not
    smoke-checked): store, record and prune; failed: record it, and ``Plan.failed`` asks for a rollback."""
    ledger = copy.deepcopy(ledger)
    ledger.record(entry_of(released, kind, note))
    if not outcome.ready:
        ledger.record_smoke(SMOKE_FAIL, joined(note, f"release never became ready: {outcome.why_not_ready}"))
    elif outcome.smoke is not None:
        ledger.record_smoke(outcome.verdict, joined(note, outcome.smoke.summary()))
    if outcome.verdict == SMOKE_FAIL:
        return Plan(ledger, [WriteLedger(ledger.to_json())], failed=ledger.current)
    prune = Prune(tuple(ledger.images_to_prune(keep_images)), tuple(ledger.renderings_to_prune(keep_images)))
    return Plan(ledger, verified_steps(ledger, released, store=True) + [prune])


def rollback_target(plan: Plan, auto_rollback: bool) -> Optional[Release]:
    """The release an automatic rollback goes back to: the newest verified one other than the failed one."""
    if not auto_rollback or plan.failed is None:
        return None
    return plan.ledger.last_known_good(other_than=plan.failed)


def stored_rendering(
    rendering_hash: Optional[str], texts: Optional[tuple[str, str]]
) -> tuple[Optional[Rendering], str]:
    """The stored rendering from its files' texts (compose.yml, .env), or (None, why it cannot be used)."""
    if not rendering_hash or texts is None:
        return None, STORED_MISSING
    rendering = Rendering(*texts)
    if rendering.hash != rendering_hash:
        return None, f"stored rendering damaged (its files hash to {rendering.hash[:SHORT_DIGEST]})"
    return rendering, ""


def restore(
    target: Release,
    stored_texts: Optional[tuple[str, str]],
    todays: Optional[Rendering],
    undone: Optional[Release] = None,
) -> Restore:
    """What a rollback to ``target`` brings up: its stored rendering, exactly as verified; only when that is
    missing, damaged or of another image, ``todays`` (the image rendered from today's data), said so. Nothing
    when ``todays`` is the rendering of ``undone``, the release the rollback undoes: a settings-only release
    of the same image re-rendered from its own data is that release again, no rollback."""
    rendering, why = stored_rendering(target.rendering, stored_texts)
    if rendering is not None and rendering.image != target.image:
        rendering, why = None, f"the stored rendering {rendering.hash[:SHORT_DIGEST]} is of {rendering.image}"
    if rendering is not None:
        return Restore(rendering, f"restored the verified rendering {rendering.hash[:SHORT_DIGEST]}")
    if todays is not None and undone is not None and todays.hash == undone.rendering:
        if target.rendering:
            unusable = (
                f"the stored rendering {target.rendering[:SHORT_DIGEST]} of {target.image} cannot be used ({why})"
            )
        else:
            unusable = f"{target.image} has no stored rendering (its ledger entry predates them)"
        return Restore(None, refused=f"{unusable} and today's data renders the release being undone itself")
    return Restore(
        todays,
        REPLACEMENT_NOTE.format(why=why),
        warning=f"rollback to {target.image}: {why}; re-rendering it with today's data, "
        "which may differ from what was verified",
    )


def roll_back_or_refuse(
    failed: Release, kind: str, auto_rollback: bool, target: Optional[Release], restored: Optional[Restore]
) -> Union[RollBack, Refuse]:
    """After a failed release: roll back to ``target`` with what ``restore`` picked, or refuse saying why not."""
    if target is None or restored is None or restored.rendering is None:
        if restored is not None and restored.refused:
            why, fix = restored.refused, FIX_NOT_RE_RENDERED
        else:
            why, fix = (
                (
                    "serving_auto_rollback is off"
                    if not auto_rollback
                    else "no known-good release other than this one in the ledger"
                    if target is None
                    else f"{target.image} has no stored rendering and cannot be rendered from the current data"
                ),
                FIX_NOT_ROLLED_BACK,
            )
        return Refuse(failed.image, f"{kind} failed, not rolled back ({why}): {failed.note}", fix)
    return RollBack(target, restored.rendering, joined(f"automatic: {kind} of {failed.image} failed", restored.note))


def judge_rollback(ledger: Ledger, failed: Release, kind: str, rollback: RollBack, outcome: Outcome) -> Plan:
    """An automatic rollback was brought up: record it; the rig then fails either way (the release did),
    saying whether it serves the target again. A rollback whose smoke failed is recorded and its hash
    written, but its rendering is not stored as verified."""
    ledger = copy.deepcopy(ledger)
    ledger.record(entry_of(rollback.rendering, ROLLBACK_KIND, rollback.note))
    if not outcome.ready:
        ledger.record_smoke(
            SMOKE_FAIL,
            f"{rollback.note}; the rollback failed too: {outcome.why_not_ready}"[:ROLLBACK_FAILED_NOTE_CHARS],
        )
        return Plan(
            ledger,
            [
                WriteLedger(ledger.to_json()),
                Refuse(
                    failed.image,
                    f"{kind} failed and the rollback to {rollback.target.image} failed too: "
                    f"{outcome.why_not_ready}; the failure: {failed.note}",
                    FIX_ROLLBACK_FAILED,
                ),
            ],
        )
    if outcome.smoke is not None:
        ledger.record_smoke(outcome.verdict, joined(rollback.note, outcome.smoke.summary()))
    steps = verified_steps(ledger, rollback.rendering, store=outcome.verdict != SMOKE_FAIL)
    return Plan(
        ledger,
        steps
        + [
            Refuse(
                failed.image,
                f"{kind} failed and the rig was rolled back to "
                f"{rollback.target.image} (serving again); the failure: "
                f"{failed.note}",
                FIX_ROLLED_BACK,
            )
        ],
    )
