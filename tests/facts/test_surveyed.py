"""The operations' facts in one round trip per stage (rigkit.facts.surveyed), on this machine's real shell through
pyinfra's local connector: what is served, when the picture is read again, and when it ends."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra.facts.files import Directory, File, FileContents, Sha1File
from pyinfra.facts.server import Home, Hostname
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from rigkit.facts.batch import BATCH_MARKER, FactSpec, facts_now
from rigkit.facts.surveyed import (
    OperationFacts,
    directory_reads,
    fact_key,
    put_reads,
    serve_operation_facts,
    service_reads,
)


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


def undeclared(tmp_path: Path, name: str = "other") -> str:
    """A file no operation declared, holding its name."""
    path = tmp_path / name
    path.write_text(f"{name}\n")
    return str(path)


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
    other = undeclared(tmp_path)
    assert host.get_fact(FileContents, path=other) == ["other"]  # not declared
    assert host.get_fact(FileContents, path=path, _sudo=False) == ["v1"]  # global arguments
    host.in_op = False  # the deploy code's own read (the survey)
    assert host.get_fact(FileContents, path=path) == ["v1"]
    assert facts.batches == 0 and len(commands) == 3


def test_facts_now_inside_an_operation_takes_declared_facts_from_the_picture(watched, tmp_path):
    host, commands = watched
    facts, path = served(host, tmp_path)
    other = undeclared(tmp_path)
    wanted = [FactSpec.of(FileContents, path=path), FactSpec.of(FileContents, path=other)]
    assert facts_now(host, wanted) == {wanted[0]: ["v1"], wanted[1]: ["other"]}
    assert facts.batches == 1 and len(commands) == 2  # the picture, then the undeclared one alone


def test_an_upload_ends_the_picture_like_a_command(watched, tmp_path):
    host, commands = watched
    host.state.is_executing = True
    facts, path = served(host, tmp_path)
    assert host.get_fact(FileContents, path=path) == ["v1"]
    source = tmp_path / "rendered"
    source.write_text("uploaded\n")
    assert host.put_file(str(source), remote_filename=path)  # its arguments reach the connector
    assert host.get_fact(FileContents, path=path) == ["uploaded"]
    assert facts.rig_changed and facts.batches == 1


def test_a_command_keeps_its_arguments(watched, tmp_path):
    host, _ = watched
    served(host, tmp_path)
    ok, output = host.run_shell_command("echo $RIGKIT_PROBE", _env={"RIGKIT_PROBE": "passed"})
    assert ok and output.stdout == "passed"


def test_a_live_read_of_an_undeclared_fact_keeps_the_picture(watched, tmp_path):
    """Reading is not changing: only a command or an upload ends the picture."""
    host, commands = watched
    host.state.is_executing = True
    facts, path = served(host, tmp_path)
    other = undeclared(tmp_path)
    assert host.get_fact(FileContents, path=path) == ["v1"]
    assert host.get_fact(FileContents, path=other) == ["other"]  # live, not declared
    assert host.get_fact(File, path=path)["size"] == 3  # still from the picture
    assert not facts.rig_changed and facts.batches == 1 and len(commands) == 2


def test_a_fact_read_with_positional_arguments_is_served_too(watched, tmp_path):
    host, commands = watched
    host.state.is_executing = True
    facts, path = served(host, tmp_path)
    other = undeclared(tmp_path)
    assert host.get_fact(FileContents, path) == ["v1"]
    assert host.get_fact(File, path)["size"] == 3
    assert facts.batches == 1 and len(commands) == 1
    assert host.get_fact(FileContents, other) == ["other"]  # undeclared: live, its argument kept
    host.run_shell_command(f"echo v2 > {path}")
    assert host.get_fact(FileContents, path) == ["v2"]  # live after a command, its argument kept


def test_a_declared_fact_without_arguments_is_served(watched):
    host, commands = watched
    facts = OperationFacts(host, [FactSpec.of(Hostname), FactSpec.of(Home)]).install()
    assert host.get_fact(Hostname) and host.get_fact(Home)
    assert facts.batches == 1 and len(commands) == 1


def test_facts_now_reads_the_undeclared_ones_together_and_a_lone_one_as_itself(watched, tmp_path):
    host, commands = watched
    facts, path = served(host, tmp_path)
    others = [undeclared(tmp_path, "a"), undeclared(tmp_path, "b")]
    wanted = [FactSpec.of(FileContents, path=path), *(FactSpec.of(FileContents, path=p) for p in others)]
    assert facts_now(host, wanted) == {wanted[0]: ["v1"], wanted[1]: ["a"], wanted[2]: ["b"]}
    assert facts.batches == 1 and len(commands) == 2  # the picture, then both undeclared ones in one batch
    lone = [wanted[0], wanted[1]]
    assert facts_now(host, lone) == {wanted[0]: ["v1"], wanted[1]: ["a"]}
    assert len(commands) == 3 and BATCH_MARKER not in str(commands[-1])  # one undeclared fact: its own command


@pytest.mark.parametrize(
    "one, other, same",
    [
        ({"services": ["docker.service"]}, {"services": ("docker.service",)}, True),
        ({"options": {"b": [1], "a": 2}}, {"options": {"a": 2, "b": (1,)}}, True),
        ({"nested": [{"x": [1]}]}, {"nested": ({"x": (1,)},)}, True),
        ({"services": ["a.service"]}, {"services": ["b.service"]}, False),
        ({"options": {"a": 1}}, {"options": {"a": 2}}, False),
        ({"nested": [{"x": [1]}]}, {"nested": [{"x": [2]}]}, False),
    ],
)
def test_a_facts_key_is_its_arguments_values_however_they_were_built(one, other, same):
    assert (fact_key(File, one) == fact_key(File, other)) is same
    assert hash(fact_key(File, one))  # a dict key


def test_a_host_gets_one_picture_however_often_its_roles_ask(local_host, tmp_path):
    specs = put_reads(str(tmp_path / "f"))
    first = serve_operation_facts(local_host, specs)
    assert serve_operation_facts(local_host, []) is first and first.specs
    assert local_host.get_fact.__self__ is first  # installed: the host's reads go through it


def test_the_reads_declared_for_pyinfras_operations_name_their_facts():
    where = {"machine": None, "user_mode": False, "user_name": None, "services": ("docker.service",)}
    assert service_reads("docker.service") == [
        FactSpec.of(SystemdStatus, **where),
        FactSpec.of(SystemdEnabled, **where),
    ]
    assert service_reads("docker.service", enabled=False) == [FactSpec.of(SystemdStatus, **where)]
    assert directory_reads("/etc/rigkit") == [FactSpec.of(Directory, path="/etc/rigkit")]
