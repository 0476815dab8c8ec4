"""A replay (`validate.py --data replay=results/<run-id>`) against the run it repeats: which settings differ
between the recorded rigs and the new ones, and, per measured figure, whether the new rig reproduces it.

Verdict rule (declared once, in rigkit.validation.abstats.within_cv_bands, and said in the card's legend): a new rig's
figure reproduces the recorded one when their CV bands overlap; the recorded side pools the samples of every
recorded rig. Settings are compared as the card shows them (RAM in GB to one decimal, GPU models counted), so
a difference the card cannot show is not called one.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Optional, Sequence

from rigkit.validation.abstats import CV_BANDS_RULE, within_cv_bands
from rigkit.validation.card.figures import Figure, judged_figures
from rigkit.validation.card.schema import (
    FigureVerdict,
    RecordedRig,
    ReplayComparison,
    Reproducibility,
    RigCard,
    SetupDifference,
    StatModel,
)
from rigkit.validation.card.text import NOT_READ, fmt_bytes, fmt_power_limit_declared, fmt_power_limits

MISSING = "—"
VERDICT_MARKS = {"reproduces": "✓", "differs": "✗", "not compared": "·"}
RULE = (
    f"a figure of this run reproduces the recorded one when {CV_BANDS_RULE} (the recorded rigs' samples "
    "pooled; n = 1 or identical samples leave no band, and then only an equal figure reproduces), else it differs"
)


def recorded_date(card: RigCard) -> str:
    return card.created_at[:10]


def recorded_title(card: RigCard) -> str:
    """A recorded rig's column title: marked as recorded, with its date."""
    return f"{card.rig} (recorded {recorded_date(card)})"


def _gpus(models: Sequence[str]) -> str:
    if not models:
        return "none (CPU)"
    return ", ".join(f"{n} × {model}" if n > 1 else model for model, n in Counter(models).items())


def _knob(value: object) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)


def setup_of(repro: Reproducibility) -> dict[str, str]:
    """Every setting a card records, by the name a setup difference is called, as the card shows it."""

    def shown(value: object) -> str:
        return MISSING if value in (None, "") else str(value)

    settings = {
        "image digest": shown(repro.image_digest),
        "model": shown(repro.model_source),
        "profile": shown(repro.profile),
        "rigkit version": shown(repro.rigkit_version),
    }
    settings.update({f"knob {name}": _knob(value) for name, value in sorted(repro.knobs.items())})
    settings.update(
        {
            "prompts": "; ".join(f"{p.kind} {p.target_tokens} tok seed {p.seed}" for p in repro.prompts) or MISSING,
            "output tokens": shown(repro.output_tokens),
            "driver": shown(repro.driver_version),
            "CUDA": shown(repro.cuda_version),
            "GPU model": _gpus(repro.gpu_models) if repro.machine_read else NOT_READ,
            "power limit declared": fmt_power_limit_declared(repro.power_limit_declared_w),
            "power limit enforced": fmt_power_limits(repro.power_limits_enforced_w),
            "host RAM": fmt_bytes(repro.host_ram_bytes) if repro.host_ram_bytes else MISSING,
            "L2 device": shown(repro.l2_device),
            "L2 filesystem": shown(repro.l2_filesystem),
            "L2 integrity": shown(repro.l2_integrity),
            "KV pool": (
                f"{repro.num_gpu_blocks} blocks × {repro.block_size} tokens" if repro.num_gpu_blocks else MISSING
            ),
            "max model len": shown(repro.max_model_len),
        }
    )
    return settings


def setup_differences(recorded: Sequence[RigCard], new: Sequence[RigCard]) -> list[SetupDifference]:
    """Each setting whose value is not the same on every rig, recorded and new (a knob set on one side only
    reads "—" on the other); the same everywhere = not listed."""
    before = {c.rig: setup_of(c.repro) for c in recorded}
    after = {c.rig: setup_of(c.repro) for c in new}
    names = list(dict.fromkeys(name for rig in (*before.values(), *after.values()) for name in rig))
    differences = []
    for name in names:
        old = {rig: values.get(name, MISSING) for rig, values in before.items()}
        now = {rig: values.get(name, MISSING) for rig, values in after.items()}
        if len({*old.values(), *now.values()}) > 1:
            differences.append(SetupDifference(setting=name, recorded=old, new=now))
    return differences


