"""The operations' facts in one round trip per stage (rigkit.facts.surveyed), on this machine's real shell through
pyinfra's local connector: what is served, when the picture is read again, and when it ends."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra.facts.files import File, FileContents, Sha1File

from rigkit.facts.batch import FactSpec, facts_now
from rigkit.facts.surveyed import OperationFacts, put_reads


@pytest.fixture()
def watched(local_host, monkeypatch):
    """The local host with its connector's commands counted (each one is a round trip on a rig)."""
    commands = []
    real = local_host.connector.run_shell_command

    def run_shell_command(command, *args, **kwargs):
        commands.append(command)
        return real(command, *args, **kwargs)

    monkeypatch.setattr(local_host.connector, "run_shell_command", run_shell_command)
    monkeypatch.setattr(local_host, "in_op", True)  # as inside an operation's command generator
    return local_host, commands


def served(host, tmp_path: Path) -> tuple[OperationFacts, str]:
    path = str(tmp_path / "managed.conf")
    Path(path).write_text("v1\n")
    declared = [*put_reads(path), FactSpec.of(FileContents, path=path)]
    return OperationFacts(host, declared).install(), path


def test_an_operations_declared_facts_come_in_one_round_trip(watched, tmp_path):
    host, commands = watched
    facts, path = served(host, tmp_path)
    assert host.get_fact(FileContents, path=path) == ["v1"]
    assert host.get_fact(File, path=path)["size"] == 3
    assert host.get_fact(Sha1File, path=path)
    assert len(commands) == 1 and facts.batches == 1


def test_a_stage_reads_the_rig_anew_so_a_change_after_the_survey_is_seen(watched, tmp_path):
    host, commands = watched
    facts, path = served(host, tmp_path)
    assert host.get_fact(FileContents, path=path) == ["v1"]  # prepare (--dry)
    Path(path).write_text("changed by someone\n")
    host.state.is_executing = True
    assert host.get_fact(FileContents, path=path) == ["changed by someone"]
    assert facts.batches == 2 and len(commands) == 2


def test_a_command_ends_the_picture_every_later_read_is_live(watched, tmp_path):
    host, commands = watched
    host.state.is_executing = True
    facts, path = served(host, tmp_path)
    assert host.get_fact(FileContents, path=path) == ["v1"]
    host.run_shell_command(f"echo v2 > {path}")  # an operation's command
    assert host.get_fact(FileContents, path=path) == ["v2"]
    assert host.get_fact(FileContents, path=path) == ["v2"]
    assert facts.batches == 1 and len(commands) == 4  # batch, the command, two live reads


def test_reads_outside_an_operation_and_undeclared_facts_are_pyinfras_own(watched, tmp_path):
    host, commands = watched
    facts, path = served(host, tmp_path)
    other = str(tmp_path / "other")
    Path(other).write_text("x\n")
    assert host.get_fact(FileContents, path=other) == ["x"]  # not declared
    assert host.get_fact(FileContents, path=path, _sudo=False) == ["v1"]  # global arguments
    host.in_op = False  # the deploy code's own read (the survey)
    assert host.get_fact(FileContents, path=path) == ["v1"]
    assert facts.batches == 0 and len(commands) == 3


def test_facts_now_inside_an_operation_takes_declared_facts_from_the_picture(watched, tmp_path):
    host, commands = watched
    facts, path = served(host, tmp_path)
    other = str(tmp_path / "other")
    Path(other).write_text("x\n")
    wanted = [FactSpec.of(FileContents, path=path), FactSpec.of(FileContents, path=other)]
    assert facts_now(host, wanted) == {wanted[0]: ["v1"], wanted[1]: ["x"]}
    assert facts.batches == 1 and len(commands) == 2  # the picture, then the undeclared one alone
