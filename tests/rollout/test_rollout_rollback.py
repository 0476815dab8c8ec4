"""rigkit.rollout.rollback: the rolling rollback through the router. Its decisions as data (the options refused, the
batch, when a rig is back), then the whole rollback over fake rigs: test_rollout_drain's router stand-in and real
captured pyinfra output (rig-stopped-mid-deploy.txt: rig4's run succeeded, rig6's failed), renamed to the rig each
batch runs on."""

from __future__ import annotations

import argparse

import pytest
from test_rollout_drain import GATEWAY, GATEWAY_ROUTER, RoutedFleet, worker
from test_rollout_run import NEW, OLD, ROLLED_BACK, STOPPED_MID_DEPLOY, host_data, rendering_hash

from rigkit.commands import deploy as deploy_command
from rigkit.errors import ConfigError
from rigkit.fleet import deploy as fleet_deploy_module
from rigkit.fleet import outcome as fleet_outcome
from rigkit.fleet import pyinfra_args
from rigkit.rollout import rollback as rollout_rollback
from rigkit.rollout.record import RolloutRecord, record_path
from rigkit.rollout.rollback import (
    NO_RELEASE,
    VERIFY_STEP,
    refuse_rollout_options,
    rollback_batch,
    rollback_failure,
    run_rolling_rollback,
)
from rigkit.rollout.state import ReleaseState
from rigkit.serving.ledger import DEPLOY_KIND, ROLLBACK_KIND, SMOKE_FAIL, SMOKE_PASS, Release
from rigkit.settings.defaults import ROLLOUT_VARIABLES
from rigkit.settings.variables import resolve

OK_RUN = fleet_outcome.RigOutcome("rig4")
RENDERING = "a" * 64  # the verified rendering the rig runs after its rollback
NOT_GIVEN = {"--canary": None, "--on-failure": None, "--recheck-canaries": None}


# --- the options a rollback has no use for, refused before any rig is touched ------------------------------------


@pytest.mark.parametrize(
    "option, value",
    [
        ("--canary", 1),
        ("--canary", 0),
        ("--on-failure", "rollback"),
        ("--on-failure", "leave"),
        ("--recheck-canaries", True),
    ],
)
def test_an_option_a_rollback_has_no_use_for_is_refused_naming_it_and_the_fix(option, value):
    with pytest.raises(ConfigError) as refused:
        refuse_rollout_options({**NOT_GIVEN, option: value})
    assert (refused.value.field, refused.value.value) == (option, value)
    assert "makes no sense with rollback.py" in refused.value.problem
    assert refused.value.fix.startswith(f"drop {option}") and "--batch N" in refused.value.fix


def test_no_such_option_given_refuses_nothing():
    refuse_rollout_options(NOT_GIVEN)
    refuse_rollout_options({**NOT_GIVEN, "--recheck-canaries": False})


# --- the batch: the flag, else the fleet's one rollout_batch ------------------------------------------------------


def section(**data) -> dict:
    return resolve(ROLLOUT_VARIABLES, data)


@pytest.mark.parametrize(
    "sections, flag, batch",
    [
        ({"rig4": section(), "rig5": section()}, None, 0),  # nothing asked: the plain run, all at once
        ({"rig4": section(rollout_batch=1), "rig5": section(rollout_batch=1)}, None, 1),
        ({"rig4": section(rollout_batch=1), "rig5": section(rollout_batch=1)}, 2, 2),  # the flag wins
        ({"rig4": section(rollout_batch=1), "rig5": section(rollout_batch=3)}, 1, 1),
        # a deploy's rollout data that does not apply to a rollback, even where the rigs disagree on it
        (
            {"rig4": section(rollout_canary=1, rollout_batch=2), "rig5": section(rollout_canary=3, rollout_batch=2)},
            None,
            2,
        ),
    ],
)
def test_the_batch_is_the_flag_else_the_fleets_one_rollout_batch(sections, flag, batch):
    assert rollback_batch(sections, flag) == batch


@pytest.mark.parametrize(
    "sections, flag",
    [({"rig4": section(rollout_batch=1), "rig5": section(rollout_batch=2)}, None), ({"rig4": section()}, -1)],
)
def test_a_batch_the_rigs_disagree_on_or_a_bad_one_is_refused(sections, flag):
    with pytest.raises(ConfigError) as refused:
        rollback_batch(sections, flag)
    assert refused.value.field == "rollout_batch"


