"""rigkit.rollout.run: rigkit deploy's options read after the inventory, then the whole rollout over four rigs whose pyinfra runs answer
with real captured output (tests/fixtures/fleet/rig-stopped-mid-deploy.txt: rig4 and rig5 deployed, rig6 failed).
The parts have their own tests: test_rollout_plan, _state, _record, _stage, _proof, _summary, _drain."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rigkit.commands import deploy as deploy_command
from rigkit.fleet import outcome as fleet_outcome
from rigkit.fleet import pyinfra_args
from rigkit.fleet.pyinfra_args import data_pairs
from rigkit.rollout import run as rollout
from rigkit.rollout.plan import ROLLOUT_STEP_ENV, RolloutSettings
from rigkit.rollout.proof import Proof
from rigkit.rollout.record import RolloutRecord, record_path
from rigkit.rollout.state import ReleaseState
from rigkit.serving.commands import rendering_for
from rigkit.settings.hostdata import rig_settings

FLEET_FIXTURES = Path(__file__).parents[1] / "fixtures" / "fleet"
STOPPED_MID_DEPLOY = (FLEET_FIXTURES / "rig-stopped-mid-deploy.txt").read_text()  # rig4, rig5 ok; rig6 failed
ROLLED_BACK = (FLEET_FIXTURES / "release-rolled-back.txt").read_text()  # rig4: never ready, rolled back
OLD = "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64
NEW = "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "2" * 64
RIGS = ["rig4", "rig5", "rig6", "rig7"]


def host_data(rig: str, image: str, **extra) -> dict:
    return {
        "serving_profile": "cpu-lab",
        "serving_image": image,
        "serving_port": 8100 + int(rig[3:]),
        "ssh_hostname": "127.0.0.1",
        "ssh_port": 2200 + int(rig[3:]),
        "_sudo": False,
        **extra,
    }


def rendering_hash(rig: str, image: str) -> str:
    return rendering_for(rig_settings(host_data(rig, image)).stack).hash


def test_rigkit_deploy_options_are_read_after_the_inventory_too():
    parser = argparse.ArgumentParser()
    deploy_command.add_arguments(parser)
    args = deploy_command.own_options_from_remainder(
        parser.parse_args(
            ["inv.py", "--limit", "rig4", "--canary", "1", "--data", "a=b", "--batch", "2", "--deploy", "rollback.py"]
        )
    )
    assert (args.canary, args.batch, args.deploy) == (1, 2, "rollback.py")
    assert args.pyinfra_args == ["--limit", "rig4", "--data", "a=b"]
    assert data_pairs(args.pyinfra_args) == ["a=b"]


# --- the whole rollout with fake rigs: real pyinfra output, real renderings -----------------------------------------


class FakeFleet:
    """Rigs as their verified rendering; a pyinfra run answers with the captured 3-rig output, and each rig it
    reports ok is then on the rendering of the deploy's image (rollback.py: back to the one before)."""

    def __init__(self, monkeypatch, output: str = STOPPED_MID_DEPLOY, kill_in: str = ""):
        self.verified = {rig: rendering_hash(rig, OLD) for rig in RIGS}
        self.runs: list[tuple[str, list[str]]] = []
        self.proved: list[str] = []
        self.output, self.kill_in = output, kill_in
        monkeypatch.setattr(pyinfra_args, "run_pyinfra_streaming", self.pyinfra)
        # patched where the runner looks them up (it imports them from rollout_state and rollout_proof)
        monkeypatch.setattr(rollout, "read_states", self.read)
        monkeypatch.setattr(rollout, "prove_rig", self.prove)

    def pyinfra(self, argv: list[str]):
        import os

        assert os.environ.get(ROLLOUT_STEP_ENV), "every pyinfra run is marked as driven by rigkit deploy"
        rigs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--limit"]
        deploy = argv[-1]
        self.runs.append((deploy, rigs))
        outcomes = fleet_outcome.summarize(self.output, rigs)
        for rig in rigs:
            if outcomes[rig].status == fleet_outcome.OK:
                self.verified[rig] = rendering_hash(rig, OLD if deploy == "rollback.py" else NEW)
        if self.kill_in and self.kill_in in rigs:
            raise KeyboardInterrupt  # the controller is killed once the batch's rigs are upgraded
        return 0, self.output

    def read(self, hosts, rigs):
        return {rig: ReleaseState(self.verified[rig]) for rig in rigs}

    def prove(self, rig, data, stack):
        self.proved.append(rig)
        return Proof(True, "cache proof passed (fake)")

    def deployed(self) -> list[str]:
        return [rig for deploy, rigs in self.runs if deploy == "deploy.py" for rig in rigs]


