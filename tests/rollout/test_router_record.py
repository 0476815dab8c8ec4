"""The router a rig was last deployed behind (rigkit.rollout.router_record, issue 43): with the lab's router serving,
`rigkit deploy inventory/lab.py` (no router declared) restarted both rigs at once and 276 of 322 requests failed,
with no warning. The rigs' own record now stops such a run unless told --all-at-once."""

from __future__ import annotations

import pytest
from test_router_defaults import deploy_args, write_inventory

from rigkit.commands import deploy as deploy_command
from rigkit.errors import ConfigError
from rigkit.fleet import deploy as fleet_deploy_module
from rigkit.fleet import pyinfra_args
from rigkit.rollout import router_record
from rigkit.rollout.router_record import (
    RouterRecord,
    inventory_record,
    refuse_taking_a_whole_router_down,
    whole_routers,
)

BEHIND_GW = RouterRecord(("gw",), ("rig4", "rig5"))


def test_the_record_is_written_and_read_back_and_a_damaged_one_is_no_record():
    assert RouterRecord.parse(BEHIND_GW.text()) == BEHIND_GW
    for damaged in ("", "{", '{"gateways": ["gw"]}', "[1, 2]", "null"):
        assert RouterRecord.parse(damaged) is None, damaged


def test_an_inventory_records_its_gateways_and_every_rig_they_route_to_and_one_without_a_router_nothing():
    groups = {"rig4": ["fleet"], "gw": ["routers"], "store": ["kv_stores"], "rig5": ["fleet"]}
    assert inventory_record(groups) == RouterRecord(("gw",), ("rig4", "rig5"))
    assert inventory_record({"rig4": ["fleet"], "rig5": ["fleet"]}) is None


@pytest.mark.parametrize(
    ("targeted", "refused"),
    [
        (["rig4", "rig5"], True),  # every rig of the router at once
        (["rig4", "rig5", "rig6"], True),  # and more
        (["rig4"], False),  # rig5 keeps serving through it
        (["rig5", "rig6"], False),
    ],
)
def test_a_run_is_refused_only_when_it_targets_every_rig_of_a_recorded_router(targeted, refused):
    records = {rig: BEHIND_GW for rig in targeted if rig in BEHIND_GW.rigs}
    assert (whole_routers(records, targeted) == [BEHIND_GW]) is refused
    if not refused:
        refuse_taking_a_whole_router_down(records, targeted)
        return
    with pytest.raises(ConfigError) as refusal:
        refuse_taking_a_whole_router_down(records, targeted)
    assert str(refusal.value) == (
        "--all-at-once=False: rig4, rig5 were last deployed behind the router on gw, and this run restarts all of them "
        "at once: every request through that router fails until one serves again. Fix: deploy through the inventory "
        "that declares the router (one rig at a time, each drained), --limit fewer rigs, or pass --all-at-once to "
        "restart them together anyway"
    )


@pytest.fixture()
def pyinfra_runs(monkeypatch) -> list:
    runs: list = []
    monkeypatch.setattr(pyinfra_args, "run_pyinfra_streaming", lambda argv: runs.append(argv) or (0, ""))
    monkeypatch.setattr(fleet_deploy_module, "read_release", lambda name, data: "")
    monkeypatch.setattr(fleet_deploy_module, "stage_inventory", lambda hosts, names: [])
    return runs


@pytest.mark.parametrize("deploy", ["deploy.py", "rollback.py"])
def test_rigkit_deploy_without_a_router_stops_before_restarting_every_rig_of_the_recorded_one(
    tmp_path, monkeypatch, capsys, pyinfra_runs, deploy
):
    monkeypatch.setattr(router_record, "read_record", lambda name, data: BEHIND_GW)
    inventory = write_inventory(tmp_path, gateway=None)
    assert deploy_command.run(deploy_args(inventory, deploy=deploy)) == 2
    assert pyinfra_runs == []
    assert (
        "refused before any rig was touched: --all-at-once=False: rig4, rig5 were last deployed behind the router"
        in (capsys.readouterr().err)
    )
    # pyinfra is faked: it reports no rig, so these runs exit 1 (not completed), never 2 (refused)
    deploy_command.run(deploy_args(inventory, "--all-at-once", deploy=deploy))
    assert len(pyinfra_runs) == 1
    deploy_command.run(deploy_args(inventory, "--limit", "rig4", deploy=deploy))  # rig5 keeps serving
    assert len(pyinfra_runs) == 2
    deploy_command.run(deploy_args(inventory, "--dry", deploy=deploy))  # nothing restarts
    assert len(pyinfra_runs) == 3


def test_rigs_never_deployed_behind_a_router_deploy_as_before(tmp_path, monkeypatch, pyinfra_runs):
    monkeypatch.setattr(router_record, "read_record", lambda name, data: None)
    assert deploy_command.run(deploy_args(write_inventory(tmp_path, gateway=None))) != 2
    assert len(pyinfra_runs) == 1
