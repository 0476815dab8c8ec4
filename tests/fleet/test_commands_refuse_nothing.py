"""Every rigkit command that takes an inventory refuses, before any host is touched, what would make it succeed at
nothing: an inventory path that is not a file (pyinfra reads it as a host name), an inventory with no hosts, and an
option that means nothing where it stands (issue 43)."""

from __future__ import annotations

import argparse

import pytest

from rigkit.cli import build_parser, main, refuse_options_out_of_place
from rigkit.errors import ConfigError

# Each command taking an inventory, as a user runs it (a later token: one of its own modes).
INVENTORY_COMMANDS = {
    "stage": [],
    "stage --check": ["--check"],
    "deploy": [],
    "deploy --dry": ["--dry"],
    "status": [],
    "validate-shared": [],
    "export --group lab --target kubernetes": ["--group", "lab", "--target", "kubernetes"],
}


def test_every_command_taking_an_inventory_is_held_here():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    taking = {
        name for name, sub in subparsers.choices.items() if any(action.dest == "inventory" for action in sub._actions)
    }
    assert taking == {command.split()[0] for command in INVENTORY_COMMANDS}


def run(command: str, inventory: str, *extra: str) -> int:
    name, *mode = command.split()
    return main([name, inventory, *mode, *extra])


@pytest.mark.parametrize("command", INVENTORY_COMMANDS)
@pytest.mark.parametrize(
    "make, problem",
    [
        (lambda tmp: str(tmp / "missing.py"), "does not exist"),
        (lambda tmp: str(tmp), "is a directory"),
        (lambda tmp: (tmp / "hosts.txt").write_text("rig1\n") and str(tmp / "hosts.txt"), "is not a .py file"),
        (lambda tmp: (tmp / "empty.py").write_text("rigs = []\n") and str(tmp / "empty.py"), "declares no hosts"),
    ],
    ids=["missing", "directory", "not-python", "no-hosts"],
)
def test_an_inventory_that_names_no_host_is_refused_with_a_non_zero_exit(command, make, problem, tmp_path, capsys):
    assert run(command, make(tmp_path)) == 2
    error = capsys.readouterr().err
    assert "inventory=" in error and problem in error and "Fix:" in error, error


def test_a_misspelt_inventory_is_answered_with_the_nearest_file(tmp_path, capsys):
    (tmp_path / "fleet.py").write_text("rigs = ['a']\n")
    assert main(["status", str(tmp_path / "flet.py")]) == 2
    assert f"did you mean {tmp_path / 'fleet.py'}?" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, option",
    [
        (["--deep"], "--deep"),
        (["--check", "--json"], "--json"),
        (["--check", "--from-controller-only"], "--from-controller-only"),
    ],
)
def test_a_stage_option_that_means_nothing_where_it_stands_is_refused(argv, option, tmp_path, capsys):
    assert main(["stage", str(tmp_path / "never-read.py"), *argv]) == 2
    error = capsys.readouterr().err
    assert f"{option}=True: means nothing" in error and "never-read" not in error, error


@pytest.mark.parametrize(
    "given, refused",
    [({"deep": True, "check": True}, False), ({"deep": True, "check": False}, True), ({}, False)],
)
def test_an_option_needing_another_is_refused_only_without_it(given, refused):
    args = argparse.Namespace(**{"deep": False, "check": False, **given})
    if refused:
        with pytest.raises(ConfigError, match="--deep=True: means nothing without --check"):
            refuse_options_out_of_place(args, [("--deep", "--check", True)])
    else:
        refuse_options_out_of_place(args, [("--deep", "--check", True)])


@pytest.mark.parametrize("check", [True, False])
def test_an_option_excluding_another_is_refused_only_with_it(check):
    args = argparse.Namespace(json=True, check=check)
    if check:
        with pytest.raises(ConfigError, match="means nothing with --check"):
            refuse_options_out_of_place(args, [("--json", "--check", False)])
    else:
        refuse_options_out_of_place(args, [("--json", "--check", False)])


def test_stage_with_no_rig_declaring_a_model_is_refused_not_a_silent_success(tmp_path, capsys):
    inventory = tmp_path / "inv.py"
    inventory.write_text("rigs = [('rig1', {'ssh_hostname': '192.0.2.1', 'ssh_password': 'x'})]\n")
    for mode in ([], ["--check"]):
        assert main(["stage", str(inventory), *mode]) == 2
        assert "model_source=None: no targeted rig" in capsys.readouterr().err
