"""`rigkit status` on a real lab rig (no GPU, no nvidia-smi): still one SSH round trip per rig, and the GPU part
of its answer is "no GPU tooling", said once, neither a problem nor a warning (issue 27, GPU health in status).
Needs the rigs only (not the deployed stack): status reads whatever the rig runs; its GPU part is what is checked.
"""

from __future__ import annotations

import paramiko
import pytest

from rigkit.fleet.targets import select
from rigkit.paths import REPO_ROOT
from rigkit.status.fleet import fleet_status
from rigkit.status.gpu import NO_TOOLING
from rigkit.status.report import format_report

pytestmark = [pytest.mark.lab]

LAB_INVENTORY = REPO_ROOT / "inventory" / "lab.py"


def test_a_lab_rig_says_no_gpu_tooling_once_in_its_one_round_trip(lab, monkeypatch):
    rig = lab.rigs[0]
    commands: list[str] = []
    exec_command = paramiko.SSHClient.exec_command

    def counted(client, command, *args, **kwargs):
        commands.append(command)
        return exec_command(client, command, *args, **kwargs)

    monkeypatch.setattr(paramiko.SSHClient, "exec_command", counted)
    (status,) = fleet_status(select(str(LAB_INVENTORY), [rig.name], []))
    assert status.reachable, status.error
    assert len(commands) == 1  # the whole status script, GPU sections included, in one exec
    assert "--query-gpu=" in commands[0] and "journalctl -k -b" in commands[0]
    assert status.gpu["tooling"] is False and status.gpu["findings"] == [] and status.gpu["state"] == "ok"
    assert (status.driver, status.cuda) == ("none", "none")
    assert not [line for line in status.unhealthy + status.warnings if "gpu" in line.lower() or "nvidia" in line]
    report = format_report([status])
    assert report.count(NO_TOOLING) == 1, report
