"""Decode A/B statistics: connector on vs off, interleaved, mean and CV, a verdict.

A heat-soaked rig drifts ~4% in an hour, so the arms are interleaved A/B/A/B rather than
run as two blocks. After every switch to an arm, WARMUP unrecorded runs per prompt kind
precede the recorded one. The verdict follows the user's card: a delta within the CV bands,
or one whose sign flips between prompt kinds, is "no penalty".
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from rigkit.prompts import PROMPT_KINDS

WARMUP_RUNS = 3
MEASURED_RUNS = 5
ARM_ON = "on"
ARM_OFF = "off"

NO_PENALTY = "no penalty"
PENALTY = "penalty"
GAIN = "gain"


@dataclass(frozen=True)
class Step:
    """One request of the schedule."""

    visit: int  # index of the arm switch this step belongs to
    arm: str
    kind: str
    measured: bool


def ab_schedule(
    arms: Sequence[str] = (ARM_ON, ARM_OFF),
    kinds: Sequence[str] = PROMPT_KINDS,
    warmup: int = WARMUP_RUNS,
    measured: int = MEASURED_RUNS,
) -> list[Step]:
    """Interleaved A/B/A/B: `measured` visits per arm, each visit = warm-ups then one recorded run per kind."""
    steps: list[Step] = []
    visit = 0
    for _ in range(measured):
        for arm in arms:
            for kind in kinds:
                steps.extend(Step(visit, arm, kind, False) for _ in range(warmup))
                steps.append(Step(visit, arm, kind, True))
            visit += 1
    return steps


@dataclass(frozen=True)
class Stat:
    n: int
    mean: float
    cv: float  # sample stdev / mean (0 when n < 2)
    samples: tuple[float, ...]

    @property
    def band(self) -> tuple[float, float]:
        return (self.mean * (1 - self.cv), self.mean * (1 + self.cv))


def stat(samples: Iterable[float]) -> Stat:
    values = tuple(float(v) for v in samples)
    if not values:
        return Stat(0, float("nan"), float("nan"), ())
    mean = statistics.fmean(values)
    cv = statistics.stdev(values) / mean if len(values) > 1 and mean else 0.0
    return Stat(len(values), mean, cv, values)


def within_cv_bands(mean_a: float, cv_a: float, mean_b: float, cv_b: float) -> bool:
    """The rule every comparison of two measured figures uses (decode A/B, a replay against its recorded run):
    the figures agree when their CV bands (mean ± mean × CV) overlap, |a − b| ≤ a·CV_a + b·CV_b. Two figures
    with no spread measured (CV 0, e.g. n = 1 or identical samples) agree only when equal."""
    return abs(mean_a - mean_b) <= abs(mean_a) * cv_a + abs(mean_b) * cv_b


CV_BANDS_RULE = "the two figures' CV bands (mean ± mean × CV) overlap: |a − b| ≤ a·CV_a + b·CV_b"


@dataclass(frozen=True)
class KindComparison:
    kind: str
    on: Stat
    off: Stat

    @property
    def delta(self) -> float:
        """on - off, in the unit of the samples (tok/s: positive = the connector is faster)."""
        return self.on.mean - self.off.mean

    @property
    def delta_pct(self) -> float:
        return 100.0 * self.delta / self.off.mean if self.off.mean else float("nan")

    @property
    def within_bands(self) -> bool:
        """The two CV bands overlap: the difference is inside the run-to-run noise."""
        return within_cv_bands(self.on.mean, self.on.cv, self.off.mean, self.off.cv)


@dataclass(frozen=True)
class ABVerdict:
    kinds: tuple[KindComparison, ...]
    verdict: str
    reason: str


def compare(samples: Mapping[str, Mapping[str, Sequence[float]]]) -> ABVerdict:
    """samples[arm][kind] -> decode tok/s of the measured runs; arms ARM_ON and ARM_OFF."""
    kinds = tuple(
        KindComparison(kind, stat(samples[ARM_ON][kind]), stat(samples[ARM_OFF][kind])) for kind in samples[ARM_ON]
    )
    signs = {(c.delta > 0) - (c.delta < 0) for c in kinds if c.delta != 0}
    if all(c.within_bands for c in kinds):
        return ABVerdict(kinds, NO_PENALTY, "every delta lies within the CV bands")
    if len(signs) > 1:
        return ABVerdict(kinds, NO_PENALTY, "the sign of the delta flips between prompt kinds")
    outside = ", ".join(f"{c.kind} {c.delta_pct:+.1f}%" for c in kinds if not c.within_bands)
    if signs == {-1}:
        return ABVerdict(kinds, PENALTY, f"the connector is slower beyond the CV bands ({outside})")
    return ABVerdict(kinds, GAIN, f"the connector is faster beyond the CV bands ({outside})")
