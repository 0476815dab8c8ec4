"""rigkit.fleet.outcome: the per-rig outcome read from pyinfra's output, mostly real output captured on the lab
(tests/fixtures/fleet/), and refusals while the deploy runs, run by the real pyinfra on @local."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from rigkit.fleet.outcome import ABORTED, DRY_RUN, FAILED, NOT_RUN, OK, UNREACHABLE, summarize
from rigkit.fleet.pyinfra_args import pyinfra_command

FIXTURES = Path(__file__).parents[1] / "fixtures" / "fleet"  # re-captured on the lab by capture.py there


def connected(text: str) -> list[str]:
    """The rigs a captured run connected to, in order (a re-capture may use other rig names)."""
    return re.findall(r"^\s*\[([^\]\s]+)\] Connected", text, re.M)


def hung_registry_fixture() -> str:
    """Captured on the lab: the registry SIGSTOPped during an upgrade (tests/fixtures/fleet/capture.py)."""
    return (FIXTURES / "registry-hung-refused.txt").read_text()


# The fleet summary, from real pyinfra output captured on the lab (tests/fixtures/fleet/).


def test_summary_of_a_lock_refusal_names_the_step_and_the_holder():
    text = (FIXTURES / "lock-refused.txt").read_text()
    (name,) = connected(text)
    rig = summarize(text, [name])[name]
    assert rig.status == FAILED and rig.step == "Rig lock"
    assert "another deploy holds this rig's lock" in rig.reason and "rig_lock_wait_s=3" in rig.reason


def test_summary_of_a_stopped_rig_among_three(fixture_text=None):
    text = (FIXTURES / "rig-stopped-mid-deploy.txt").read_text()
    outcomes = summarize(text, connected(text))
    assert len(outcomes) == 3
    statuses = {name: o.status for name, o in outcomes.items()}
    assert sorted(s for s in statuses.values()) == [FAILED, OK, OK] or UNREACHABLE in statuses.values()
    bad = [o for o in outcomes.values() if o.status != OK]
    assert len(bad) == 1 and bad[0].step and bad[0].reason


def test_summary_of_a_failed_release_that_was_rolled_back():
    text = (FIXTURES / "release-rolled-back.txt").read_text()
    (name,) = connected(text)
    rig = summarize(text, [name])[name]
    assert rig.status == FAILED and rig.step == "serving | Smoke, ledger, prune"
    assert "rolled back to" in rig.reason
    assert rig.notes and rig.notes[0].startswith("serving | Release")  # the ignored release error is kept


def test_unreachable_and_aborted_rigs():
    output = "\n".join(
        [
            "--> Connecting to hosts...",
            "    [rig1] Connected",
            "    [rig2] Could not connect (Connection refused)",
            "--> Starting operation: docker | /etc/docker ",
            "    [rig1] No changes",
            "--> pyinfra error: Over 10% of hosts failed (50%)",
        ]
    )
    outcomes = summarize(output, ["rig1", "rig2", "rig3"])
    assert outcomes["rig2"].status == UNREACHABLE and outcomes["rig2"].step == "connect"
    assert "Connection refused" in outcomes["rig2"].reason
    assert outcomes["rig1"].status == ABORTED and "Over 10%" in outcomes["rig1"].reason
    assert outcomes["rig3"].status == NOT_RUN  # targeted but never reported


def test_a_completed_run_is_ok_for_every_rig_without_an_error():
    output = (
        "    [rig1] Connected\n--> Starting operation: x \n    [rig1] Success\n--> Results:\n    Grand total 1 1 - -\n"
    )
    assert summarize(output, ["rig1"])["rig1"].status == OK


def test_bad_input_that_stops_the_whole_run_is_the_reason_for_every_rig():
    output = "\n".join(
        [
            "    [rig1] Connected",
            "    [rig2] Connected",
            "--> Preparing operation files...",
            "Traceback (most recent call last):",
            '  File "/work/main/rigkit/remote/registry.py", line 75, in require_digest',
            "rigkit.errors.ConfigError: serving_image='r:latest': image given by a tag (latest). Fix: pin it",
        ]
    )
    outcomes = summarize(output, ["rig1", "rig2"])
    for outcome in outcomes.values():
        assert outcome.status == ABORTED and outcome.reason.startswith("ConfigError: serving_image='r:latest'")


def test_a_refusal_while_preparing_reads_as_one_clean_line_and_is_every_rig_s_reason():
    output = (FIXTURES / "bad-input-refused.txt").read_text()  # real: pyinfra -y @local deploy.py, a tag image
    assert "Traceback" not in output
    (line,) = [line for line in output.splitlines() if "serving_image=" in line]
    assert line.startswith("--> pyinfra error") and "Fix: pin it as 127.0.0.1:5000/x@sha256:" in line
    outcome = summarize(output, ["@local"])["@local"]
    assert outcome.status == ABORTED and outcome.reason.startswith("serving_image='127.0.0.1:5000/x:tag'")


def test_a_traceback_for_one_rig_does_not_abort_the_others():
    output = "\n".join(
        [
            "    [rig1] Connected",
            "    [rig2] Connected",
            "--> Starting operation: serving | Smoke, ledger, prune ",
            "paramiko.ssh_exception.SSHException: SSH session not active",
            "    [rig2] Unexpected error in Python callback: SSHException('SSH session not active',)",
            "    [rig2] Error: executed 0 commands",
            "    [rig1] Success",
            "--> Results:",
        ]
    )
    outcomes = summarize(output, ["rig1", "rig2"])
    assert outcomes["rig1"].status == OK
    assert outcomes["rig2"].status == FAILED and outcomes["rig2"].reason == "SSH session not active"


# A refusal while the deploy runs: one line, no traceback (rigkit.operations.refuse / refusing_step), run by
# the real pyinfra on @local (this machine; the steps only log) and read back by the summary.

REFUSING_DEPLOY = """
from pyinfra.operations import python, server
from rigkit.errors import PreflightError
from rigkit.operations import refuse, refusing_step