# --- when a rig is back: its run succeeded and its ledger says a verified rollback --------------------------------


def entry(kind=ROLLBACK_KIND, smoke=SMOKE_PASS, rendering=RENDERING, note="") -> Release:
    return Release(OLD, "cpu-lab", "k", kind=kind, smoke=smoke, rendering=rendering, note=note)


ROLLED_BACK_RUN = fleet_outcome.summarize(ROLLED_BACK, ["rig4"])["rig4"]  # never ready, rolled back: run failed

BACK_OR_NOT = [
    # (case, the run's outcome, the rig's state after it, None when back / (step, words in the why))
    ("verified rollback", OK_RUN, ReleaseState(RENDERING, entry()), None),
    (
        "a failed run, though its automatic rollback left a passing rollback entry",
        ROLLED_BACK_RUN,
        ReleaseState(RENDERING, entry(note="automatic: rollback of ... failed")),
        ("serving | Smoke, ledger, prune", "rolled back to"),
    ),
    (
        "unreadable after the run",
        OK_RUN,
        ReleaseState(unreadable="Connection refused"),
        ("read the rig", "Connection refused"),
    ),
    ("no ledger", OK_RUN, ReleaseState(RENDERING), (VERIFY_STEP, NO_RELEASE)),
    (
        "still the deploy",
        OK_RUN,
        ReleaseState(RENDERING, entry(kind=DEPLOY_KIND)),
        (VERIFY_STEP, "current entry is a deploy, not a rollback"),
    ),
    (
        "smoke failed",
        OK_RUN,
        ReleaseState(RENDERING, entry(smoke=SMOKE_FAIL, note="chat: 500")),
        (VERIFY_STEP, "smoke is fail, not pass (chat: 500)"),
    ),
    (
        "smoke never ran",
        OK_RUN,
        ReleaseState(RENDERING, entry(smoke=None)),
        (VERIFY_STEP, "smoke is not checked, not pass"),
    ),
    (
        "another rendering runs",
        OK_RUN,
        ReleaseState("b" * 64, entry()),
        (VERIFY_STEP, "rendering aaaaaaaaaaaa is not the verified rendering the rig runs (bbbbbbbbbbbb)"),
    ),
    (
        "no verified rendering",
        OK_RUN,
        ReleaseState("", entry()),
        (VERIFY_STEP, "is not the verified rendering the rig runs (none)"),
    ),
    (
        "an entry without a rendering",
        OK_RUN,
        ReleaseState(RENDERING, entry(rendering=None)),
        (VERIFY_STEP, "rendering none is not"),
    ),
]


@pytest.mark.parametrize("case, outcome, state, expected", BACK_OR_NOT, ids=[case[0] for case in BACK_OR_NOT])
def test_a_rig_is_back_only_when_its_run_succeeded_on_a_verified_rollback(case, outcome, state, expected):
    failure = rollback_failure("rig4", outcome, state)
    if expected is None:
        assert failure is None
        return
    step, words = expected
    assert failure is not None, f"{case}: counted as back"
    assert (failure.rig, failure.step) == ("rig4", step)
    assert words in failure.why, failure.why


# --- the whole rolling rollback, through the router stand-in -------------------------------------------------------


def capture_for(rig: str, fails: bool) -> str:
    """The captured run renamed: ``rig`` as its rig4 (whose run succeeded) or as its rig6 (whose run failed)."""
    if fails:
        return STOPPED_MID_DEPLOY.replace("rig4", "rig9").replace("rig6", rig)
    return STOPPED_MID_DEPLOY.replace("rig6", "rig8").replace("rig4", rig)


