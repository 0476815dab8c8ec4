"""A fresh rig in one command (issue 43): its default model store is on the L2 NVMe, which the l2_disk role mounts
during the deploy, so `rigkit deploy` refused to stage ("nothing is mounted at ... yet ... deploy the rig once without
model_source"). Now it runs deploy.py's roles up to the store's disk on those rigs first, then stages, then deploys."""

from __future__ import annotations

import os

import pytest

from rigkit.errors import ConfigError, RigkitError
from rigkit.fleet import deploy as fleet_deploy_module
from rigkit.fleet import pyinfra_args
from rigkit.fleet.provision import DEPLOY_UNTIL_ENV, STORE_ROLES_UNTIL, roles_until
from roles import PIPELINE

INVENTORY = "inventory/fleet.py"


def test_deploy_py_runs_every_role_or_only_those_up_to_the_one_named():
    assert roles_until(PIPELINE, {}) == PIPELINE
    assert roles_until(PIPELINE, {DEPLOY_UNTIL_ENV: STORE_ROLES_UNTIL}) == PIPELINE[: PIPELINE.index("l2_disk") + 1]
    assert roles_until(PIPELINE, {DEPLOY_UNTIL_ENV: "serving"}) == PIPELINE
    with pytest.raises(ConfigError) as refused:
        roles_until(PIPELINE, {DEPLOY_UNTIL_ENV: "l2disk"})
    assert refused.value.field == DEPLOY_UNTIL_ENV and "no role of the pipeline" in refused.value.problem


def test_the_store_roles_are_the_pipelines_own_and_end_with_the_disk_mounted():
    provisioning = roles_until(PIPELINE, {DEPLOY_UNTIL_ENV: STORE_ROLES_UNTIL})
    assert provisioning[0] == "rig_lock" and provisioning[-1] == "l2_disk" and "serving" not in provisioning


@pytest.fixture()
def steps(monkeypatch) -> list:
    """What fleet_deploy ran, in order: pyinfra (with the roles it was told to stop after) and the staging."""
    done: list = []
    monkeypatch.setattr(
        pyinfra_args,
        "run_pyinfra_streaming",
        lambda argv: done.append(("pyinfra", os.environ.get(DEPLOY_UNTIL_ENV), argv)) or (0, ""),
    )
    monkeypatch.setattr(fleet_deploy_module, "stage_inventory", lambda hosts, names: done.append(("stage", names)))
    monkeypatch.setattr(fleet_deploy_module, "read_release", lambda name, data: "")
    return done


class Targets:
    inventory = INVENTORY
    names = ["rig4", "rig5"]
    hosts = {name: {"groups": ["fleet"], "data": {}} for name in names}

    def data(self, name):
        return {}


def test_a_fresh_rigs_store_gets_its_disk_before_staging_then_the_whole_deploy_runs(monkeypatch, steps, capsys):
    monkeypatch.setattr(fleet_deploy_module, "rigs_awaiting_store_mount", lambda hosts, names: ["rig5"])
    fleet_deploy_module.fleet_deploy(Targets(), "deploy.py", ["--limit", "rig4", "--limit", "rig5", "-v"])
    [(first, until, argv), stage, (last, whole, deploy_argv)] = steps
    assert (first, until) == ("pyinfra", STORE_ROLES_UNTIL)
    assert argv[-2:] == [INVENTORY, "deploy.py"] and "-v" in argv
    assert [argv[i + 1] for i, arg in enumerate(argv) if arg == "--limit"] == ["rig5"]  # only the fresh rig
    assert stage == ("stage", ["rig4", "rig5"])
    assert (last, whole) == ("pyinfra", None) and deploy_argv[-1] == "deploy.py"
    assert DEPLOY_UNTIL_ENV not in os.environ
    assert "rig5: the model store is on the L2 disk, not mounted yet (a fresh rig)" in capsys.readouterr().out


def test_rigs_whose_store_is_ready_are_deployed_as_before(monkeypatch, steps):
    monkeypatch.setattr(fleet_deploy_module, "rigs_awaiting_store_mount", lambda hosts, names: [])
    fleet_deploy_module.fleet_deploy(Targets(), "deploy.py", [])
    assert [step[0] for step in steps] == ["stage", "pyinfra"]


def test_a_failed_provisioning_run_stages_nothing_and_releases_nothing(monkeypatch, steps):
    monkeypatch.setattr(fleet_deploy_module, "rigs_awaiting_store_mount", lambda hosts, names: ["rig4", "rig5"])
    monkeypatch.setattr(pyinfra_args, "run_pyinfra_streaming", lambda argv: steps.append(("pyinfra",)) or (1, ""))
    with pytest.raises(RigkitError) as refused:
        fleet_deploy_module.fleet_deploy(Targets(), "deploy.py", [])
    assert steps == [("pyinfra",)]
    assert (refused.value.field, refused.value.value) == ("model_store_path", "rig4, rig5")
    assert DEPLOY_UNTIL_ENV not in os.environ