def roll(tmp_path, on_failure="leave", recheck=False):
    hosts = {rig: {"data": host_data(rig, NEW)} for rig in RIGS}
    settings = RolloutSettings(canary=1, batch=1, on_failure=on_failure, cache_proof=True)
    return rollout.run_rollout(
        "inventory/fleet.py",
        "deploy.py",
        ["--data", f"serving_image={NEW}"],
        hosts,
        RIGS,
        settings,
        recheck_canaries=recheck,
        records=tmp_path,
    )


def test_a_failure_in_the_second_batch_halts_there_and_the_rest_is_untouched(monkeypatch, tmp_path):
    fake = FakeFleet(monkeypatch)
    status, summary = roll(tmp_path)
    assert status == 1
    assert fake.runs == [("deploy.py", ["rig4"]), ("deploy.py", ["rig5"]), ("deploy.py", ["rig6"])]
    assert fake.proved == ["rig4"]
    assert fake.verified["rig7"] == rendering_hash("rig7", OLD)  # never in a run
    assert fake.verified["rig4"] == rendering_hash("rig4", NEW)  # left for the operator (the knob's default)
    flat = " ".join(summary.split())
    assert "HALTED in batch 2 (3 of 4)" in flat and "rig6 failed at step" in flat
    assert "batch 3 (4/4): rig7: not reached, untouched" in flat
    assert "rig4: left on the new release" in flat and "rig5: left on the new release" in flat


def test_the_rollback_knob_brings_the_upgraded_rigs_back(monkeypatch, tmp_path):
    fake = FakeFleet(monkeypatch)
    status, summary = roll(tmp_path, on_failure="rollback")
    assert status == 1 and fake.runs[-1] == ("rollback.py", ["rig4", "rig5"])
    assert all(fake.verified[rig] == rendering_hash(rig, OLD) for rig in RIGS)
    assert "rig4: rolled back" in summary and "rig5: rolled back" in summary
    # the re-run deploys the rolled-back canary again and proves it again
    roll(tmp_path, on_failure="rollback")
    assert fake.runs[4] == ("deploy.py", ["rig4"]) and fake.proved == ["rig4", "rig4"]


def test_a_killed_rollout_continues_where_the_fleet_stands(monkeypatch, tmp_path):
    fake = FakeFleet(monkeypatch, kill_in="rig5")
    with pytest.raises(KeyboardInterrupt):
        roll(tmp_path)
    assert fake.deployed() == ["rig4", "rig5"] and fake.proved == ["rig4"]
    # the re-run's rigs deploy fine: the capture's two good rigs renamed (its failed one is now rig8)
    fake.output = STOPPED_MID_DEPLOY.replace("rig6", "rig8").replace("rig4", "rig6").replace("rig5", "rig7")
    fake.kill_in = ""
    status, summary = roll(tmp_path)
    assert status == 0, summary
    assert fake.deployed() == ["rig4", "rig5", "rig6", "rig7"]  # neither the canary nor rig5 again
    assert fake.proved == ["rig4"]
    assert "cache proof passed in an earlier run" in summary and "rollout complete" in summary
    record = RolloutRecord.from_json(record_path("inventory/fleet.py", tmp_path).read_text())
    assert record.upgraded == RIGS and record.proven == ["rig4"]
    fake.output = STOPPED_MID_DEPLOY
    status, _ = roll(tmp_path, recheck=True)  # asked: the canary is deployed and proven again
    assert status == 0
    assert fake.deployed()[-1:] == ["rig4"] and fake.proved == ["rig4", "rig4"]


def test_a_canary_that_fails_its_release_halts_before_any_other_rig_and_is_not_proven(monkeypatch, tmp_path):
    fake = FakeFleet(monkeypatch, output=ROLLED_BACK)  # rig4: never ready, rolled back by the serving role
    status, summary = roll(tmp_path, on_failure="rollback")
    assert status == 1 and fake.runs == [("deploy.py", ["rig4"])] and fake.proved == []
    assert all(fake.verified[rig] == rendering_hash(rig, OLD) for rig in RIGS)
    flat = " ".join(summary.split())
    assert "HALTED in canary (1 of 4)" in flat and "never became ready" in flat
    assert "batch 1 (2/4): rig5: not reached, untouched" in flat
