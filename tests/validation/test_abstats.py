"""Decode A/B statistics: schedule shape, mean/CV, and the user's verdict rule."""

import math

import pytest

from rigkit.validation.abstats import ARM_OFF, ARM_ON, GAIN, NO_PENALTY, PENALTY, ab_schedule, compare, stat


def test_schedule_interleaves_arms_and_counts_runs():
    steps = ab_schedule(warmup=3, measured=5)
    visits = []
    for step in steps:
        if not visits or visits[-1][0] != step.visit:
            visits.append((step.visit, step.arm))
    assert [arm for _, arm in visits] == [ARM_ON, ARM_OFF] * 5  # A/B/A/B, never two blocks
    for arm in (ARM_ON, ARM_OFF):
        for kind in ("narrative", "code"):
            mine = [s for s in steps if s.arm == arm and s.kind == kind]
            assert sum(s.measured for s in mine) == 5
            assert sum(not s.measured for s in mine) == 15  # 3 warm-ups after every switch


def test_each_visit_warms_up_before_its_measured_run():
    steps = ab_schedule(warmup=3, measured=2)
    first_visit = [s for s in steps if s.visit == 0 and s.kind == "narrative"]
    assert [s.measured for s in first_visit] == [False, False, False, True]


def test_stat_mean_and_cv():
    s = stat([10.0, 12.0, 14.0])
    assert s.n == 3 and s.mean == pytest.approx(12.0)
    assert s.cv == pytest.approx(2.0 / 12.0)
    assert stat([5.0]).cv == 0.0
    assert math.isnan(stat([]).mean)


def _runs(mean, spread):
    return [mean - spread, mean - spread / 2, mean, mean + spread / 2, mean + spread]


def test_users_card_numbers_are_no_penalty():
    # the second rig's card: narrative 83.8 vs 81.0, code 101.0 vs 104.0, CVs 1.3-3.6%
    samples = {
        ARM_ON: {"narrative": _runs(83.8, 1.4), "code": _runs(101.0, 4.0)},
        ARM_OFF: {"narrative": _runs(81.0, 2.7), "code": _runs(104.0, 4.7)},
    }
    verdict = compare(samples)
    assert verdict.verdict == NO_PENALTY
    narrative = verdict.kinds[0]
    assert narrative.delta_pct == pytest.approx(100 * 2.8 / 81.0)


def test_sign_flip_outside_bands_is_no_penalty():
    samples = {
        ARM_ON: {"narrative": _runs(90.0, 0.1), "code": _runs(95.0, 0.1)},
        ARM_OFF: {"narrative": _runs(80.0, 0.1), "code": _runs(105.0, 0.1)},
    }
    verdict = compare(samples)
    assert not any(k.within_bands for k in verdict.kinds)
    assert verdict.verdict == NO_PENALTY and "flips" in verdict.reason


def test_consistently_slower_beyond_noise_is_a_penalty():
    samples = {
        ARM_ON: {"narrative": _runs(60.0, 0.5), "code": _runs(70.0, 0.5)},
        ARM_OFF: {"narrative": _runs(80.0, 0.5), "code": _runs(100.0, 0.5)},
    }
    verdict = compare(samples)
    assert verdict.verdict == PENALTY
    assert "narrative -25.0%" in verdict.reason


def test_consistently_faster_beyond_noise_is_a_gain():
    samples = {
        ARM_ON: {"narrative": _runs(90.0, 0.5), "code": _runs(110.0, 0.5)},
        ARM_OFF: {"narrative": _runs(80.0, 0.5), "code": _runs(100.0, 0.5)},
    }
    assert compare(samples).verdict == GAIN