class RollingBack(RoutedFleet):
    """Rigs on the new release, in the router; rollback.py's run (one rig a batch) succeeds but on ``fails``, and a
    rig it succeeded on runs the old rendering with a passing rollback as its ledger's current entry (``entries``
    overrides what a rig's ledger then says)."""

    def __init__(self, monkeypatch, rigs, fails=(), entries=None):
        super().__init__(monkeypatch, rigs)
        self.fails, self.entries = set(fails), dict(entries or {})
        self.verified = {rig: rendering_hash(rig, NEW) for rig in rigs}
        self.current = {
            rig: Release(NEW, "cpu-lab", "k", smoke=SMOKE_PASS, rendering=hash_) for rig, hash_ in self.verified.items()
        }
        monkeypatch.setattr(rollout_rollback, "read_states", self.read)

    def pyinfra(self, argv):
        rigs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--limit"]
        assert len(rigs) == 1, "one rig a batch: the capture is renamed to it"
        self.output = capture_for(rigs[0], rigs[0] in self.fails)
        result = super().pyinfra(argv)  # a rig whose run succeeded is on the old rendering now
        if rigs[0] not in self.fails:
            self.current[rigs[0]] = self.entries.get(rigs[0]) or Release(
                OLD, "cpu-lab", "k", kind=ROLLBACK_KIND, smoke=SMOKE_PASS, rendering=self.verified[rigs[0]]
            )
        return result

    def read(self, hosts, rigs):
        return {rig: ReleaseState(self.verified[rig], self.current[rig]) for rig in rigs}


def roll_back(records, rigs, batch=1, limit=None, **data):
    """The rolling rollback over ``limit`` (all of ``rigs`` by default), the router on GATEWAY routing to ``rigs``,
    its record in ``records``."""
    hosts = {rig: {"data": host_data(rig, NEW, **data), "groups": ["lab"]} for rig in rigs}
    hosts[GATEWAY] = {"data": {"ssh_hostname": "127.0.0.1"}, "groups": ["routers"]}
    return run_rolling_rollback(
        "inventory/fleet.py", ["--data", "rollback_to=" + OLD], hosts, limit or rigs, batch, records
    )


@pytest.fixture(autouse=True)
def quick_idle(monkeypatch):
    from rigkit.rollout import drain as rollout_drain

    monkeypatch.setattr(rollout_drain, "wait_idle", lambda reading, url: [reading() for _ in range(3)])


def drained(rig: str) -> list:
    return [("remove", worker(rig)), ("idle", rig), ("rollback.py", rig)]


def test_each_rig_leaves_the_router_for_its_rollback_and_returns_once_it_is_verified(monkeypatch, tmp_path):
    fake = RollingBack(monkeypatch, ["rig4", "rig5", "rig6"])
    status, summary = roll_back(tmp_path, ["rig4", "rig5", "rig6"])
    assert status == 0, summary
    assert fake.steps() == [
        *drained("rig4"),
        ("add", worker("rig4")),
        *drained("rig5"),
        ("add", worker("rig5")),
        *drained("rig6"),
        ("add", worker("rig6")),
    ]
    assert sorted(fake.router.workers) == [worker(rig) for rig in ["rig4", "rig5", "rig6"]]
    assert all(fake.verified[rig] == rendering_hash(rig, OLD) for rig in ["rig4", "rig5", "rig6"])
    assert all(deploy == "rollback.py" for deploy, _ in fake.runs)
    flat = " ".join(summary.split())
    assert "router on gw: 3 rigs routed, each drained before its rollback and back after its smoke" in flat
    assert "batch 3 (3/3): rig6: passed rig6: rolled back and verified; now" in flat
    assert "rollback complete: 3 rigs on a verified rollback" in flat


def test_the_pyinfra_arguments_pass_through_with_one_limit_a_batch(monkeypatch, tmp_path):
    fake = RollingBack(monkeypatch, ["rig4", "rig5"])
    argv: list = []
    monkeypatch.setattr(pyinfra_args, "run_pyinfra_streaming", lambda args: argv.append(args) or fake.pyinfra(args))
    roll_back(tmp_path, ["rig4", "rig5"])
    assert [args[-2:] for args in argv] == [["inventory/fleet.py", "rollback.py"]] * 2
    assert [args[args.index("--limit") : -2] for args in argv] == [["--limit", "rig4"], ["--limit", "rig5"]]
    assert all(["--data", "rollback_to=" + OLD] == args[2:4] for args in argv)


