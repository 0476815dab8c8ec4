"""Fact tests as data, as pyinfra's tests/facts/<module>.<Fact>/*.json: command output in, value out.

One folder per fact (``tests/facts/<subject>.<Fact>/``, the fact ``rigkit.facts.<subject>.<Fact>``), one
JSON file per case:
- ``arguments``: the fact's keyword arguments ({} when it takes none);
- ``command``: the shell text the fact runs, exactly; ``requires_command``: the tool it needs, if any;
- ``output``: the lines the host prints (no output gives the fact's default, as pyinfra's get_fact does);
- ``fact``: the value expected (sets compare as sorted lists).
Real captures are used where the repository has them (tests/fixtures/); ``doc`` says where from.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import pytest
from pyinfra.api import FactBase, StringCommand
from subjects import defined_by_subject

import rigkit.facts

CASES_DIR = Path(__file__).parent
CASE_FILES = sorted(CASES_DIR.glob("*/*.json"))

# Facts whose command cannot be data: each is tested where the reason says.
NOT_AS_DATA = {
    # its marker line is random per read, so no command text is fixed; run on this machine's shell instead
    "batch.FactBatch": "tests/facts/test_batch.py",
}


def fact_class(folder: str) -> type[FactBase]:
    subject, name = folder.split(".", 1)
    return getattr(importlib.import_module(f"rigkit.facts.{subject}"), name)


def as_json(value):
    """The value as the case file holds it: sets become sorted lists."""
    return json.loads(json.dumps(value, default=lambda v: sorted(v) if isinstance(v, (set, frozenset)) else v))


def shell_text(command) -> str:
    return command.get_raw_value() if isinstance(command, StringCommand) else command


@pytest.mark.parametrize("case_path", CASE_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fact(case_path: Path) -> None:
    case = json.loads(case_path.read_text())
    fact = fact_class(case_path.parent.name)()
    arguments = case.get("arguments", {})
    assert shell_text(fact.command(**arguments)) == case["command"]
    assert fact.requires_command(**arguments) == case.get("requires_command")
    output = case["output"]
    value = fact.process(output) if output else fact.default()
    assert as_json(value) == case["fact"]


def test_every_fact_has_cases() -> None:
    facts = defined_by_subject(rigkit.facts, lambda value: inspect.isclass(value) and issubclass(value, FactBase))
    assert "disk.BlockDeviceProbe" in facts  # the finder sees facts at all
    folders = {path.parent.name for path in CASE_FILES}
    missing = facts - folders - set(NOT_AS_DATA)
    assert not missing, f"no cases for {sorted(missing)}"
