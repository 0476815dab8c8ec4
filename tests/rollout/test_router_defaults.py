"""Safe defaults around the router: a plain `rigkit deploy` (deploy.py or rollback.py) on an inventory with a router
goes one rig at a time, each drained first, unless --all-at-once or --batch 0 says otherwise; the router role on the
controller itself (@local) is refused unless router_on_controller says so, before pyinfra starts and in deploy.py."""

from __future__ import annotations

import argparse

import pytest
from test_rollout_run import NEW, host_data

from rigkit.commands import deploy as deploy_command
from rigkit.errors import ConfigError
from rigkit.fleet import deploy as fleet_deploy_module
from rigkit.fleet import pyinfra_args
from rigkit.rollout import rollback as rollout_rollback
from rigkit.rollout import run as rollout
from rigkit.router import CONTROLLER_HOST, refuse_router_on_controller
from rigkit.settings.defaults import ROUTER_VARIABLES
from rigkit.settings.variables import resolve


def deploy_args(inventory, *argv: str, deploy: str = "deploy.py") -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    deploy_command.add_arguments(parser)
    return deploy_command.own_options_from_remainder(parser.parse_args([str(inventory), "--deploy", deploy, *argv]))


def write_inventory(tmp_path, gateway: str | None = "gw", **gateway_data) -> str:
    """Two rigs with no rollout in their data; with ``gateway``, a router host in front of them."""
    key = tmp_path / "id_lab"
    key.write_text("not a key: nothing connects in these tests\n")
    rigs = [(rig, host_data(rig, NEW, ssh_key=str(key))) for rig in ["rig4", "rig5"]]
    text = f"fleet = {rigs!r}\n"
    if gateway:
        text += f"routers = [({gateway!r}, {dict(ssh_hostname='127.0.0.1', ssh_key=str(key), **gateway_data)!r})]\n"
    path = tmp_path / "inventory.py"
    path.write_text(text)
    return str(path)


@pytest.fixture()
def asked(monkeypatch) -> list:
    """What the rollout and the rolling rollback were asked to run (nothing runs)."""
    runs: list = []
    monkeypatch.setattr(
        rollout,
        "run_rollout",
        lambda inventory, deploy, args, hosts, names, settings, **kw: (
            runs.append(("rollout", names, settings.canary, settings.batch)) or (0, "summary")
        ),
    )
    monkeypatch.setattr(
        rollout_rollback,
        "run_rolling_rollback",
        lambda inventory, args, hosts, names, batch: runs.append(("rollback", names, 0, batch)) or (0, "summary"),
    )
    return runs


@pytest.mark.parametrize("deploy, run", [("deploy.py", "rollout"), ("rollback.py", "rollback")])
def test_a_plain_deploy_behind_a_router_goes_one_rig_at_a_time_and_says_so_first(tmp_path, asked, capsys, deploy, run):
    inventory = write_inventory(tmp_path)
    assert deploy_command.run(deploy_args(inventory, deploy=deploy)) == 0
    assert asked == [(run, ["rig4", "rig5"], 0, 1)]
    said = " ".join(capsys.readouterr().out.split())
    assert (
        "the inventory has a router (on gw): rig4, rig5 go one at a time, each out of the router until its smoke "
        "passed (--batch 1); --all-at-once (or --batch 0) restarts them all at once"
    ) in said


@pytest.mark.parametrize("deploy", ["deploy.py", "rollback.py"])
@pytest.mark.parametrize("explicit", [["--all-at-once"], ["--batch", "0"]])
def test_all_at_once_only_when_said_in_so_many_words(tmp_path, asked, deploy, explicit):
    inventory = write_inventory(tmp_path)
    command = rollout.rollout_command if deploy == "deploy.py" else rollout_rollback.rolling_rollback_command
    assert command(deploy_args(inventory, *explicit, deploy=deploy)) is None  # fleet_deploy runs it
    assert asked == []


def test_without_a_router_a_plain_deploy_stays_one_run(tmp_path, asked):
    assert rollout.rollout_command(deploy_args(write_inventory(tmp_path, gateway=None))) is None
    assert asked == []


