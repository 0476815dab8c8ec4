"""Rollouts on real lab rigs (`rigkit deploy --canary 1 --batch 1`), from release 1 on every rig (`deployed`):

- a release that never starts on the canary halts the rollout there: every other rig keeps its container,
  its image (release 1) and its ledger, byte for byte;
- release 2 failing only on the second stage (batch 1: one rig's own data adds a vLLM flag that does not exist,
  so vLLM exits at start there and the serving role rolls it back) stops there: the canary serves release 2
  with its cache proven, the last rig is untouched;
- the same rollout re-run with --on-failure rollback continues where the fleet stands (the canary is neither
  deployed nor proven again), halts on the same rig, and rolls the canary back to its release-1 rendering.

Three rigs (the last three of the lab, by position). vLLM starts: ~5 that serve and 3 that fail at start.
The tests run in file order: the third continues the rollout the second left halted. Every rig ends on release 1.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from test_fleet_lab import LAB_INVENTORY, broken_release, ledger, models, rig_exec, serving_image_of  # noqa: F401

from rigkit.fleet.pyinfra_args import rigkit_executable
from rigkit.paths import REPO_ROOT
from rigkit.rollout.summary import MAX_WIDTH
from rigkit.serving.commands import RELEASE_HASH_FILE
from rigkit.serving.render import CONTAINER_NAME

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

NO_SUCH_FLAG = "--rigkit-lab-no-such-flag"
SMOKE_STEP = "serving | Smoke, ledger, prune"


@pytest.fixture(scope="module")
def rigs(lab, deployed):
    if len(lab.rigs) < 3:
        pytest.skip(f"needs 3 rigs, the lab has {len(lab.rigs)}")
    rigs = lab.rigs[-3:]
    release_1 = lab.serving_image["releases"]["1"]
    assert [serving_image_of(rig) for rig in rigs] == [release_1] * 3, "every rig starts on release 1"
    return rigs


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    """The rollout records of this module's runs (kept from one test to the next: the third resumes the second)."""
    return tmp_path_factory.mktemp("rollouts")


@pytest.fixture(scope="module")
def bad_on_batch_1(rigs, tmp_path_factory) -> Path:
    """The lab inventory, with one rig (the second, batch 1) asking vLLM for a flag it does not have."""
    inventory = tmp_path_factory.mktemp("inventory") / "rollout_lab.py"
    inventory.write_text(
        "import runpy as _runpy\n"
        f"lab = [(_name, {{**_data, **({{'extra_engine_args': [{NO_SUCH_FLAG!r}]}} if _name == {rigs[1].name!r} "
        f"else {{}})}}) for _name, _data in _runpy.run_path({str(LAB_INVENTORY)!r})['lab']]\n"
    )
    return inventory


def rollout(inventory, rigs, records: Path, *args: str) -> subprocess.CompletedProcess:
    rigkit = Path(rigkit_executable())
    limits = [arg for rig in rigs for arg in ("--limit", rig.name)]
    return subprocess.run(
        [str(rigkit), "deploy", str(inventory), "--canary", "1", "--batch", "1", *limits, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "RIGKIT_ROLLOUTS_DIR": str(records)},
    )


def summary_of(result: subprocess.CompletedProcess) -> str:
    assert "--> rigkit rollout:" in result.stdout, result.stdout[-6000:] + result.stderr[-3000:]
    summary = result.stdout.rsplit("--> rigkit rollout:", 1)[1]
    assert max(len(line) for line in summary.splitlines()) <= MAX_WIDTH, summary
    return " ".join(summary.split())


def untouched_snapshot(rig) -> tuple[str, str, str, str]:
    """What a rig the rollout never reached must keep: its container, its image, its verified rendering, its ledger."""
    container = rig_exec(rig, f"docker inspect --format '{{{{.Id}}}}' {CONTAINER_NAME}").stdout.strip()
    return (
        container,
        serving_image_of(rig),
        rig_exec(rig, f"cat {RELEASE_HASH_FILE}").stdout.strip(),
        rig_exec(rig, "cat /var/lib/rigkit/ledger.json").stdout,
    )


def verified(rig) -> str:
    return rig_exec(rig, f"cat {RELEASE_HASH_FILE}").stdout.strip()


