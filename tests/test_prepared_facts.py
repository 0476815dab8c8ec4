"""Facts read while a deploy is prepared: one round trip for many (FactBatch), once per host and run.

The batch runs on this machine's own shell through pyinfra's local connector and must give, fact by
fact, exactly what pyinfra's own ``get_fact`` gives for the same fact (output edge cases included).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra import host as host_proxy
from pyinfra.api import Config, FactBase, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.files import FileContents
from pyinfra.facts.server import LinuxDistribution, Which

from rigkit.facts.batch import FactBatch, FactSpec, facts_now, prepare_facts, prepared_fact
from rigkit.facts.server import FileText, ShmSize


class ShellOutput(FactBase):
    """A test fact: the lines a shell snippet prints."""

    def command(self, script: str) -> str:
        return script

    def process(self, output: list[str]) -> list[str]:
        return list(output)


class NeedsAbsentTool(FactBase):
    """A test fact requiring a command no machine has: pyinfra gives the default without running it."""

    @staticmethod
    def default() -> str:
        return "absent"

    def requires_command(self, *args, **kwargs) -> str:
        return "rigkit-no-such-tool"

    def command(self) -> str:
        return "echo ran"


SNIPPETS = [
    "printf 'a\\n\\nb'",  # a blank line inside, no final newline
    "printf 'a\\n\\n'",  # a blank last line
    "printf 'x\\n'",
    "printf ''",  # no output: the default
    "echo to-stderr >&2; echo out",
]
FAILING = "echo partial; exit 3"


@pytest.fixture()
def local_host(tmp_path: Path):
    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    connect_all(state)
    local = inventory.get_host("@local")
    with ctx_state.use(state), ctx_host.use(local):
        yield local


def test_a_batch_gives_each_fact_what_pyinfra_reads_alone(local_host, tmp_path: Path):
    (tmp_path / "empty").write_text("")
    (tmp_path / "ragged").write_text("first\n\nlast")
    specs = [FactSpec.of(ShellOutput, script=snippet) for snippet in SNIPPETS] + [
        FactSpec.of(FileText, path=str(tmp_path / name)) for name in ("empty", "ragged", "absent")
    ] + [FactSpec.of(FileContents, path=str(tmp_path / name)) for name in ("ragged", "absent")  # stateful fact
    ] + [FactSpec.of(NeedsAbsentTool), FactSpec.of(Which, command="sh"), FactSpec.of(Which, command="rigkit-none"),
         FactSpec.of(LinuxDistribution), FactSpec.of(ShmSize)]

    batch = local_host.get_fact(FactBatch, facts=tuple(specs))

    alone = {spec: local_host.get_fact(spec.fact, **dict(spec.kwargs)) for spec in specs}
    assert batch == alone
    assert batch[FactSpec.of(ShellOutput, script=SNIPPETS[0])] == ["a", "", "b"]
    assert batch[FactSpec.of(ShellOutput, script="printf ''")] is None
    assert batch[FactSpec.of(NeedsAbsentTool)] == "absent"
    assert batch[FactSpec.of(FileContents, path=str(tmp_path / "absent"))] is None


def test_a_failing_fact_fails_the_host_as_pyinfra_does(local_host):
    failing, fine = FactSpec.of(ShellOutput, script=FAILING), FactSpec.of(ShellOutput, script="echo fine")
    assert local_host.get_fact(FactBatch, facts=(failing, fine)) == {fine: ["fine"]}
    with pytest.raises(PyinfraError, match="No hosts remaining"):  # pyinfra's own read of it, alone
        facts_now(local_host, [failing, fine])


def test_without_a_temporary_directory_the_batch_reads_nothing_and_fails_no_host(local_host):
    specs = (FactSpec.of(ShellOutput, script="echo one"), FactSpec.of(ShellOutput, script="echo two"))
    assert local_host.get_fact(FactBatch, facts=specs, _env={"TMPDIR": "/nonexistent/rigkit"}) is None
    assert not local_host.state.failed_hosts


def test_facts_now_reads_each_fact_alone_when_the_batch_fails(local_host, monkeypatch):
    reads = []
    real_get_fact = local_host.get_fact

    def get_fact(fact, **kwargs):
        reads.append(fact)
        return None if fact is FactBatch else real_get_fact(fact, **kwargs)

    monkeypatch.setattr(local_host, "get_fact", get_fact)
    specs = [FactSpec.of(ShellOutput, script="echo one"), FactSpec.of(ShellOutput, script="echo two")]
    assert facts_now(local_host, specs) == {specs[0]: ["one"], specs[1]: ["two"]}
    assert reads == [FactBatch, ShellOutput, ShellOutput]


class CountingHost:
    """Stands in for host.get_fact: a value per host, and how often each host was asked."""

    def __init__(self, inventory: Inventory, values: dict[str, str]):
        self.calls: dict[str, int] = {name: 0 for name in values}
        for name, value in values.items():
            host = inventory.get_host(name)
            host.get_fact = self._answer(name, value)  # type: ignore[method-assign]

    def _answer(self, name: str, value: str):
        def get_fact(fact, **kwargs):
            self.calls[name] += 1
            if fact is FactBatch:
                return {spec: f"{value}:{dict(spec.kwargs)['script']}" for spec in kwargs["facts"]}
            return f"{value}:{kwargs['script']}"

        return get_fact


@pytest.fixture()
def two_rigs():
    inventory = Inventory((["rig1", "rig2"], {}))
    state = State(inventory, Config())
    counting = CountingHost(inventory, {"rig1": "one", "rig2": "two"})
    with ctx_state.use(state):
        yield state, inventory, counting


def test_a_prepared_fact_is_read_once_per_host_and_never_shared(two_rigs):
    _, inventory, counting = two_rigs
    expected = {"rig1": "one", "rig2": "two"}
    for _ in range(3):
        for name in ("rig1", "rig2"):
            # the roles pass pyinfra's context proxy, the same object for every host
            with ctx_host.use(inventory.get_host(name)):
                assert prepared_fact(host_proxy, ShellOutput, script="a") == f"{expected[name]}:a"
    assert counting.calls == {"rig1": 1, "rig2": 1}


def test_prepare_facts_reads_ahead_in_one_round_trip_and_skips_what_is_known(two_rigs):
    _, inventory, counting = two_rigs
    rig1 = inventory.get_host("rig1")
    prepared_fact(rig1, ShellOutput, script="known")
    prepare_facts(rig1, [FactSpec.of(ShellOutput, script=s) for s in ("known", "b", "c")])
    assert prepared_fact(rig1, ShellOutput, script="b") == "one:b"
    assert prepared_fact(rig1, ShellOutput, script="c") == "one:c"
    assert counting.calls["rig1"] == 2  # "known" alone, then one batch of b and c


def test_while_executing_every_read_goes_to_the_host(two_rigs):
    state, inventory, counting = two_rigs
    rig1 = inventory.get_host("rig1")
    prepared_fact(rig1, ShellOutput, script="a")
    state.is_executing = True  # an operation may have changed the rig since (e.g. installed the engine)
    prepare_facts(rig1, [FactSpec.of(ShellOutput, script="a"), FactSpec.of(ShellOutput, script="b")])
    prepared_fact(rig1, ShellOutput, script="a")
    prepared_fact(rig1, ShellOutput, script="a")
    assert counting.calls["rig1"] == 3