def test_a_batch_asked_is_kept(tmp_path, asked):
    assert rollout.rollout_command(deploy_args(write_inventory(tmp_path), "--canary", "1", "--batch", "2")) == 0
    assert asked == [("rollout", ["rig4", "rig5"], 1, 2)]


def test_a_router_that_does_not_answer_under_the_default_names_all_at_once_for_a_first_deploy(tmp_path, monkeypatch):
    def unreachable(*args, **kwargs):
        raise ConfigError(
            "router",
            "http://127.0.0.1:8300",
            "unreachable (ConnectionError) (the rollout drains rigs through it)",
            "check that the router runs on the gateway",
        )

    monkeypatch.setattr(rollout, "run_rollout", unreachable)
    with pytest.raises(ConfigError) as refused:
        rollout.rollout_command(deploy_args(write_inventory(tmp_path)))
    assert "a first deploy, which installs the router, runs every rig at once: pass --all-at-once" in refused.value.fix
    with pytest.raises(ConfigError) as asked_for:  # --batch 1 asked: the refusal as it was
        rollout.rollout_command(deploy_args(write_inventory(tmp_path), "--batch", "1"))
    assert "--all-at-once" not in asked_for.value.fix


# --- the router role on the controller ---------------------------------------------------------------------------


def test_the_router_role_on_the_controller_is_refused_unless_asked_for():
    with pytest.raises(ConfigError) as refused:
        refuse_router_on_controller(CONTROLLER_HOST, resolve(ROUTER_VARIABLES, {}))
    assert refused.value.field == "router_on_controller"
    assert "install vllm-router, its systemd unit and files under /etc and /usr/local on this machine" in str(
        refused.value
    )
    assert "router_on_controller: true" in refused.value.fix
    refuse_router_on_controller(CONTROLLER_HOST, resolve(ROUTER_VARIABLES, {"router_on_controller": True}))
    refuse_router_on_controller("gw", resolve(ROUTER_VARIABLES, {}))


def test_rigkit_deploy_refuses_it_before_pyinfra_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pyinfra_args, "run_pyinfra_streaming", lambda argv: pytest.fail("pyinfra started"))
    inventory = write_inventory(tmp_path, gateway=CONTROLLER_HOST)
    assert deploy_command.run(deploy_args(inventory, "--all-at-once")) == 2
    err = capsys.readouterr().err
    assert "refused before any rig was touched: router_on_controller=False: @local is the controller itself" in err


def test_rigkit_deploy_runs_it_when_asked_for(tmp_path, monkeypatch):
    ran: list = []
    monkeypatch.setattr(pyinfra_args, "run_pyinfra_streaming", lambda argv: ran.append(argv) or (0, ""))
    monkeypatch.setattr(fleet_deploy_module, "read_release", lambda name, data: "")
    inventory = write_inventory(tmp_path, gateway=CONTROLLER_HOST, router_on_controller=True)
    deploy_command.run(deploy_args(inventory, "--all-at-once"))
    assert len(ran) == 1


def test_a_rolling_run_says_the_router_host_it_leaves_and_the_run_that_deploys_it(tmp_path, asked, capsys):
    inventory = write_inventory(tmp_path)
    rollout.rollout_command(deploy_args(inventory))
    said = " ".join(capsys.readouterr().out.split())
    assert (
        f"the router's host gw is not deployed by a rolling run (rigs only): `rigkit deploy {inventory} --limit gw`"
        in said
    )
    rollout.rollout_command(deploy_args(inventory, "--limit", "rig4"))  # the gateway not targeted: nothing to say
    assert "not deployed by a rolling run" not in capsys.readouterr().out


def test_a_router_run_by_hand_on_the_controller_is_no_host_to_deploy(tmp_path, asked, capsys):
    rollout.rollout_command(deploy_args(write_inventory(tmp_path, gateway=CONTROLLER_HOST)))
    assert "not deployed by a rolling run" not in capsys.readouterr().out
    rollout.rollout_command(deploy_args(write_inventory(tmp_path, gateway=CONTROLLER_HOST, router_on_controller=True)))
    assert "the router's host @local is not deployed by a rolling run" in " ".join(capsys.readouterr().out.split())
