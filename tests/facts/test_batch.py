"""Several facts in one round trip (rigkit.facts.batch): FactBatch, facts_now.

The batch runs on this machine's own shell through pyinfra's local connector and must give, fact by
fact, exactly what pyinfra's own ``get_fact`` gives for the same fact (output edge cases included).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra.api import FactBase
from pyinfra.api.exceptions import PyinfraError
from pyinfra.facts.files import FileContents
from pyinfra.facts.server import LinuxDistribution, Which

from rigkit.facts.batch import FactBatch, FactSpec, facts_now
from rigkit.facts.server import ExactFileText, ShmSize


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


def test_a_batch_gives_each_fact_what_pyinfra_reads_alone(local_host, tmp_path: Path):
    (tmp_path / "empty").write_text("")
    (tmp_path / "ragged").write_text("first\n\nlast")
    specs = (
        [FactSpec.of(ShellOutput, script=snippet) for snippet in SNIPPETS]
        + [FactSpec.of(ExactFileText, path=str(tmp_path / name)) for name in ("empty", "ragged", "absent")]
        + [
            FactSpec.of(FileContents, path=str(tmp_path / name))
            for name in ("empty", "ragged", "absent")  # stateful
        ]
        + [
            FactSpec.of(NeedsAbsentTool),
            FactSpec.of(Which, command="sh"),
            FactSpec.of(Which, command="rigkit-none"),
            FactSpec.of(LinuxDistribution),
            FactSpec.of(ShmSize),
        ]
    )

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


def test_a_batch_forks_per_fact_only_its_subshell_and_its_own_commands(local_host, tmp_path: Path):
    """A rig's CPU is shared by every fact it reads: the batch adds no process per fact beyond the fact's subshell
    (its status, marker and order are the shell's builtins) and prints every output with one `cat`."""
    log = tmp_path / "cat.log"
    wrapper = tmp_path / "bin" / "cat"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho cat >> {log}\nexec /bin/cat "$@"\n')
    wrapper.chmod(0o755)
    specs = tuple(FactSpec.of(ShellOutput, script=f"echo {index}") for index in range(12))

    batch = local_host.get_fact(FactBatch, facts=specs, _env={"PATH": f"{wrapper.parent}:/usr/bin:/bin"})

    assert batch == {spec: [str(index)] for index, spec in enumerate(specs)}
    assert log.read_text().splitlines() == ["cat"]
