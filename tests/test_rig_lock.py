"""roles.rig_lock: its protocol, run for real (real sh + flock on this machine), its staleness rule and what the
holder line records."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from roles.rig_lock import EXIT_TIMEOUT, HOLDER_FILE, Holder, lock_script, stale_reason, survey_output, this_command

# The lock protocol, run for real: two "controllers" are two sh processes on this machine.


def start_locker(state_dir: Path, name: str, wait_s: int) -> subprocess.Popen:
    script = lock_script(f"controller={name} pid={os.getpid()}", wait_s, str(state_dir))
    return subprocess.Popen(
        ["sh", "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "RIGKIT_LOCK_COMMAND": f"test {name}"},
    )


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


def test_the_holder_records_the_program_and_its_files_never_an_option_value():
    argv = [
        "/usr/bin/pyinfra",
        "-y",
        "--data",
        "hf_token=hf_planted_secret",
        "inventory/lab.py",
        "deploy.py",
        "--data=serving_image=x.py",
        "--limit",
        "rig1",
    ]
    assert this_command(argv) == "pyinfra inventory/lab.py deploy.py"


class Survey:
    """A survey script as roles.rig_lock runs it (rigkit.survey.SurveyScript's two attributes)."""

    def __init__(self, script: str, end_line: str = "__survey_end__"):
        self.script, self.end_line = script, end_line


def test_the_survey_runs_in_the_lock_channel_once_the_lock_is_held_and_never_keeps_it(tmp_path):
    # the survey reads stdin (cat), an unset variable (the lock script runs under set -u) and leaves a
    # process behind (sleep): none may block the protocol, fail the survey or keep the lock
    marker = tmp_path / "survey-ran"
    script = f'cat; echo "unset:${{RIGKIT_NO_SUCH_VARIABLE}}"; touch {marker}; sleep 30 & echo line two'
    survey = Survey(script)
    first = subprocess.Popen(
        ["sh", "-c", lock_script(f"controller=first pid={os.getpid()}", 5, str(tmp_path), survey=survey)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "RIGKIT_LOCK_COMMAND": "test first"},
    )
    assert first.stdout.readline().strip() == "LOCKED"
    assert survey_output(first.stdout, survey.end_line) == ["unset:", "line two"]
    assert marker.exists()
    second = start_locker(tmp_path, "second", 30)
    assert second.stdout.readline().startswith("HELD ")  # the holder still holds it after its survey
    second.stdin.write("WAIT\n")
    second.stdin.flush()
    first.stdin.close()  # the controller's connection ends: the survey's sleep must not keep the lock
    started = time.monotonic()
    assert second.stdout.readline().strip() == "LOCKED"
    assert time.monotonic() - started < 10
    second.stdin.close()
    second.wait(10)
    first.wait(10)


def test_a_survey_cut_short_means_no_lock():
    assert survey_output(iter(["a\n", "b\n"]), "end") is None  # the holder's channel ended before the end line
    assert survey_output(iter(["a\n", "end\n", "later\n"]), "end") == ["a"]
