"""rigkit's operations, case by case (tests/operations/<subject>.<operation>/*.json, as pyinfra keeps its own),
run by tests/pyinfra_cases.py."""

from pathlib import Path

import pytest
from pyinfra_cases import case_files, case_id, check_case
from subjects import defined_by_subject

import rigkit.operations

CASE_FILES = case_files(Path(__file__).parent)


@pytest.mark.parametrize("case_path", CASE_FILES, ids=case_id)
def test_case(case_path: Path) -> None:
    check_case(case_path)


def test_every_operation_has_cases() -> None:
    # pyinfra's @operation keeps the plain generator as _inner
    operations = defined_by_subject(rigkit.operations, lambda value: hasattr(value, "_inner"))
    assert "disk.fstab_entry" in operations  # the finder sees operations at all
    folders = {path.parent.name for path in CASE_FILES}
    assert operations <= folders, f"no cases for {sorted(operations - folders)}"
