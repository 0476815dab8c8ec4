"""The rollout's summary: what happened, stage by stage, and what to do next, wrapped to the terminal."""

from __future__ import annotations

import shutil
import textwrap
from typing import Callable, Mapping, Optional, Sequence

from rigkit.rollout.plan import RolloutSettings, Stage
from rigkit.rollout.stage import StageResult
from rigkit.rollout.state import ReleaseState

# The summary wraps to the terminal, kept between these widths.
MIN_WIDTH, MAX_WIDTH = 80, 120


def summary_width(columns: Optional[int] = None) -> int:
    columns = shutil.get_terminal_size((100, 24)).columns if columns is None else columns
    return max(MIN_WIDTH, min(MAX_WIDTH, columns))


def wrapped(text: str, width: int, indent: str = "  ") -> list[str]:
    return textwrap.wrap(
        " ".join(text.split()),
        width=width,
        initial_indent=indent,
        subsequent_indent=indent + "  ",
        break_long_words=True,
        break_on_hyphens=False,
    ) or [indent]


def command_lines(commands: Sequence[str]) -> list[str]:
    """Commands for the operator, each whole on its own line (never wrapped: it is copied as it stands)."""
    return (
        [
            "By hand (each line is one command; the comment names where to run it):",
            *(f"    {command}" for command in commands),
        ]
        if commands
        else []
    )


def dry_run_text(run: str, stages: Sequence[Stage], routers: Sequence[str], width: int = 100) -> str:
    """What a rollout or a rolling rollback (``run``) would go through, said before its --dry run, which pyinfra
    makes on every targeted rig at once: a stage-by-stage dry run would drain rigs and record a rollout."""
    plan = "; ".join(f"{stage.label}: {', '.join(stage.rigs)}" for stage in stages)
    router = f", each rig out of the router on {', '.join(routers)} meanwhile" if routers else ""
    return "\n".join(
        wrapped(
            f"--> rigkit {run}, dry run: pyinfra --dry shows what each targeted rig would change, "
            f"all at once; no rig is drained, changed or recorded. The {run} would go: {plan}"
            f"{router}.",
            width,
            indent="",
        )
    )


def stage_lines(
    stages: Sequence[Stage],
    results: Sequence[StageResult],
    states: Mapping[str, ReleaseState],
    done_words: Callable[[StageResult, str], str],
    width: int,
    untouched: str = "each serves its old release",
) -> list[str]:
    """Each stage, passed, HALTED or not reached (``untouched``: what its rigs serve), and under a stage that ran
    each of its rigs that did not fail: ``done_words(result, rig)``, then what it serves now."""
    lines: list[str] = []
    done = {result.stage.label: result for result in results}
    for index, stage in enumerate(stages, 1):
        head = f"{stage.label} ({index}/{len(stages)}): {', '.join(stage.rigs)}"
        result = done.get(stage.label)
        if result is None:
            lines += wrapped(f"{head}: not reached, untouched ({untouched})", width, "")
            continue
        lines += wrapped(f"{head}: {'HALTED' if result.failures else 'passed'}", width, "")
        failed = {failure.rig for failure in result.failures}
        lines += [
            line
            for rig in stage.rigs
            if rig not in failed
            for line in wrapped(f"{rig}: {done_words(result, rig)}; now {states[rig].release_words()}", width)
        ]
    return lines


def halt_lines(
    stages: Sequence[Stage], halted: StageResult, states: Mapping[str, ReleaseState], width: int
) -> list[str]:
    """Where it halted, and each rig that failed there: the step, why, and what it serves now."""
    stage = halted.stage
    lines = [""] + wrapped(f"HALTED in {stage.label} ({stages.index(stage) + 1} of {len(stages)}):", width, "")
    for failure in halted.failures:
        lines += wrapped(f'{failure.rig} failed at step "{failure.step}": {failure.why}', width)
        lines += wrapped(f"{failure.rig} now serves: {states[failure.rig].release_words()}", width, "    ")
    return lines


def _deploy_words(settings: RolloutSettings) -> Callable[[StageResult, str], str]:
    def words(result: StageResult, rig: str) -> str:
        what = (
            "already on this release, left alone"
            if rig in result.work.already
            else "upgraded and verified"
            if rig in result.work.deploy
            else "on this release"
        )
        proof = result.proofs.get(rig)
        if proof is not None:
            what += f"; {proof.words}"
        elif result.stage.canary and rig not in result.work.prove and settings.cache_proof:
            what += "; cache proof passed in an earlier run (--recheck-canaries proves it again)"
        return what

    return words


def summary_text(
    headline: str,
    stages: Sequence[Stage],
    results: Sequence[StageResult],
    states: Mapping[str, ReleaseState],
    done_words: Callable[[StageResult, str], str],
    complete: str,
    next_words: str,
    width: int,
    router_lines: Sequence[str] = (),
    halt_notes: Sequence[str] = (),
    commands: Sequence[str] = (),
    untouched: str = "each serves its old release",
) -> str:
    """A run of stages in words: ``headline``, each stage (stage_lines), the router's lines, then ``complete``, or
    where it halted and why (halt_lines), ``halt_notes``, the by-hand ``commands`` and ``next_words``. No line longer
    than ``width`` but the commands (printed whole: rigkit.rollout.drain.RouterDrain.add_back)."""
    lines = [headline]
    lines += stage_lines(stages, results, states, done_words, width, untouched)
    lines += [line for text in router_lines for line in wrapped(text, width)]
    halted = next((result for result in results if result.failures), None)
    if halted is None:
        return "\n".join(lines + [complete])
    lines += halt_lines(stages, halted, states, width)
    lines += [line for text in halt_notes for line in wrapped(text, width)]
    lines += command_lines(commands)
    lines += wrapped(next_words, width, "")
    return "\n".join(lines)


def format_summary(
    settings: RolloutSettings,
    stages: Sequence[Stage],
    results: Sequence[StageResult],
    states: Mapping[str, ReleaseState],
    left: Sequence[tuple[str, str]] = (),
    rollback_lines: Sequence[str] = (),
    width: int = 100,
    router_lines: Sequence[str] = (),
    commands: Sequence[str] = (),
) -> str:
    """What the rollout did, stage by stage, and what to do next (summary_text); after a halt, the rigs it ``left``
    on the new release and why, and what its rollback did (``rollback_lines``)."""
    return summary_text(
        f"--> rigkit rollout: {settings.describe()}",
        stages,
        results,
        states,
        _deploy_words(settings),
        f"rollout complete: {sum(len(s.rigs) for s in stages)} rigs on the new release",
        "Next: fix what the failed rig reports (its own log: docker logs rigkit-serving), then run "
        "the same command again: the rollout continues from where the fleet stands; rigs already "
        "verified on the new release are not deployed again.",
        width,
        router_lines,
        [f"{rig}: {why}" for rig, why in left] + list(rollback_lines),
        commands,
    )
