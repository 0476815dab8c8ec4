"""rigkit.fleet.pyinfra_args: the pyinfra arguments rigkit deploy passes through, rewritten as pyinfra 3 reads them."""

from __future__ import annotations

import sys
from pathlib import Path

from rigkit.fleet.pyinfra_args import data_pairs, pyinfra_command, rigkit_executable, split_limits, without_limits


def test_comma_limits_become_one_pattern_per_limit():
    # pyinfra 3 matches "rig1,rig2" against host names literally: nothing would be deployed
    assert split_limits(["--limit", "rig1,rig2", "--data", "a=b", "--limit=rig3"]) == [
        "--limit",
        "rig1",
        "--limit",
        "rig2",
        "--data",
        "a=b",
        "--limit",
        "rig3",
    ]


def test_a_stage_s_arguments_keep_everything_but_the_limits():
    assert without_limits(["--limit", "rig4,rig5", "-v", "--limit=rig6"]) == ["-v"]


def test_data_pairs_are_read_in_both_spellings():
    assert data_pairs(["--data", "a=b", "-v", "--data=c=d=e"]) == ["a=b", "c=d=e"]


def test_pyinfra_runs_without_its_prompt_except_a_dry_run_which_exits_before_it():
    # -y would skip a dry run's change detection (tests/fleet/test_fleet_outcome.py runs both)
    assert pyinfra_command(["--dry", "--limit", "rig1"], "inv.py", "deploy.py")[1:] == [
        "--dry",
        "--limit",
        "rig1",
        "inv.py",
        "deploy.py",
    ]
    assert pyinfra_command(["--limit", "rig1"], "inv.py", "deploy.py")[1:] == [
        "-y",
        "--limit",
        "rig1",
        "inv.py",
        "deploy.py",
    ]


def test_the_rigkit_command_is_the_one_beside_this_python():
    assert rigkit_executable() == str(Path(sys.executable).with_name("rigkit"))  # bin/setup installs it in .venv