def test_a_failed_rollback_halts_keeps_the_rig_out_and_prints_the_command_that_adds_it_back(monkeypatch, tmp_path):
    fake = RollingBack(monkeypatch, ["rig4", "rig5", "rig6"], fails={"rig5"})
    status, summary = roll_back(tmp_path, ["rig4", "rig5", "rig6"])
    assert status == 1
    assert fake.steps() == [*drained("rig4"), ("add", worker("rig4")), *drained("rig5")]  # rig6: untouched
    assert sorted(fake.router.workers) == [worker("rig4"), worker("rig6")]
    assert fake.verified["rig6"] == rendering_hash("rig6", NEW)
    flat = " ".join(summary.split())
    assert "HALTED in batch 2 (2 of 3)" in flat and 'rig5 failed at step "serving | Pull the image' in flat
    assert "batch 3 (3/3): rig6: not reached, untouched (each serves the release it had)" in flat
    assert "router on gw: 3 rigs routed" in flat  # as the rollback began
    assert "rig5: left out of the router (it failed at serving | Pull the image" in flat
    assert "the re-run that gets it verified puts it back, or by hand" in flat
    assert f"    curl -X POST '{GATEWAY_ROUTER}/add_worker?url={worker('rig5')}'  # on gw" in summary.splitlines()


def test_the_re_run_puts_the_rig_a_halted_rollback_left_out_back_once_its_rollback_is_verified(monkeypatch, tmp_path):
    fake = RollingBack(monkeypatch, ["rig4", "rig5", "rig6"], fails={"rig5"})
    assert roll_back(tmp_path, ["rig4", "rig5", "rig6"])[0] == 1
    assert RolloutRecord.from_json(record_path("inventory/fleet.py", tmp_path).read_text()).out_of_router == {
        "rig5": [GATEWAY]
    }
    fake.fails.clear()
    fake.events.clear()
    status, summary = roll_back(tmp_path, ["rig4", "rig5", "rig6"])
    assert status == 0, summary
    # rig4 finds its rollback done (rolled back again, No Change on a real rig); rig5 is out already: no drain
    assert fake.steps() == [
        *drained("rig4"),
        ("add", worker("rig4")),
        ("rollback.py", "rig5"),
        ("add", worker("rig5")),
        *drained("rig6"),
        ("add", worker("rig6")),
    ]
    assert sorted(fake.router.workers) == [worker(rig) for rig in ["rig4", "rig5", "rig6"]]
    assert RolloutRecord.from_json(record_path("inventory/fleet.py", tmp_path).read_text()).out_of_router == {}
    assert "rig5: back in the router" in " ".join(summary.split())


@pytest.mark.parametrize(
    "entry_, why",
    [
        (Release(NEW, "cpu-lab", "k", kind=DEPLOY_KIND, smoke=SMOKE_PASS), "current entry is a deploy, not a rollback"),
        (Release(OLD, "cpu-lab", "k", kind=ROLLBACK_KIND, smoke=SMOKE_FAIL), "smoke is fail, not pass"),
    ],
)
def test_a_run_that_succeeded_on_a_ledger_without_a_verified_rollback_halts_too(monkeypatch, tmp_path, entry_, why):
    fake = RollingBack(monkeypatch, ["rig4", "rig5"], entries={"rig4": entry_})
    status, summary = roll_back(tmp_path, ["rig4", "rig5"])
    assert status == 1
    assert fake.steps() == drained("rig4") and worker("rig4") not in fake.router.workers
    assert why in " ".join(summary.split())


def test_a_batch_that_would_drain_every_routed_rig_or_an_unreadable_rig_refuses_before_any_rig_is_touched(
    monkeypatch, tmp_path
):
    fake = RollingBack(monkeypatch, ["rig4", "rig5"])
    with pytest.raises(ConfigError) as every:
        roll_back(tmp_path, ["rig4", "rig5"], batch=2)
    assert every.value.field == "rollout_batch" and "no rig left to serve" in str(every.value)
    assert every.value.fix.startswith("pass --batch below 2")
    monkeypatch.setattr(
        rollout_rollback,
        "read_states",
        lambda hosts, rigs: {
            rig: ReleaseState(unreadable="timed out") if rig == "rig5" else ReleaseState() for rig in rigs
        },
    )
    with pytest.raises(ConfigError) as unreadable:
        roll_back(tmp_path, ["rig4", "rig5"])
    assert unreadable.value.field == "rig5" and "cannot be read before" in str(unreadable.value)
    assert fake.events == [] and fake.runs == []


