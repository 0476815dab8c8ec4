"""The provisioning roles, case by case (tests/roles/<role>/*.json, run by tests/pyinfra_cases.py)."""

from pathlib import Path

import pytest
from pyinfra_cases import case_files, case_id, check_case

CASE_FILES = case_files(Path(__file__).parent)


@pytest.mark.parametrize("case_path", CASE_FILES, ids=case_id)
def test_case(case_path: Path) -> None:
    check_case(case_path)


def test_every_role_folder_has_cases() -> None:
    roles = {
        "preflight",
        "nvidia_driver",
        "docker",
        "nvidia_container_toolkit",
        "l2_disk",
        "api_firewall",
        "kv_share",
        "serving",
    }
    folders = {path.parent.name for path in CASE_FILES}
    assert roles <= folders, f"no cases for {sorted(roles - folders)}"
