"""The `rigkit` command line: one command's broken corner cannot break another."""

from __future__ import annotations

import pytest

from rigkit import cli


@pytest.fixture
def a_command_whose_dependency_is_missing(tmp_path, monkeypatch):
    (tmp_path / "rigkit_broken_command.py").write_text("import rigkit_no_such_dependency  # noqa\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.SUBCOMMANDS, "broken", ("rigkit_broken_command", "needs what is not installed"))


def test_a_command_runs_beside_one_whose_dependency_is_missing(a_command_whose_dependency_is_missing, capsys):
    assert cli.main(["validate", "--url", "ftp://nowhere", "--profile", "native-tiered"]) == 2
    assert "--url=" in capsys.readouterr().err


def test_the_broken_command_itself_still_says_what_is_missing(a_command_whose_dependency_is_missing):
    with pytest.raises(ModuleNotFoundError, match="rigkit_no_such_dependency"):
        cli.main(["broken"])


def test_the_command_list_needs_no_command_module(a_command_whose_dependency_is_missing, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0 and "broken" in capsys.readouterr().out