def test_bad_data_refuses_before_any_rig_is_touched_with_or_without_a_router(monkeypatch, tmp_path):
    fake = RollingBack(monkeypatch, ["rig4", "rig5"])
    with pytest.raises(ConfigError) as routed:
        roll_back(tmp_path, ["rig4", "rig5"], serving_port="eighty")
    hosts = {"rig4": {"data": host_data("rig4", NEW)}, "rig5": {"data": host_data("rig5", NEW, serving_port="eighty")}}
    with pytest.raises(ConfigError) as alone:
        run_rolling_rollback("inventory/fleet.py", [], hosts, ["rig4", "rig5"], 1, tmp_path)
    assert routed.value.field == alone.value.field == "serving_port"
    assert fake.events == [] and fake.runs == []


def test_a_limit_rolls_back_the_rigs_it_names_and_the_others_keep_serving(monkeypatch, tmp_path):
    fake = RollingBack(monkeypatch, ["rig4", "rig5", "rig6"])
    status, summary = roll_back(tmp_path, ["rig4", "rig5", "rig6"], limit=["rig4", "rig5"])
    assert status == 0, summary
    assert fake.steps() == [*drained("rig4"), ("add", worker("rig4")), *drained("rig5"), ("add", worker("rig5"))]
    assert fake.verified["rig6"] == rendering_hash("rig6", NEW) and worker("rig6") in fake.router.workers


def test_without_a_router_the_batches_run_without_drains(monkeypatch, tmp_path):
    fake = RollingBack(monkeypatch, ["rig4", "rig5"])
    hosts = {rig: {"data": host_data(rig, NEW), "groups": ["lab"]} for rig in ["rig4", "rig5"]}
    status, summary = run_rolling_rollback("inventory/fleet.py", [], hosts, ["rig4", "rig5"], 1, tmp_path)
    assert status == 0 and fake.steps() == [("rollback.py", "rig4"), ("rollback.py", "rig5")]
    assert "router" not in summary


# --- the command: `rigkit deploy INVENTORY --deploy rollback.py` ---------------------------------------------------


def deploy_args(inventory, *argv, deploy="rollback.py") -> argparse.Namespace:
    """rigkit deploy's arguments as fleet.run reads them (its own options wherever they stand)."""
    parser = argparse.ArgumentParser()
    deploy_command.add_arguments(parser)
    return deploy_command.own_options_from_remainder(parser.parse_args([str(inventory), "--deploy", deploy, *argv]))


@pytest.fixture()
def inventory(tmp_path):
    """Two rigs (rollout_batch 1 in their data) behind a router; a key file, so their connection data passes."""
    key = tmp_path / "id_lab"
    key.write_text("not a key: nothing connects in these tests\n")
    rigs = [(rig, host_data(rig, NEW, ssh_key=str(key), rollout_batch=1)) for rig in ["rig4", "rig5"]]
    path = tmp_path / "routed.py"
    gateway = {"ssh_hostname": "127.0.0.1", "ssh_key": str(key)}
    path.write_text(f"fleet = {rigs!r}\nrouters = [({GATEWAY!r}, {gateway!r})]\n")
    return path


def test_the_command_refuses_a_rollouts_options_before_reading_the_inventory(monkeypatch, capsys):
    monkeypatch.setattr(deploy_command, "select", lambda *a, **k: pytest.fail("the inventory was read"))
    assert deploy_command.run(deploy_args("inventory/none.py", "--batch", "1", "--canary", "1")) == 2
    err = capsys.readouterr().err
    assert "refused before any rig was touched: --canary=1: makes no sense with rollback.py" in err
    assert "Fix: drop --canary" in err
    assert deploy_command.run(deploy_args("inventory/none.py", "--recheck-canaries")) == 2