def test_a_release_that_fails_on_the_canary_leaves_every_other_rig_on_the_old_digest(
    lab, rigs, broken_release, tmp_path
):
    canary, others = rigs[0], rigs[1:]
    release_1 = lab.serving_image["releases"]["1"]
    before = {rig.name: untouched_snapshot(rig) for rig in others}
    result = rollout(LAB_INVENTORY, rigs, tmp_path, "--data", f"serving_image={broken_release}")
    summary = summary_of(result)
    assert result.returncode == 1, summary
    assert "HALTED in canary (1 of 3)" in summary, summary
    assert f'{canary.name} failed at step "{SMOKE_STEP}"' in summary and "rolled back to" in summary, summary
    for rig in others:
        assert f"{rig.name}: not reached, untouched" in summary, summary
        assert untouched_snapshot(rig) == before[rig.name]  # same container, image, rendering and ledger
        assert models(rig) == ["tiny"]
    # the canary rolled itself back: the failed release and the rollback are in its ledger
    assert serving_image_of(canary) == release_1 and models(canary) == ["tiny"]
    failed, back = ledger(canary)[-2:]
    assert (failed["image"], failed["smoke"]) == (broken_release, "fail")
    assert (back["image"], back["kind"], back["smoke"]) == (release_1, "rollback", "pass")


def test_a_release_that_fails_only_on_the_second_batch_stops_there(lab, rigs, bad_on_batch_1, records):
    canary, bad, last = rigs
    release_1, release_2 = lab.serving_image["releases"]["1"], lab.serving_image["releases"]["2"]
    before_last = untouched_snapshot(last)
    result = rollout(bad_on_batch_1, rigs, records, "--data", f"serving_image={release_2}")
    summary = summary_of(result)
    assert result.returncode == 1, summary
    assert "HALTED in batch 1 (2 of 3)" in summary, summary
    assert f'{bad.name} failed at step "{SMOKE_STEP}"' in summary, summary
    assert f"{last.name}: not reached, untouched" in summary, summary
    assert f"{canary.name}: left on the new release" in summary, summary
    assert "cache proof passed: warm-gpu +" in summary and "warm-connector +" in summary, summary
    # the canary serves release 2, verified; the bad rig rolled itself back; the last one never moved
    assert serving_image_of(canary) == release_2 and models(canary) == ["tiny"]
    assert (ledger(canary)[-1]["image"], ledger(canary)[-1]["smoke"]) == (release_2, "pass")
    assert serving_image_of(bad) == release_1 and models(bad) == ["tiny"]
    assert [(e["image"], e["kind"], e["smoke"]) for e in ledger(bad)[-2:]] == [
        (release_2, "deploy", "fail"),
        (release_1, "rollback", "pass"),
    ]
    assert NO_SUCH_FLAG in result.stdout  # vLLM's own refusal reached the operator
    assert untouched_snapshot(last) == before_last


def test_the_rollback_knob_brings_the_upgraded_rigs_back(lab, rigs, bad_on_batch_1, records):
    canary, bad, last = rigs
    release_1, release_2 = lab.serving_image["releases"]["1"], lab.serving_image["releases"]["2"]
    assert serving_image_of(canary) == release_2, "continues the rollout the previous test left halted"
    rendering_before_rollout = next(
        e["rendering"] for e in reversed(ledger(canary)) if e["image"] == release_1 and e["smoke"] == "pass"
    )
    before_last = untouched_snapshot(last)
    result = rollout(bad_on_batch_1, rigs, records, "--data", f"serving_image={release_2}", "--on-failure", "rollback")
    summary = summary_of(result)
    assert result.returncode == 1, summary
    # resumed: the canary that passed is neither deployed nor proven again
    assert f"canary: deploy.py on {canary.name}" not in result.stdout
    assert f"cache proof on {canary.name}" not in result.stdout
    assert "cache proof passed in an earlier run" in summary, summary
    assert "HALTED in batch 1 (2 of 3)" in summary and f"{canary.name}: rolled back" in summary, summary
    # the canary is back on exactly the rendering it verified before the rollout, by digest
    assert serving_image_of(canary) == release_1 and models(canary) == ["tiny"]
    assert verified(canary) == rendering_before_rollout
    assert (ledger(canary)[-1]["kind"], ledger(canary)[-1]["smoke"]) == ("rollback", "pass")
    assert serving_image_of(bad) == release_1 and models(bad) == ["tiny"]
    assert untouched_snapshot(last) == before_last
