"""rigkit.rollout: the plan, the decisions after each stage, resuming, the rollback knob and the summary, as plain
functions; then the whole rollout over four rigs whose pyinfra runs answer with real captured output
(tests/fixtures/fleet/rig-stopped-mid-deploy.txt: rig4 and rig5 deployed, rig6 failed) and whose canary proves
its cache against the recorded /metrics of a real vLLM CPU run (tests/fixtures/metrics, test_validation)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fake_openai import FakeOpenAI
from test_validation import RecordedRun
from rigkit import fleet, rollout
from rigkit.client import ServingClient
from rigkit.errors import ConfigError
from rigkit.hostdata import rig_settings
from rigkit.ledger import Ledger, Release
from rigkit import rollout_plan, rollout_state, rollout_stage, rollout_summary
from rigkit.rollout_plan import CANARY, RolloutSettings, Stage, plan_stages, refuse_unbatched, rollout_settings
from rigkit.rollout_proof import Proof, prove_cache
from rigkit.rollout_record import RolloutRecord, record_path, resume_record
from rigkit.rollout_stage import StageResult, StageWork, rollback_choice, stage_failures, stage_work
from rigkit.rollout_state import RigState, parse_rig_state
from rigkit.rollout_summary import format_summary
from rigkit.stack import rendering_for
from rigkit.variables import resolve
from rigkit.defaults import ROLLOUT_VARIABLES

FLEET_FIXTURES = Path(__file__).parent / "fixtures" / "fleet"
STOPPED_MID_DEPLOY = (FLEET_FIXTURES / "rig-stopped-mid-deploy.txt").read_text()  # rig4, rig5 ok; rig6 failed
ROLLED_BACK = (FLEET_FIXTURES / "release-rolled-back.txt").read_text()  # rig4: never ready, rolled back
OLD = "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64
NEW = "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "2" * 64
RIGS = ["rig4", "rig5", "rig6", "rig7"]


def host_data(rig: str, image: str, **extra) -> dict:
    return {"serving_profile": "cpu-lab", "serving_image": image, "serving_port": 8100 + int(rig[3:]),
            "ssh_hostname": "127.0.0.1", "ssh_port": 2200 + int(rig[3:]), "_sudo": False, **extra}


def rendering_hash(rig: str, image: str) -> str:
    return rendering_for(rig_settings(host_data(rig, image)).stack).hash


def section(**data) -> dict:
    return resolve(ROLLOUT_VARIABLES, data)


# --- the plan and the settings ------------------------------------------------------------------------------

def test_canaries_first_then_batches_in_inventory_order():
    stages = plan_stages(["a", "b", "c", "d", "e"], canary=1, batch=2)
    assert [(s.label, s.rigs) for s in stages] == [(CANARY, ("a",)), ("batch 1", ("b", "c")), ("batch 2", ("d", "e"))]
    assert [s.rigs for s in plan_stages(["a", "b", "c"], canary=2, batch=0)] == [("a", "b"), ("c",)]
    assert [s.rigs for s in plan_stages(["a", "b", "c"], canary=0, batch=2)] == [("a", "b"), ("c",)]
    assert [(s.label, s.rigs) for s in plan_stages(["a"], canary=3, batch=1)] == [(CANARY, ("a",))]
    assert [(s.label, s.rigs) for s in plan_stages(["a", "b"], 0, 0)] == [(rollout_plan.ALL_AT_ONCE, ("a", "b"))]


def test_settings_agree_across_rigs_or_are_refused_and_a_flag_wins():
    same = {"rig4": section(rollout_canary=1, rollout_batch=2), "rig5": section(rollout_canary=1, rollout_batch=2)}
    assert rollout_settings(same, {}) == RolloutSettings(1, 2, "leave", True)
    differ = {**same, "rig6": section(rollout_canary=2)}
    with pytest.raises(ConfigError) as refused:
        rollout_settings(differ, {})
    assert refused.value.field == "rollout_canary" and "rig6" in str(refused.value)
    assert rollout_settings(differ, {"rollout_canary": 3, "rollout_batch": 1}).canary == 3
    with pytest.raises(ConfigError) as bad:
        rollout_settings(same, {"rollout_on_failure": "maybe"})
    assert bad.value.field == "rollout_on_failure"


@pytest.mark.parametrize("name, value", [("rollout_canary", -1), ("rollout_batch", 1.5),
                                         ("rollout_on_failure", "undo"), ("rollout_cache_proof", "perhaps")])
def test_bad_rollout_data_refused_naming_the_field(name, value):
    with pytest.raises(ConfigError) as refused:
        rig_settings({name: value}, needs_stack=False)
    assert refused.value.field == name


def test_plain_pyinfra_refuses_a_rollout_it_would_run_all_at_once():
    with pytest.raises(ConfigError) as refused:
        refuse_unbatched(section(rollout_canary=1), {})
    assert "rigkit deploy" in str(refused.value) and "rollout_canary=0" in str(refused.value)
    refuse_unbatched(section(rollout_canary=1), {rollout_plan.ROLLOUT_STEP_ENV: "canary"})  # driven by rigkit deploy
    refuse_unbatched(section(), {})  # no rollout set: deploy.py as always


def test_rigkit_deploy_options_are_read_after_the_inventory_too():
    parser = argparse.ArgumentParser()
    fleet.add_arguments(parser)
    args = fleet.own_options_from_remainder(parser.parse_args(
        ["inv.py", "--limit", "rig4", "--canary", "1", "--data", "a=b", "--batch", "2", "--deploy", "rollback.py"]))
    assert (args.canary, args.batch, args.deploy) == (1, 2, "rollback.py")
    assert args.pyinfra_args == ["--limit", "rig4", "--data", "a=b"]
    assert rollout.data_pairs(args.pyinfra_args) == ["a=b"]
    assert rollout.without_limits(["--limit", "rig4,rig5", "-v", "--limit=rig6"]) == ["-v"]


# --- where the fleet stands, and what each stage still has to do -------------------------------------------------

def test_rig_state_from_the_ledger_and_the_verified_hash():
    ledger = Ledger([Release(image=OLD, profile="cpu-lab", knobs_hash="k", smoke="pass", rendering="a" * 64)])
    state = parse_rig_state("a" * 64 + "\n" + rollout_state.STATE_SEPARATOR + "\n" + ledger.to_json())
    assert state.verified == "a" * 64 and state.current.image == OLD
    assert state.release_words() == "111111111111 deploy smoke=pass"
    fresh = parse_rig_state(rollout_state.STATE_SEPARATOR + "\n")
    assert fresh.verified == "" and fresh.current is None and not fresh.unreadable
    assert parse_rig_state(rollout_state.STATE_SEPARATOR + '{"schema": 9}').unreadable


def test_a_resumed_rollout_neither_redeploys_nor_reproves_a_canary_that_passed():
    wanted = {"rig4": "new4", "rig5": "new5", "rig6": "new6"}
    canary, batch = Stage(CANARY, ("rig4",)), Stage("batch 1", ("rig5", "rig6"))
    # killed after the canary's deploy, before its proof: proof only
    states = {"rig4": RigState("new4"), "rig5": RigState("new5"), "rig6": RigState("old6")}
    assert stage_work(canary, states, wanted, proven=[]) == StageWork((), ("rig4",), ("rig4",))
    assert stage_work(canary, states, wanted, proven=["rig4"]) == StageWork((), (), ("rig4",))
    assert stage_work(canary, states, wanted, ["rig4"], recheck_canaries=True) == StageWork(("rig4",), ("rig4",), ())
    # a canary rolled back since it passed is deployed and proven again
    back = {**states, "rig4": RigState("old4")}
    assert stage_work(canary, back, wanted, proven=["rig4"]) == StageWork(("rig4",), ("rig4",), ())
    assert stage_work(canary, back, wanted, [], cache_proof=False).prove == ()
    # a batch: only the rigs not on their wanted rendering
    assert stage_work(batch, states, wanted, proven=[]) == StageWork(("rig6",), (), ("rig5",))


def test_the_record_of_the_same_rollout_is_kept_another_starts_afresh():
    wanted = {"rig4": "new4", "rig5": "new5"}
    states = {"rig4": RigState("old4", Release(OLD, "cpu-lab", "k")), "rig5": RigState("")}
    record = resume_record(None, "inv.py", wanted, states)
    assert record.before == {"rig4": {"rendering": "old4", "image": OLD}, "rig5": {"rendering": "", "image": ""}}
    record.proven, record.upgraded = ["rig4"], ["rig4"]
    moved = {"rig4": RigState("new4"), "rig5": RigState("")}
    again = resume_record(RolloutRecord.from_json(record.to_json()), "inv.py", wanted, moved)
    assert again.proven == ["rig4"] and again.before["rig4"]["rendering"] == "old4"  # the state before the rollout
    other = resume_record(again, "inv.py", {**wanted, "rig5": "newer5"}, moved)
    assert other.proven == [] and other.before["rig4"]["rendering"] == "new4"
    assert RolloutRecord.from_json("{damaged") is None


def test_a_failed_rig_a_rig_off_its_release_and_a_failed_proof_each_halt():
    outcomes = fleet.summarize(ROLLED_BACK, ["rig4"])
    wanted = {"rig4": "new4", "rig5": "new5", "rig6": "new6"}
    states = {"rig4": RigState("old4"), "rig5": RigState("other"), "rig6": RigState("new6")}
    work = StageWork(("rig4", "rig5"), ("rig6",), ())
    failures = stage_failures(work, {**outcomes, "rig5": fleet.RigOutcome("rig5")}, states, wanted,
                              {"rig6": Proof(False, "warm-connector expected, measured cold")})
    assert [(f.rig, f.step) for f in failures] == [("rig4", "serving | Smoke, ledger, prune"), ("rig5", "verify"),
                                                   ("rig6", "cache proof")]
    assert "rolled back to" in failures[0].why and "does not run the wanted rendering" in failures[1].why
    assert stage_failures(work, {"rig4": fleet.RigOutcome("rig4"), "rig5": fleet.RigOutcome("rig5")},
                          {r: RigState(h) for r, h in wanted.items()}, wanted, {"rig6": Proof(True, "ok")}) == []


def test_the_rollback_knob_acts_on_the_rigs_this_rollout_upgraded_only():
    wanted = {"rig4": "new4", "rig5": "new5", "rig6": "new6"}
    record = RolloutRecord("t", "inv.py", before={"rig4": {"rendering": "old4", "image": OLD},
                                                  "rig5": {"rendering": "", "image": ""},
                                                  "rig6": {"rendering": "new6", "image": NEW}},
                           upgraded=["rig4", "rig5"])
    states = {rig: RigState(hash_) for rig, hash_ in wanted.items()}
    assert rollback_choice("leave", record, states, wanted)[0] == []
    roll_back, left = rollback_choice("rollback", record, states, wanted)
    assert roll_back == ["rig4"] and [rig for rig, _ in left] == ["rig5", "rig6"]  # rig6 was on it before
    assert "record began" in dict(left)["rig6"]
    back, words = rollout_stage.rolled_back_words("rig4", record, RigState("old4"))
    assert back and "as before the rollout" in words
    back, words = rollout_stage.rolled_back_words("rig4", record, RigState("new4"))
    assert not back and f"rollback_to={OLD}" in words


@pytest.mark.parametrize("width", [80, 120])
def test_the_summary_names_batch_rig_step_and_why_and_fits_the_terminal(width):
    outcomes = fleet.summarize(ROLLED_BACK, ["rig4"])
    stages = plan_stages(["rig5", "rig4", "rig6"], canary=1, batch=1)
    failure = stage_failures(StageWork(("rig4",), (), ()), outcomes, {"rig4": RigState("old")}, {"rig4": "new"}, {})
    results = [StageResult(stages[0], StageWork(("rig5",), ("rig5",), ()), {"rig5": Proof(True, "cache proof passed")}),
               StageResult(stages[1], StageWork(("rig4",), (), ()), failures=failure)]
    states = {rig: RigState("h", Release(OLD, "cpu-lab", "k", smoke="pass")) for rig in ["rig4", "rig5", "rig6"]}
    text = format_summary(RolloutSettings(1, 1, "leave", True), stages, results, states,
                          left=[("rig5", "left on the new release (rollout_on_failure=leave)")], width=width)
    assert max(len(line) for line in text.splitlines()) <= width, text
    flat = " ".join(text.split())
    assert "HALTED in batch 1 (2 of 3)" in flat
    assert 'rig4 failed at step "serving | Smoke, ledger, prune": ' in flat and "never became ready" in flat
    assert "batch 2 (3/3): rig6: not reached, untouched" in flat
    assert "rig5: left on the new release" in flat and "run the same command again" in flat
    assert rollout_summary.summary_width(300) == 120 and rollout_summary.summary_width(40) == 80


# --- the cache proof: validate.py's procedure, cut short, on recorded /metrics ---------------------------------

def test_the_cache_proof_passes_on_a_real_runs_counters():
    with FakeOpenAI() as server:
        recorded = RecordedRun(server)
        proof = prove_cache(ServingClient(server.url, model="tiny"), {"validate_seed": 1234}, True)
    assert proof.passed, proof.words
    assert "warm-gpu +" in proof.words and "warm-connector +" in proof.words and "fillers" in proof.words
    assert recorded.step == "04-after-warm-connector"  # no restart: the short proof stops at the connector tier


class NoEviction(RecordedRun):
    """After the fillers the session prompt moves no counter: neither the GPU pool nor the connector served it."""

    def completion(self, body: dict) -> None:
        if self.step == "03-after-fillers" and body["prompt"] == self.session_prompt:
            return
        super().completion(body)


def test_the_cache_proof_fails_when_the_connector_tier_is_not_proven():
    with FakeOpenAI() as server:
        NoEviction(server)
        proof = prove_cache(ServingClient(server.url, model="tiny"), {"validate_seed": 1234}, True)
    assert not proof.passed and "warm-connector expected, measured" in proof.words, proof.words


def test_a_proof_that_cannot_reach_the_engine_fails_in_its_words():
    proof = prove_cache(ServingClient("http://127.0.0.1:9", model="tiny"), {}, True, ready_timeout_s=0.5)
    assert not proof.passed and "not ready after" in proof.words, proof.words


# --- the whole rollout with fake rigs: real pyinfra output, real renderings -----------------------------------------

class FakeFleet:
    """Rigs as their verified rendering; a pyinfra run answers with the captured 3-rig output, and each rig it
    reports ok is then on the rendering of the deploy's image (rollback.py: back to the one before)."""

    def __init__(self, monkeypatch, output: str = STOPPED_MID_DEPLOY, kill_in: str = ""):
        self.verified = {rig: rendering_hash(rig, OLD) for rig in RIGS}
        self.runs: list[tuple[str, list[str]]] = []
        self.proved: list[str] = []
        self.output, self.kill_in = output, kill_in
        monkeypatch.setattr(fleet, "run_pyinfra_streaming", self.pyinfra)
        monkeypatch.setattr(rollout, "read_states", self.read)
        monkeypatch.setattr(rollout, "prove_rig", self.prove)

    def pyinfra(self, argv: list[str]):
        import os

        assert os.environ.get(rollout_plan.ROLLOUT_STEP_ENV), "every pyinfra run is marked as driven by rigkit deploy"
        rigs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--limit"]
        deploy = argv[-1]
        self.runs.append((deploy, rigs))
        outcomes = fleet.summarize(self.output, rigs)
        for rig in rigs:
            if outcomes[rig].status == fleet.OK:
                self.verified[rig] = rendering_hash(rig, OLD if deploy == "rollback.py" else NEW)
        if self.kill_in and self.kill_in in rigs:
            raise KeyboardInterrupt  # the controller is killed once the batch's rigs are upgraded
        return 0, self.output

    def read(self, hosts, rigs):
        return {rig: RigState(self.verified[rig]) for rig in rigs}

    def prove(self, rig, data, stack):
        self.proved.append(rig)
        return Proof(True, "cache proof passed (fake)")

    def deployed(self) -> list[str]:
        return [rig for deploy, rigs in self.runs if deploy == "deploy.py" for rig in rigs]


