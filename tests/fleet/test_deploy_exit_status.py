"""`rigkit deploy`'s exit status (issue 43): 0 only when every targeted rig completed; a rig that aborted, failed,
was unreachable or never ran makes it non-zero even when pyinfra itself exits 0, so a CI trusting it is told."""

from __future__ import annotations

import pytest

from rigkit.cli import build_parser
from rigkit.commands import deploy as deploy_command
from rigkit.fleet import deploy as fleet_deploy_module
from rigkit.fleet.outcome import ABORTED, FAILED, NOT_RUN, OK, UNREACHABLE
from rigkit.fleet.targets import Targets

DONE = "--> Starting operation: x \n    [rig1] Success\n    [rig2] Success\n--> Results:\n"
OUTPUTS = {
    "both-ok": (DONE, {OK}),
    "rig2-never-ran": ("--> Starting operation: x \n    [rig1] Success\n--> Results:\n", {OK, NOT_RUN}),
    "run-stopped": (
        "--> Starting operation: x \n    [rig1] Success\n    [rig2] Success\n--> pyinfra error: stopped\n",
        {ABORTED},
    ),
    "no-results": ("--> Starting operation: x \n    [rig1] Success\n    [rig2] Success\n", {ABORTED}),
    "rig2-failed": (
        "--> Starting operation: x \n    [rig1] Success\n    [rig2] Error: boom\n--> Results:\n",
        {OK, FAILED},
    ),
    "rig2-unreachable": (
        "    [rig2] Could not connect (timeout)\n    [rig1] Success\n--> Results:\n",
        {OK, UNREACHABLE},
    ),
}


def targets() -> Targets:
    data = {"ssh_hostname": "192.0.2.1"}
    return Targets("inv.py", {name: {"data": data, "groups": ["rigs"]} for name in ("rig1", "rig2")}, ["rig1", "rig2"])


@pytest.fixture
def pyinfra_says(monkeypatch):
    def fake(output: str, status: int) -> None:
        monkeypatch.setattr(
            fleet_deploy_module.pyinfra_args_module, "run_pyinfra_streaming", lambda argv: (status, output)
        )
        monkeypatch.setattr(fleet_deploy_module, "read_release", lambda name, data: "")

    return fake


@pytest.mark.parametrize("case", OUTPUTS)
@pytest.mark.parametrize("pyinfra_status", [0, 1])
def test_the_exit_status_is_zero_only_when_every_rig_completed(case, pyinfra_status, pyinfra_says):
    output, statuses = OUTPUTS[case]
    pyinfra_says(output, pyinfra_status)
    status, outcomes = fleet_deploy_module.fleet_deploy(targets(), "other.py", [])
    assert {outcome.status for outcome in outcomes} == statuses
    assert status == (0 if statuses == {OK} and pyinfra_status == 0 else 1)


@pytest.mark.parametrize("case, expected", [("both-ok", 0), ("rig2-never-ran", 1), ("run-stopped", 1)])
def test_the_command_exits_with_the_fleet_status(case, expected, pyinfra_says, monkeypatch, capsys):
    pyinfra_says(OUTPUTS[case][0], 0)
    monkeypatch.setattr(deploy_command, "select", lambda *args, **kwargs: targets())
    args = build_parser().parse_args(["deploy", "inv.py", "--deploy", "other.py"])
    assert deploy_command.run(args) == expected
    summary = capsys.readouterr().out
    assert ("2 of 2 rigs completed" in summary) == (expected == 0), summary
