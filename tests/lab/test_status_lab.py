"""`rigkit status` on real lab rigs with the real vLLM CPU stack (issue 14, Status).

- right after the standard deploy every rig reads clean: exit 0, release 1 running, smoke pass, no GPU;
- a knob changed in data without deploying (`--data`) is drift naming that knob, in .env and the container;
- a rig's .env edited by hand is drift naming the knob and the broken release hash;
- a stopped container is unhealthy, and the stack's shared-memory segments left on the rig are listed.

Each test puts the rig back as the `deployed` fixture left it (the .env copied back, the container
started again and serving) and checks that status reads it clean again.
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys

import pytest

from rigkit.paths import REPO_ROOT
from rigkit.serving.commands import stack_files
from rigkit.serving.render import CONTAINER_NAME
from rigkit.status.probe import STACK_SHM_PATTERNS
from rigkit.status.report import TABLE_WIDTH
from rigkit.status.rig import OK

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

LAB_INVENTORY = REPO_ROOT / "inventory" / "lab.py"
STATUS_TIMEOUT_S = 300
SAVED_ENV = "/root/status-test.env"


def rigkit_status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rigkit.cli", "status", str(LAB_INVENTORY), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=STATUS_TIMEOUT_S,
    )


def rig_json(rig, *args: str) -> dict:
    """The status of one rig, as --json gives it (``args``: more of status's arguments, e.g. --data)."""
    result = rigkit_status("--limit", rig.name, "--json", *args)
    assert result.stdout, result.stderr[-3000:]
    (only,) = json.loads(result.stdout)["rigs"]
    return {**only, "exit": result.returncode}


def host_network_rig(lab):
    return [rig for rig in lab.rigs if not rig.netns][0]


def assert_clean(rig) -> None:
    status = rig_json(rig)
    assert (status["exit"], status["state"]) == (0, OK), json.dumps(status, indent=1)[-4000:]


def test_every_rig_reads_clean_after_the_deploy(lab, deployed, serving_image):
    limit = os.environ.get("RIGKIT_TEST_DEPLOY_LIMIT")
    args = ["--limit", limit] if limit else []
    table = rigkit_status(*args)
    assert table.returncode == 0, table.stdout[-4000:] + table.stderr[-2000:]
    statuses = json.loads(rigkit_status(*args, "--json").stdout)["rigs"]
    rows = table.stdout.splitlines()[: len(statuses) + 1]  # the header and a row per rig; details follow
    assert max(len(line) for line in rows) <= TABLE_WIDTH, table.stdout
    assert [row.split()[0] for row in rows[1:]] == [status["rig"] for status in statuses]
    assert len(statuses) == (len(limit.split(",")) if limit else len(lab.rigs))
    for status in statuses:
        assert status["state"] == OK and status["drift"] == [] and status["unhealthy"] == [], status
        assert status["image"] == serving_image["releases"]["1"]
        # an earlier lab test may have left a rig on release 1 by a rollback (test_serving_lab's upgrade-then-rollback)
        assert status["ledger"]["kind"] in ("deploy", "rollback") and status["ledger"]["smoke"] == "pass", status
        assert (status["driver"], status["cuda"]) == ("none", "none")  # lab rigs have no nvidia-smi
        assert status["l2"]["store_bytes"] is not None and status["l2"]["budget_bytes"] == 500_000_000


def test_a_knob_changed_in_data_without_deploying_is_drift_naming_it(lab, deployed):
    rig = host_network_rig(lab)
    result = rigkit_status("--limit", rig.name, "--data", "served_model_name=tiny-status-drift", "--json")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    (status,) = json.loads(result.stdout)["rigs"]
    assert status["state"] == "drift", status
    named = {(d["source"], d["knob"]) for d in status["drift"]}
    assert {(".env", "served_model_name"), ("container", "served_model_name")} <= named, status["drift"]
    assert ("files", "release hash") not in named  # the rig still has the verified files
    assert status["health"]["api"] == "ok"  # it serves what it was started with
    table = rigkit_status("--limit", rig.name, "--data", "served_model_name=tiny-status-drift")
    assert table.returncode == 1 and "served_model_name" in table.stdout


def test_a_hand_edited_env_is_drift(lab, deployed, rig_exec):
    rig = host_network_rig(lab)
    _, env = stack_files()
    rig_exec(rig, f"cp -p {env} {SAVED_ENV}")
    try:
        rig_exec(rig, f"sed -i \"s/^RIGKIT_MAX_MODEL_LEN=.*/RIGKIT_MAX_MODEL_LEN='4096'/\" {env}")
        status = rig_json(rig)
        assert (status["exit"], status["state"]) == (1, "drift"), status
        drift = {(d["source"], d["knob"]): d for d in status["drift"]}
        assert (drift[(".env", "max_model_len")]["rig"], drift[(".env", "max_model_len")]["today"]) == (
            "'4096'",
            "'8192'",
        )
        assert ("files", "release hash") in drift  # the files no longer hash to the verified release
    finally:
        rig_exec(rig, f"cp -p {SAVED_ENV} {env} && rm -f {SAVED_ENV}")
    assert_clean(rig)


def test_a_stopped_container_is_unhealthy(lab, deployed, rig_exec, assert_stack_comes_back):
    rig = host_network_rig(lab)
    rig_exec(rig, f"docker stop {CONTAINER_NAME}")
    try:
        status = rig_json(rig)
        assert (status["exit"], status["state"]) == (1, "unhealthy"), status
        assert status["health"]["container"] == f"{CONTAINER_NAME} exited", status["health"]
        assert status["health"]["api"] != "ok"
        on_rig = rig_exec(rig, "find /dev/shm -mindepth 1 -maxdepth 1 -printf '%f\\n'").stdout.split()
        expected = sorted(name for name in on_rig if any(fnmatch.fnmatch(name, p) for p in STACK_SHM_PATTERNS))
        assert sorted(item["name"] for item in status["shm_leftovers"]) == expected
    finally:
        rig_exec(rig, f"docker start {CONTAINER_NAME}")
        assert_stack_comes_back(rig)
    assert_clean(rig)