def test_the_command_rolls_back_by_the_data_s_batch_and_a_flag_overrides_it(monkeypatch, inventory):
    asked: list = []
    monkeypatch.setattr(
        rollout_rollback,
        "run_rolling_rollback",
        lambda inv, args, hosts, names, batch: asked.append((names, batch, args)) or (0, "summary"),
    )
    assert rollout_rollback.rolling_rollback_command(deploy_args(inventory, "--limit", "rig4,rig5")) == 0
    assert rollout_rollback.rolling_rollback_command(deploy_args(inventory, "--batch", "2", "--limit", "rig5")) == 0
    assert asked == [(["rig4", "rig5"], 1, ["--limit", "rig4", "--limit", "rig5"]), (["rig5"], 2, ["--limit", "rig5"])]
    # --batch 0 asks for the plain run: rollback.py on every rig at once, the router untouched
    assert rollout_rollback.rolling_rollback_command(deploy_args(inventory, "--batch", "0")) is None


def test_the_plain_run_through_a_router_says_before_pyinfra_starts_that_nothing_is_drained(
    monkeypatch, inventory, capsys
):
    printed_before: list = []

    def pyinfra(argv):
        printed_before.append(capsys.readouterr().out)
        return 0, ""

    monkeypatch.setattr(pyinfra_args, "run_pyinfra_streaming", pyinfra)
    monkeypatch.setattr(fleet_deploy_module, "read_release", lambda name, data: "")
    deploy_command.run(deploy_args(inventory, "--batch", "0", "--limit", "rig4"))
    flat = " ".join(printed_before[0].split())
    assert f"the router on {GATEWAY} is not drained by a run with --all-at-once: a rig it restarts (rig4)" in flat
    assert "without it each rig leaves the router first" in flat


@pytest.mark.parametrize(
    "groups, targeted, said",
    [
        ({"rig4": ["fleet"], "rig5": ["fleet"], "gw": ["routers"]}, ["rig4", "rig5", "gw"], "(rig4, rig5)"),
        ({"rig4": ["fleet"], "gw": ["routers"]}, ["gw"], None),  # only the gateway: no rig restarts
        ({"rig4": ["fleet"], "rig5": ["fleet"]}, ["rig4", "rig5"], None),  # no router
        ({"rig4": ["fleet"], "store": ["kv_stores"], "gw": ["routers"]}, ["store", "rig4"], "(rig4)"),
    ],
)
def test_the_plain_run_note_names_the_rigs_a_router_would_still_send_requests_to(groups, targeted, said):
    from rigkit.rollout.drain import plain_run_note

    note = plain_run_note({name: {"groups": g, "data": {}} for name, g in groups.items()}, targeted)
    assert (note is None) if said is None else (said in note and "router on gw" in note)


@pytest.mark.parametrize("deploy, run", [("deploy.py", "rollout"), ("rollback.py", "rollback")])
def test_a_dry_run_of_a_rollout_or_rolling_rollback_drains_nothing_and_runs_pyinfra_dry_on_every_rig_at_once(
    monkeypatch, inventory, capsys, deploy, run
):
    from rigkit.rollout import drain as rollout_drain
    from rigkit.rollout import run as rollout

    for module, name in [
        (rollout_drain, "router_session"),
        (rollout, "run_rollout"),
        (rollout_rollback, "run_rolling_rollback"),
    ]:
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("a dry run drained, changed or recorded"))
    runs: list = []
    # the lines a dry run prints for these hosts (tests/fleet/test_fleet_outcome.py reads a real one)
    dry = "".join(f"    [{host}] Connected\n" for host in ("rig4", "rig5", GATEWAY)) + "--> Detected changes:\n"
    monkeypatch.setattr(pyinfra_args, "run_pyinfra_streaming", lambda argv: runs.append(argv) or (0, dry))
    monkeypatch.setattr(fleet_deploy_module, "read_release", lambda name, data: "")
    assert deploy_command.run(deploy_args(inventory, "--batch", "1", "--dry", deploy=deploy)) == 0
    assert len(runs) == 1 and "--dry" in runs[0] and "--limit" not in runs[0] and runs[0][-1] == deploy
    flat = " ".join(capsys.readouterr().out.split())
    assert f"--> rigkit {run}, dry run: pyinfra --dry shows what each targeted rig would change" in flat
    plan = f"batch 1: rig4; batch 2: rig5, each rig out of the router on {GATEWAY} meanwhile"
    assert f"The {run} would go: {plan}" in flat
    assert "is not drained by a run without --batch" not in flat
    assert "3 of 3 rigs checked by a dry run (nothing changed)" in flat
