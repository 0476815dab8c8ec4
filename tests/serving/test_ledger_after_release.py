"""after_release (roles/serving.py, deciding with rigkit.serving.release): what a verified release leaves on the rig,
and what an automatic rollback brings back.

The rig here is a recording fake (files by path, commands in order) and smoke is faked: both need a
serving stack. The same path runs against real rigs in tests/lab (test_fleet_lab: automatic
rollback; test_rollback_rendering_lab: stored rendering restored by rollback.py).
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

import roles.serving as serving
from rigkit.errors import PreflightError
from rigkit.facts.server import ExactFileText
from rigkit.paths import RIG_STACK_DIR
from rigkit.serving.commands import RELEASE_HASH_FILE, rendering_for
from rigkit.serving.ledger import LEDGER_PATH, SMOKE_PASS, Ledger, Release, rendering_dir
from rigkit.serving.smoke import SmokeCheck, SmokeReport
from rigkit.settings.hostdata import rig_settings, settings_for_host

IMAGE_1 = "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64
IMAGE_2 = "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "2" * 64
DATA = {"serving_profile": "cpu-lab", "serving_image": IMAGE_1, "gpus": 0, "serving_port": 8101}


def rendering(image: str, served_name: str):
    return rendering_for(settings_for_host({**DATA, "serving_image": image, "served_model_name": served_name}))


class FakeRig:
    """Files by path and the commands run, in order; `cat` of the ledger answers from the files."""

    name = "rig"

    def __init__(self, files: dict[str, str]):
        self.files = dict(files)
        self.commands: list[str] = []

    def run_shell_command(self, command: str):
        self.commands.append(command)
        if command.startswith(f"cat {LEDGER_PATH}"):
            return True, SimpleNamespace(stdout=self.files.get(LEDGER_PATH, ""), stderr="")
        return True, SimpleNamespace(stdout="", stderr="")

    def put_file(self, src, path: str) -> bool:
        self.files[path] = src.read()
        self.commands.append(f"<upload {path}>")
        return True

    def get_fact(self, fact, path: str):
        assert fact is ExactFileText
        return self.files.get(path)

    def ledger(self) -> Ledger:
        return Ledger.from_json(self.files[LEDGER_PATH])


@pytest.fixture
def rig(monkeypatch):
    def install(files: dict[str, str], smoke_passes: dict[str, bool]) -> FakeRig:
        fake = FakeRig(files)
        monkeypatch.setattr(serving, "host", fake)
        monkeypatch.setattr(
            serving,
            "smoke",
            lambda r, data: SmokeReport(
                [SmokeCheck("fake", smoke_passes[r.knob("served_model_name")], "faked: needs a serving stack")]
            ),
        )
        return fake

    return install


def verified_ledger(*renderings) -> str:
    ledger = Ledger()
    for r in renderings:
        ledger.record(Release(image=r.image, profile=r.profile, knobs_hash=r.knobs_hash, rendering=r.hash))
        ledger.record_smoke(SMOKE_PASS)
    return ledger.to_json()


def stored(r) -> dict[str, str]:
    return {f"{rendering_dir(r.hash)}/compose.yml": r.compose, f"{rendering_dir(r.hash)}/.env": r.env}


def call(r, kind="deploy", note=""):
    serving.after_release(
        rendering=r,
        rig=rig_settings(DATA),
        compose="docker-compose",
        kind=kind,
        run_smoke=True,
        auto_rollback=True,
        keep_images=1,
        ready_timeout_s=5,
        note=note,
    )


def test_a_verified_release_is_stored_before_the_ledger_names_it(rig):
    r1 = rendering(IMAGE_1, "tiny-a")
    fake = rig({}, {"tiny-a": True})
    call(r1)
    directory = rendering_dir(r1.hash)
    assert (fake.files[f"{directory}/compose.yml"], fake.files[f"{directory}/.env"]) == (r1.compose, r1.env)
    assert f"install -d -m 700 /var/lib/rigkit/releases {directory}" in fake.commands
    assert fake.commands.index(f"chmod 600 {directory}/.env") < fake.commands.index(f"<upload {LEDGER_PATH}>")
    entry = fake.ledger().current
    assert (entry.rendering, entry.smoke, entry.image) == (r1.hash, SMOKE_PASS, IMAGE_1)
    assert f"echo {r1.hash} > {RELEASE_HASH_FILE}" in fake.commands


def test_pruning_removes_old_renderings_but_keeps_the_rollback_target(rig):
    r1, r2, r3 = rendering(IMAGE_1, "tiny-a"), rendering(IMAGE_2, "tiny-b"), rendering(IMAGE_1, "tiny-c")
    fake = rig({LEDGER_PATH: verified_ledger(r1, r2), **stored(r1), **stored(r2)}, {"tiny-c": True})
    call(r3)  # keep_images=1: r3 is current, r2 the rollback target; r1 goes
    assert f"rm -rf {rendering_dir(r1.hash)}" in fake.commands
    assert not any(re.search(f"rm -rf .*({r2.hash}|{r3.hash})", c) for c in fake.commands)


def test_a_failed_release_is_rolled_back_to_the_stored_rendering_not_todays(rig):
    verified, failing = rendering(IMAGE_1, "tiny-a"), rendering(IMAGE_2, "tiny-b")
    fake = rig({LEDGER_PATH: verified_ledger(verified), **stored(verified)}, {"tiny-a": True, "tiny-b": False})
    with pytest.raises(PreflightError, match=f"rolled back to {re.escape(IMAGE_1)}"):
        call(failing)
    assert fake.files[f"{RIG_STACK_DIR}/.env"] == verified.env  # served name tiny-a, as verified
    assert fake.files[f"{RIG_STACK_DIR}/compose.yml"] == verified.compose
    failed, rolled_back = fake.ledger().releases[-2:]
    assert (failed.rendering, failed.smoke) == (failing.hash, "fail")
    assert (rolled_back.kind, rolled_back.rendering, rolled_back.smoke) == ("rollback", verified.hash, SMOKE_PASS)
    assert "restored the verified rendering" in rolled_back.note and "re-rendered" not in rolled_back.note
    assert fake.commands[-1] == f"echo {verified.hash} > {RELEASE_HASH_FILE}"


def test_without_a_stored_rendering_the_rollback_re_renders_and_says_so(rig):
    verified, failing = rendering(IMAGE_1, "tiny-a"), rendering(IMAGE_2, "tiny-b")
    todays = rendering_for(settings_for_host(DATA))  # IMAGE_1 with today's data (served name default)
    fake = rig({LEDGER_PATH: verified_ledger(verified)}, {"tiny-b": False, todays.knob("served_model_name"): True})
    with pytest.raises(PreflightError, match="rolled back"):
        call(failing)
    assert fake.files[f"{RIG_STACK_DIR}/compose.yml"] == todays.compose
    rolled_back = fake.ledger().current
    assert "re-rendered with today's data: stored rendering missing" in rolled_back.note
    assert rolled_back.rendering == todays.hash
    assert fake.files[f"{rendering_dir(todays.hash)}/.env"] == todays.env  # verified now: stored for next time


class FailedRelease:
    """The stack_release operation of a release whose wait failed: what after_release reads of it."""

    stdout_lines = ["waiting for http://127.0.0.1:8101/v1/models"] * 20
    stderr_lines = ["rigkit-serving exited (1): FileNotFoundError: config.json"]

    def did_error(self) -> bool:
        return True


def test_a_release_that_never_becomes_ready_is_failed_and_rolled_back(rig, monkeypatch):
    verified, broken = rendering(IMAGE_1, "tiny-a"), rendering(IMAGE_2, "tiny-b")
    smoked = []
    fake = rig({LEDGER_PATH: verified_ledger(verified), **stored(verified)}, {"tiny-a": True})
    monkeypatch.setattr(
        serving,
        "smoke",
        lambda r, data: smoked.append(r.knob("served_model_name")) or SmokeReport([SmokeCheck("fake", True, "faked")]),
    )
    with pytest.raises(PreflightError, match=f"(?s)rolled back to {re.escape(IMAGE_1)} .*config.json"):
        serving.after_release(
            rendering=broken,
            rig=rig_settings(DATA),
            compose="docker-compose",
            kind="deploy",
            run_smoke=True,
            auto_rollback=True,
            keep_images=1,
            ready_timeout_s=5,
            release_op=FailedRelease(),
        )
    assert smoked == ["tiny-a"]  # the release that never answered is not smoke-checked; the rollback is
    failed, rolled_back = fake.ledger().releases[-2:]
    assert (failed.image, failed.smoke, failed.rendering) == (IMAGE_2, "fail", broken.hash)
    assert failed.note.startswith("release never became ready: ") and failed.note.endswith("config.json")
    assert (rolled_back.kind, rolled_back.image, rolled_back.smoke) == ("rollback", IMAGE_1, SMOKE_PASS)
    assert rolled_back.note.startswith(f"automatic: deploy of {IMAGE_2} failed; restored the verified rendering")
    # the rollback: the stored files in place, down, up, wait (no pull); the ledger; the hash file last
    assert fake.files[f"{RIG_STACK_DIR}/.env"] == verified.env
    released = [c for c in fake.commands if c.startswith(f"cd {RIG_STACK_DIR}") or c.startswith("python3 ")]
    assert [c.split(" -p rigkit ")[-1] for c in released[:3]] == ["config -q", "down --remove-orphans", "up -d"]
    assert "wait_ready.py" in released[3] and not any(c.startswith("docker pull") for c in fake.commands)
    assert fake.commands.index(f"<upload {RIG_STACK_DIR}/compose.yml>") < fake.commands.index(released[0])
    assert fake.commands[-2:] == [f"<upload {LEDGER_PATH}>", f"echo {verified.hash} > {RELEASE_HASH_FILE}"]
    assert not any(broken.hash in c for c in fake.commands)  # the failed rendering is neither stored nor recorded


def test_a_settings_only_release_that_fails_is_rolled_back_to_the_previous_rendering_of_its_image(rig, monkeypatch):
    # same image, same served name, only max_model_len changed: the rollback target is chosen by release, not by
    # image (issue 29)
    verified = rendering(IMAGE_1, "tiny-a")
    failing = rendering_for(settings_for_host({**DATA, "served_model_name": "tiny-a", "max_model_len": 4096}))
    fake = rig({LEDGER_PATH: verified_ledger(verified), **stored(verified)}, {})
    monkeypatch.setattr(
        serving,
        "smoke",
        lambda r, data: SmokeReport([SmokeCheck("fake", r.hash == verified.hash, "faked: needs a serving stack")]),
    )
    with pytest.raises(PreflightError, match=f"rolled back to {re.escape(IMAGE_1)} \\(serving again\\)"):
        call(failing)
    assert fake.files[f"{RIG_STACK_DIR}/compose.yml"] == verified.compose
    assert fake.files[f"{RIG_STACK_DIR}/.env"] == verified.env
    failed, rolled_back = fake.ledger().releases[-2:]
    assert (failed.image, failed.rendering, failed.smoke) == (IMAGE_1, failing.hash, "fail")
    assert (rolled_back.kind, rolled_back.rendering, rolled_back.smoke) == ("rollback", verified.hash, SMOKE_PASS)
    assert fake.commands[-1] == f"echo {verified.hash} > {RELEASE_HASH_FILE}"


def test_a_settings_only_release_that_fails_without_its_predecessors_stored_files_is_refused_not_rolled_to_itself(
    rig, monkeypatch
):
    # today's data is the failing release's (only max_model_len changed, same image); the known-good rendering's
    # stored files are gone, so re-rendering its image from today's data gives the failed release back: no rollback
    verified = rendering(IMAGE_1, "tiny-a")
    failing_data = {**DATA, "served_model_name": "tiny-a", "max_model_len": 4096}
    failing = rendering_for(settings_for_host(failing_data))
    fake = rig({LEDGER_PATH: verified_ledger(verified)}, {})
    monkeypatch.setattr(
        serving,
        "smoke",
        lambda r, data: SmokeReport([SmokeCheck("fake", r.hash == verified.hash, "faked: needs a serving stack")]),
    )
    with pytest.raises(PreflightError) as refused:
        serving.after_release(
            rendering=failing,
            rig=rig_settings(failing_data),
            compose="docker-compose",
            kind="deploy",
            run_smoke=True,
            auto_rollback=True,
            keep_images=1,
            ready_timeout_s=5,
        )
    message = str(refused.value)
    assert "not rolled back" in message and "today's data renders the release being undone itself" in message
    assert f"stored rendering {verified.hash[:12]}" in message and "stored rendering missing" in message
    assert "serving again" not in message
    failed = fake.ledger().current  # recorded as failed; no rollback entry, no hash file naming it
    assert (failed.kind, failed.rendering, failed.smoke) == ("deploy", failing.hash, "fail")
    assert len(fake.ledger().releases) == 2
    assert not any(c.startswith("echo ") and RELEASE_HASH_FILE in c for c in fake.commands)
    assert not any("down --remove-orphans" in c for c in fake.commands)  # nothing brought up again