def roll(tmp_path, on_failure="leave", recheck=False):
    hosts = {rig: {"data": host_data(rig, NEW)} for rig in RIGS}
    settings = RolloutSettings(canary=1, batch=1, on_failure=on_failure, cache_proof=True)
    return rollout.run_rollout("inventory/fleet.py", "deploy.py", ["--data", f"serving_image={NEW}"], hosts, RIGS,
                               settings, recheck_canaries=recheck, records=tmp_path)


def test_a_failure_in_the_second_batch_halts_there_and_the_rest_is_untouched(monkeypatch, tmp_path):
    fake = FakeFleet(monkeypatch)
    status, summary = roll(tmp_path)
    assert status == 1
    assert fake.runs == [("deploy.py", ["rig4"]), ("deploy.py", ["rig5"]), ("deploy.py", ["rig6"])]
    assert fake.proved == ["rig4"]
    assert fake.verified["rig7"] == rendering_hash("rig7", OLD)  # never in a run
    assert fake.verified["rig4"] == rendering_hash("rig4", NEW)  # left for the operator (the knob's default)
    flat = " ".join(summary.split())
    assert "HALTED in batch 2 (3 of 4)" in flat and "rig6 failed at step" in flat
    assert "batch 3 (4/4): rig7: not reached, untouched" in flat
    assert "rig4: left on the new release" in flat and "rig5: left on the new release" in flat