def release(image):
    raise PreflightError("serving_image", image, "registry 127.0.0.1:5000 hung: it accepts connections but does "
                         "not answer", "check that 127.0.0.1:5000 is running")

def bug():
    raise KeyError("a bug keeps its traceback")

STEP = {"refuse": lambda: python.call(name="Rig lock", function=refuse, field="rig_lock", value="@local",
                                      problem="another deploy holds this rig's lock", fix="let it finish"),
        "refusing_step": lambda: python.call(name="Smoke, ledger, prune", function=refusing_step(release),
                                             image="127.0.0.1:5000/x@sha256:" + "1" * 64),
        "bug": lambda: python.call(name="Smoke, ledger, prune", function=refusing_step(bug))}
STEP[host.data.get("step")]()
server.shell(name="After the refusal", commands=["echo never-reached"])
"""


def run_local_deploy(tmp_path, step: str) -> subprocess.CompletedProcess:
    from rigkit.fleet.pyinfra_args import pyinfra_executable
    from rigkit.paths import REPO_ROOT

    (tmp_path / "refusing.py").write_text("from pyinfra import host\n" + REFUSING_DEPLOY)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [pyinfra_executable(), "-y", "--data", f"step={step}", "@local", "refusing.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.parametrize(
    "step, field, step_name",
    [("refuse", "rig_lock", "Rig lock"), ("refusing_step", "serving_image", "Smoke, ledger, prune")],
)
def test_a_refusal_while_running_is_one_line_and_fails_the_rig_without_a_traceback(tmp_path, step, field, step_name):
    run = run_local_deploy(tmp_path, step)
    output = run.stdout + run.stderr
    assert run.returncode != 0
    assert "Traceback" not in output and "Unexpected error in Python callback" not in output
    assert "never-reached" not in output and "After the refusal" not in output  # the rig stopped there
    (line,) = [line for line in output.splitlines() if f"{field}=" in line]
    assert "[@local] refused: " in line and "Fix: " in line
    outcome = summarize(output, ["@local"])["@local"]
    assert outcome.status == FAILED and outcome.step == step_name
    assert outcome.reason.startswith(f"{field}=") and outcome.reason.endswith(line.rpartition("Fix: ")[2].strip())


def test_a_bug_inside_a_refusing_step_keeps_its_traceback(tmp_path):
    output = "".join(run_local_deploy(tmp_path, "bug").__dict__[s] for s in ("stdout", "stderr"))
    assert "Traceback" in output and "a bug keeps its traceback" in output


# A dry run as rigkit deploy runs it (rigkit.fleet.pyinfra_args.pyinfra_command), by the real pyinfra on @local: a file
# that would be written under tmp_path, never written.

CHANGING_DEPLOY = """
from pyinfra import host
from pyinfra.operations import files