def pooled(stats: Sequence[Optional[StatModel]]) -> StatModel:
    return StatModel.of([v for s in stats if s is not None for v in s.samples])


def fmt_change(figure: Figure, delta: float, pct: Optional[float]) -> str:
    """This run − recorded, in the figure's unit and relative to the recorded mean."""
    sign = "+" if delta >= 0 else "-"
    return f"{sign}{figure.amount(abs(delta))}" + (f" ({pct:+.1f} %)" if pct is not None else "")


def judge(figure: Figure, recorded: StatModel, rig: str, new: Optional[StatModel]) -> FigureVerdict:
    """One figure of one new rig against the recorded run, by RULE."""
    common = dict(figure=figure.key, title=figure.title, rig=rig, recorded=recorded, new=new)
    if not recorded.n or new is None or not new.n:
        missing = "the recorded run" if not recorded.n else rig
        return FigureVerdict(**common, verdict="not compared", text=f"not compared: not measured on {missing}")
    delta = new.mean - recorded.mean
    pct = 100 * delta / recorded.mean if recorded.mean else None
    change = fmt_change(figure, delta, pct)
    bands = (
        f"bands ±{figure.amount(abs(recorded.mean) * (recorded.cv or 0))} recorded (n={recorded.n}), "
        f"±{figure.amount(abs(new.mean) * (new.cv or 0))} {rig} (n={new.n})"
    )
    if within_cv_bands(recorded.mean, recorded.cv or 0, new.mean, new.cv or 0):
        return FigureVerdict(
            **common, delta=delta, delta_pct=pct, verdict="reproduces", text=f"reproduces: {change}, inside the {bands}"
        )
    return FigureVerdict(
        **common, delta=delta, delta_pct=pct, verdict="differs", text=f"differs by {change}, beyond the {bands}"
    )


def compare(recorded: Sequence[RigCard], new: Sequence[RigCard]) -> ReplayComparison:
    """This run's rigs against the recorded run they replay: setup differences and a verdict per figure."""
    verdicts = [
        judge(figure, pooled([figure.read(c) for c in recorded]), card.rig, figure.read(card))
        for figure in judged_figures([*recorded, *new])
        for card in new
    ]
    return ReplayComparison(
        run_id=new[0].run_id if new else "?",
        recorded_run=recorded[0].run_id if recorded else "?",
        recorded=[RecordedRig(rig=c.rig, run_id=c.run_id, created_at=c.created_at, passed=c.passed) for c in recorded],
        rigs=[c.rig for c in new],
        rule=RULE,
        setup_differences=setup_differences(recorded, new),
        figures=verdicts,
    )


def fmt_setup_value(values: dict[str, str]) -> str:
    """ "value (rig1, rig3); other (rig2)": rigs grouped by their value."""
    groups: dict[str, list[str]] = {}
    for rig, value in values.items():
        groups.setdefault(value, []).append(rig)
    return "; ".join(f"{value} ({', '.join(rigs)})" for value, rigs in groups.items()) or MISSING


def summary_lines(comparison: ReplayComparison) -> list[str]:
    """The replay in a few terminal lines: what reproduced, what differs and by how much, which settings differ."""
    recorded = ", ".join(f"{r.rig} recorded {r.created_at[:10]}" for r in comparison.recorded)
    lines = [
        f"replay of run {comparison.recorded_run} ({recorded}): {comparison.count('reproduces')} figures "
        f"reproduce, {comparison.count('differs')} differ, {comparison.count('not compared')} not compared"
    ]
    lines += [f"  ✗ {f.rig} {f.title}: {f.text}" for f in comparison.figures if f.verdict == "differs"]
    if comparison.setup_differences:
        lines.append("  setup differs in: " + ", ".join(d.setting for d in comparison.setup_differences))
    else:
        lines.append("  setup: the same on every rig")
    return lines