def test_the_rollback_knob_brings_the_upgraded_rigs_back(monkeypatch, tmp_path):
    fake = FakeFleet(monkeypatch)
    status, summary = roll(tmp_path, on_failure="rollback")
    assert status == 1 and fake.runs[-1] == ("rollback.py", ["rig4", "rig5"])
    assert all(fake.verified[rig] == rendering_hash(rig, OLD) for rig in RIGS)
    assert "rig4: rolled back" in summary and "rig5: rolled back" in summary
    # the re-run deploys the rolled-back canary again and proves it again
    roll(tmp_path, on_failure="rollback")
    assert fake.runs[4] == ("deploy.py", ["rig4"]) and fake.proved == ["rig4", "rig4"]


def test_a_killed_rollout_continues_where_the_fleet_stands(monkeypatch, tmp_path):
    fake = FakeFleet(monkeypatch, kill_in="rig5")
    with pytest.raises(KeyboardInterrupt):
        roll(tmp_path)
    assert fake.deployed() == ["rig4", "rig5"] and fake.proved == ["rig4"]
    # the re-run's rigs deploy fine: the capture's two good rigs renamed (its failed one is now rig8)
    fake.output = STOPPED_MID_DEPLOY.replace("rig6", "rig8").replace("rig4", "rig6").replace("rig5", "rig7")
    fake.kill_in = ""
    status, summary = roll(tmp_path)
    assert status == 0, summary
    assert fake.deployed() == ["rig4", "rig5", "rig6", "rig7"]  # neither the canary nor rig5 again
    assert fake.proved == ["rig4"]
    assert "cache proof passed in an earlier run" in summary and "rollout complete" in summary
    record = RolloutRecord.from_json(record_path("inventory/fleet.py", tmp_path).read_text())
    assert record.upgraded == RIGS and record.proven == ["rig4"]
    fake.output = STOPPED_MID_DEPLOY
    status, _ = roll(tmp_path, recheck=True)  # asked: the canary is deployed and proven again
    assert status == 0
    assert fake.deployed()[-1:] == ["rig4"] and fake.proved == ["rig4", "rig4"]


def test_a_canary_that_fails_its_release_halts_before_any_other_rig_and_is_not_proven(monkeypatch, tmp_path):
    fake = FakeFleet(monkeypatch, output=ROLLED_BACK)  # rig4: never ready, rolled back by the serving role
    status, summary = roll(tmp_path, on_failure="rollback")
    assert status == 1 and fake.runs == [("deploy.py", ["rig4"])] and fake.proved == []
    assert all(fake.verified[rig] == rendering_hash(rig, OLD) for rig in RIGS)
    flat = " ".join(summary.split())
    assert "HALTED in canary (1 of 4)" in flat and "never became ready" in flat
    assert "batch 1 (2/4): rig5: not reached, untouched" in flat