files.put(name="Write the marker", src=__file__, dest=host.data.get("marker"))
"""


def run_dry(tmp_path, *extra: str) -> str:
    from rigkit.paths import REPO_ROOT

    (tmp_path / "changing.py").write_text(CHANGING_DEPLOY)
    argv = pyinfra_command(["--dry", *extra, "--data", f"marker={tmp_path / 'marker'}"], "@local", "changing.py")
    run = subprocess.run(
        argv,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout + run.stderr


def test_a_dry_run_shows_what_would_change_and_reads_as_a_dry_run_for_every_rig(tmp_path):
    output = run_dry(tmp_path)
    assert not (tmp_path / "marker").exists()
    (row,) = [line for line in output.splitlines() if "Write the marker" in line]
    assert "1 (@local)" in row  # pyinfra's table of detected changes: it would write the file
    outcome = summarize(output, ["@local"], dry_run=True)["@local"]
    assert (outcome.status, outcome.step) == (DRY_RUN, "-") and "nothing changed" in outcome.reason
    # read as a real run's output, it never finished: the summary said every rig of a dry run was aborted
    assert summarize(output, ["@local"])["@local"].status == ABORTED


def test_a_captured_dry_run_of_an_upgrade_reads_as_a_dry_run_on_each_rig():
    text = (FIXTURES / "dry-run-upgrade.txt").read_text()  # deploy.py --dry of release 2 on two lab rigs
    rigs = connected(text)
    assert len(rigs) == 2 and any(
        "serving | Release" in line and f"2 ({', '.join(rigs)})" in line for line in text.splitlines()
    )
    assert {o.status for o in summarize(text, rigs, dry_run=True).values()} == {DRY_RUN}


def test_with_y_the_same_dry_run_shows_nothing(tmp_path):
    # why pyinfra_command leaves -y out of a dry run: under it pyinfra 3 skips its change detection
    output = run_dry(tmp_path, "-y")
    assert "Write the marker" not in output and "Skipping change detection" in output


# The summary of the new refusal lines (hand-made, named made-up: the lab captures replace them, see
# tests/fixtures/fleet/capture.py).


def test_summary_of_a_hung_registry_names_the_registry_not_the_digest():
    output = hung_registry_fixture()
    outcomes = summarize(output, connected(output))
    assert outcomes
    for outcome in outcomes.values():
        assert outcome.status == FAILED and outcome.step == "serving | Preflight refused"
        assert outcome.reason.startswith("serving_image='127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:")
        assert "registry 127.0.0.1:5000 hung" in outcome.reason and "TLS handshake timeout" in outcome.reason
        assert "check the digest" not in outcome.reason


def test_a_failed_pull_is_worded_by_what_docker_said_of_the_registry():
    text = (FIXTURES / "pull-failed-made-up.txt").read_text()
    (name,) = connected(text)
    outcome = summarize(text, [name])[name]
    assert outcome.status == FAILED and outcome.step == "serving | Pull the image (the old stack keeps serving)"
    assert outcome.reason.startswith("registry 127.0.0.1:5000 hung: ")
    assert "Fix: check that 127.0.0.1:5000 is running" in outcome.reason
    assert "(docker: Error response from daemon: " in outcome.reason
