"""The gates run together (rigkit.preflight): preflight, engine_preflight, force, refusals."""

import pytest

from rigkit.errors import PreflightError
from rigkit.preflight import Finding, engine_preflight, raise_if_refused, refusals
from rigkit.settings.hostdata import settings_for_host
from tests.preflight.common import LMCACHE, by_check, facts, meminfo_gb, run


def test_clean_h200_passes():
    findings = run({**LMCACHE, "l2_enabled": True})
    assert refusals(findings) == []
    raise_if_refused(findings)
    assert len([f for f in by_check(findings, "gpu") if f.level == "ok"]) == 2


def test_engine_left_for_later_keeps_every_other_gate_and_says_so():
    # a fresh rig: no engine yet, the docker role installs it in this run
    fresh = dict(has_engine=False, compose_command=None, registry_reachable=None)
    later = run(LMCACHE, engine_later=True, **fresh)
    assert refusals(later) == []
    (engine,) = by_check(later, "engine")
    assert engine.level == "ok" and "docker role" in engine.message
    assert by_check(later, "image") == []
    (ram,) = refusals(run(LMCACHE, engine_later=True, meminfo=meminfo_gb(87.9), **fresh))
    assert ram.check == "ram"


def test_engine_preflight_refuses_as_the_full_preflight_does():
    settings = settings_for_host(LMCACHE, variables=[])
    for changes in (dict(has_engine=False), dict(compose_command=None), dict(image_probe_error="manifest unknown")):
        expected = [f for f in refusals(run(LMCACHE, **changes)) if f.check in ("engine", "image")]
        assert expected and refusals(engine_preflight(settings, facts(**changes))) == expected
    assert refusals(engine_preflight(settings, facts(meminfo={}, image_present=True))) == []


@pytest.mark.parametrize(
    "refused,message",
    [
        (1, "ram: first"),
        (2, "ram: first (+1 more refusal(s))"),
        (3, "ram: first (+2 more refusal(s))"),
    ],
)
def test_raise_if_refused_names_the_first_refusal_and_counts_the_others(refused, message):
    first = Finding("refuse", "ram", "l1_size_gb", 60, "first", "set l1_size_gb lower")
    others = [Finding("refuse", "gpu", "gpu_mask", "0", f"other {n}", "other fix") for n in range(refused - 1)]
    passes = [Finding("ok", "l2", "l2_path", "/x", "fine"), Finding("warn", "l2", "l2_path", "/x", "low")]
    with pytest.raises(PreflightError) as caught:
        raise_if_refused([passes[0], first, passes[1], *others])
    error = caught.value
    assert (error.field, error.value, error.problem, error.fix) == ("l1_size_gb", 60, message, "set l1_size_gb lower")
    raise_if_refused(passes)  # warnings and passes alone raise nothing
