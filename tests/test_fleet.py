"""Fleet logic without the lab: the rig lock's protocol (real sh + flock on this machine), its staleness
rule, the per-rig summary read from real pyinfra output, and the connection-data check."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from rigkit.errors import ConfigError
from rigkit.fleet import (ABORTED, FAILED, NOT_RUN, OK, UNREACHABLE, check_connection_data, format_table, ledger_release,
                          limit_from, summarize, targeted)
from roles.rig_lock import EXIT_TIMEOUT, HOLDER_FILE, Holder, lock_script, stale_reason, this_command

FIXTURES = Path(__file__).parent / "fixtures" / "fleet"  # re-captured on the lab by capture.py there


def connected(text: str) -> list[str]:
    """The rigs a captured run connected to, in order (a re-capture may use other rig names)."""
    return re.findall(r"^\s*\[([^\]\s]+)\] Connected", text, re.M)


def hung_registry_fixture() -> str:
    """Captured on the lab: the registry SIGSTOPped during an upgrade (tests/fixtures/fleet/capture.py)."""
    return (FIXTURES / "registry-hung-refused.txt").read_text()


# The lock protocol, run for real: two "controllers" are two sh processes on this machine.

def start_locker(state_dir: Path, name: str, wait_s: int) -> subprocess.Popen:
    script = lock_script(f"controller={name} pid={os.getpid()}", wait_s, str(state_dir))
    return subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "RIGKIT_LOCK_COMMAND": f"test {name}"})


def test_second_deploy_waits_then_times_out_then_takes_over_a_stale_holder(tmp_path):
    (tmp_path / HOLDER_FILE).write_text("left by an older rigkit\n")
    (tmp_path / HOLDER_FILE).chmod(0o644)
    first = start_locker(tmp_path, "first", 5)
    assert first.stdout.readline().strip() == "LOCKED"
    holder = Holder.from_line((tmp_path / HOLDER_FILE).read_text())
    assert holder.controller == "first" and holder.rig_pid == first.pid and holder.command == "test first"
    assert (tmp_path / HOLDER_FILE).stat().st_mode & 0o777 == 0o600  # who holds a rig is no one else's business

    second = start_locker(tmp_path, "second", 1)
    held = second.stdout.readline().strip()
    assert held.startswith("HELD ") and Holder.from_line(held[5:]) == holder
    second.stdin.write("WAIT\n")
    second.stdin.flush()
    assert second.stdout.readline().startswith("TIMEOUT controller=first")
    assert second.wait(10) == EXIT_TIMEOUT
    assert first.poll() is None  # the holder was left alone

    third = start_locker(tmp_path, "third", 5)
    assert third.stdout.readline().startswith("HELD ")
    third.stdin.write("TAKEOVER\n")
    third.stdin.flush()
    assert third.stdout.readline().strip() == "LOCKED"
    assert first.wait(10) != 0  # the stale holder was ended
    assert Holder.from_line((tmp_path / HOLDER_FILE).read_text()).controller == "third"
    third.stdin.close()  # the controller's connection ends: the lock is free again
    assert third.wait(10) == 0

    fourth = start_locker(tmp_path, "fourth", 1)
    assert fourth.stdout.readline().strip() == "LOCKED"
    fourth.stdin.close()
    fourth.wait(10)


def test_a_waiting_deploy_gets_the_lock_when_the_holder_finishes(tmp_path):
    first = start_locker(tmp_path, "first", 5)
    assert first.stdout.readline().strip() == "LOCKED"
    second = start_locker(tmp_path, "second", 30)
    assert second.stdout.readline().startswith("HELD ")
    second.stdin.write("WAIT\n")
    second.stdin.flush()
    started = time.monotonic()
    first.stdin.close()
    assert second.stdout.readline().strip() == "LOCKED"
    assert time.monotonic() - started < 25
    second.stdin.close()
    second.wait(10)


def holder(controller="ctl", pid=100, started=1000.0) -> Holder:
    return Holder(controller, pid, started, rig_pid=55, command="pyinfra deploy.py")


def test_stale_when_its_controller_pid_on_this_controller_is_gone():
    assert "is gone" in stale_reason(holder(), 1010, "ctl", 7200, is_alive=lambda pid: False)
    assert stale_reason(holder(), 1010, "ctl", 7200, is_alive=lambda pid: True) is None


def test_a_live_holder_on_another_controller_is_respected_until_too_old():
    assert stale_reason(holder(controller="other"), 1010, "ctl", 7200, is_alive=lambda pid: False) is None
    assert "rig_lock_stale_s" in stale_reason(holder(controller="other"), 1000 + 7201, "ctl", 7200)


def test_holder_line_round_trip_and_garbage():
    line = holder().to_line()
    assert Holder.from_line(line) == holder()
    assert Holder.from_line("") is None
    assert Holder.from_line("controller=x pid=notanumber") is None


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
    output = "\n".join([
        "--> Connecting to hosts...",
        "    [rig1] Connected",
        "    [rig2] Could not connect (Connection refused)",
        "--> Starting operation: docker | /etc/docker ",
        "    [rig1] No changes",
        "--> pyinfra error: Over 10% of hosts failed (50%)",
    ])
    outcomes = summarize(output, ["rig1", "rig2", "rig3"])
    assert outcomes["rig2"].status == UNREACHABLE and outcomes["rig2"].step == "connect"
    assert "Connection refused" in outcomes["rig2"].reason
    assert outcomes["rig1"].status == ABORTED and "Over 10%" in outcomes["rig1"].reason
    assert outcomes["rig3"].status == NOT_RUN  # targeted but never reported


def test_a_completed_run_is_ok_for_every_rig_without_an_error():
    output = "    [rig1] Connected\n--> Starting operation: x \n    [rig1] Success\n--> Results:\n    Grand total 1 1 - -\n"
    assert summarize(output, ["rig1"])["rig1"].status == OK


def test_table_and_ledger_release():
    ledger = '{"schema": 1, "releases": [{"image": "r@sha256:' + "ab" * 32 + '", "kind": "rollback", "smoke": "pass"}]}'
    assert ledger_release(ledger) == "abababababab rollback smoke=pass"
    assert ledger_release("") == ""
    outcomes = summarize("    [rig1] Connected\n--> Results:\n", ["rig1"])
    table = format_table(list(outcomes.values()))
    assert table.splitlines()[0].split() == ["rig", "status", "step", "release", "reason"]
    assert table.splitlines()[1].split()[:2] == ["rig1", "ok"]


def test_limit_selects_names_groups_and_globs():
    hosts = {"rig1": {"groups": ["lab"]}, "rig2": {"groups": ["lab"]}, "gpu1": {"groups": ["big"]}}
    assert limit_from(["--limit", "rig1,big", "-v"]) == ["rig1", "big"]
    assert targeted(hosts, ["rig1", "big"]) == ["rig1", "gpu1"]
    assert targeted(hosts, ["rig*"]) == ["rig1", "rig2"]
    assert targeted(hosts, []) == ["rig1", "rig2", "gpu1"]


# Connection data (catalogue row "inventory host with no SSH key").

def test_host_with_no_ssh_key_and_nothing_to_fall_back_on_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        check_connection_data("rig9", {"ssh_hostname": "10.0.0.9", "ssh_allow_agent": False}, environ={})
    assert caught.value.field == "rig9.ssh_key" and "set ssh_key for rig9" in caught.value.fix


def test_missing_key_file_is_refused_with_its_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError) as caught:
        check_connection_data("rig9", {"ssh_key": str(missing)})
    assert caught.value.value == str(missing)


def test_key_file_agent_or_default_key_is_enough(tmp_path, monkeypatch):
    key = tmp_path / "key"
    key.write_text("k")
    check_connection_data("rig9", {"ssh_key": str(key)})
    check_connection_data("rig9", {}, environ={"SSH_AUTH_SOCK": "/tmp/agent"})
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_ed25519").write_text("k")
    check_connection_data("rig9", {"ssh_allow_agent": False}, environ={})


def test_bad_input_that_stops_the_whole_run_is_the_reason_for_every_rig():
    output = "\n".join([
        "    [rig1] Connected",
        "    [rig2] Connected",
        "--> Preparing operation files...",
        "Traceback (most recent call last):",
        '  File "/work/main/rigkit/registry.py", line 75, in require_digest',
        "rigkit.errors.ConfigError: serving_image='r:latest': image given by a tag (latest). Fix: pin it",
    ])
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
    output = "\n".join([
        "    [rig1] Connected", "    [rig2] Connected",
        "--> Starting operation: serving | Smoke, ledger, prune ",
        "paramiko.ssh_exception.SSHException: SSH session not active",
        "    [rig2] Unexpected error in Python callback: SSHException('SSH session not active',)",
        "    [rig2] Error: executed 0 commands",
        "    [rig1] Success",
        "--> Results:",
    ])
    outcomes = summarize(output, ["rig1", "rig2"])
    assert outcomes["rig1"].status == OK
    assert outcomes["rig2"].status == FAILED and outcomes["rig2"].reason == "SSH session not active"


def test_comma_limits_become_one_pattern_per_limit():
    from rigkit.fleet import split_limits

    # pyinfra 3 matches "rig1,rig2" against host names literally: nothing would be deployed
    assert split_limits(["--limit", "rig1,rig2", "--data", "a=b", "--limit=rig3"]) == [
        "--limit", "rig1", "--limit", "rig2", "--data", "a=b", "--limit", "rig3"]


def test_the_holder_records_the_program_and_its_files_never_an_option_value():
    argv = ["/usr/bin/pyinfra", "-y", "--data", "hf_token=hf_planted_secret", "inventory/lab.py", "deploy.py",
            "--data=serving_image=x.py", "--limit", "rig1"]
    assert this_command(argv) == "pyinfra inventory/lab.py deploy.py"


# A refusal while the deploy runs: one line, no traceback (rigkit.operations.refuse / refusing_step), run by
# the real pyinfra on @local (this machine; the steps only log) and read back by the summary.

REFUSING_DEPLOY = '''
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
'''


def run_local_deploy(tmp_path, step: str) -> subprocess.CompletedProcess:
    import sys

    from rigkit.paths import REPO_ROOT

    (tmp_path / "refusing.py").write_text("from pyinfra import host\n" + REFUSING_DEPLOY)
    pyinfra = Path(sys.executable).with_name("pyinfra")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([str(pyinfra), "-y", "--data", f"step={step}", "@local", "refusing.py"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("step, field, step_name", [("refuse", "rig_lock", "Rig lock"),
                                                    ("refusing_step", "serving_image", "Smoke, ledger, prune")])
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


# The summary of the new refusal lines (hand-made, named made-up: the lab captures replace them, see
# tests/fixtures/fleet/capture.py) and a table that fits the terminal.

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


@pytest.mark.parametrize("fixture", ["registry-hung-refused.txt", "release-rolled-back.txt", "lock-refused.txt"])
@pytest.mark.parametrize("width", [80, 100, 160])
def test_the_table_fits_the_terminal_and_the_full_reason_follows_it(fixture, width):
    text = (FIXTURES / fixture).read_text()
    outcomes = list(summarize(text, connected(text)).values())
    for outcome in outcomes:
        outcome.release = "c34791316a6f deploy smoke=pass"
    table = format_table(outcomes, width=width)
    lines = table.splitlines()
    header = lines[0].split() + (lines[1].split() if lines[1].strip() == "reason" else [])  # reason under a row
    assert header == ["rig", "status", "step", "release", "reason"]
    assert max(len(line) for line in lines) <= width
    flat = "".join("".join(line.split()) for line in lines)  # a long word (a digest) is broken across lines
    for outcome in outcomes:
        assert "".join(outcome.reason.split()) in flat  # whole, under the table
        row = next(line for line in lines if line.startswith(outcome.rig + " "))  # "rig4: ..." is the full reason
        assert outcome.release in row and FAILED in row.split()


def test_the_table_shows_the_problem_and_the_reason_below_names_field_value_and_fix():
    text = hung_registry_fixture()
    name = connected(text)[0]
    outcomes = [summarize(text, [name])[name]]
    lines = format_table(outcomes, width=100).splitlines()
    assert "image: registry" in lines[1] and "sha256" not in lines[1]  # the digest stays out of the row
    below = [line for line in lines[2:] if line.startswith(f"{name}: ")]
    assert below and below[0].startswith(f"{name}: serving_image='127.0.0.1:5000/")
    ok = summarize("    [rig1] Connected\n--> Results:\n", ["rig1"])["rig1"]
    assert format_table([ok], width=100).splitlines()[1:] == ["rig1  ok      -     -        -"]


def test_the_table_width_is_the_terminal_s_or_the_fallback(monkeypatch):
    from rigkit.fleet import TABLE_WIDTH_FALLBACK, table_width

    monkeypatch.setenv("COLUMNS", "123")
    assert table_width() == 123
    monkeypatch.delenv("COLUMNS")
    assert table_width() in (TABLE_WIDTH_FALLBACK, os.get_terminal_size(1).columns if os.isatty(1) else -1)
