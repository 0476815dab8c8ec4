"""Soak verdict rules (each with its boundary), the turn schedule, the context check and the memory readers."""

import subprocess
from pathlib import Path

import pytest

from rigkit.errors import ConfigError
from rigkit.validation.card import SoakTurn
from rigkit.validation.procedure import ValidationSettings
from rigkit.validation.soak import (
    CGROUP_PROBE,
    GPU_PROBE,
    MAX_CONSECUTIVE_ERRORS,
    Limits,
    Plan,
    cgroup_used_mib,
    check_fits,
    conversation_tokens,
    gpu_used_mib,
    judge,
    limits_from,
    memory_probe,
    plan_from,
    turn_order,
)

H200 = Path(__file__).parents[1] / "fixtures" / "nvidia-smi" / "h200-x2-ubuntu2404"
PLAN = Plan(sessions=2, turns=3, message_tokens=64, reply_tokens=32)
LIMITS = Limits(memory_growth_mib=200.0, decode_retention_min=0.8, empty_reply_max_fraction=0.5)
SOURCE = "test memory"


def records(plan=PLAN, tps=None, memory=None, empty=(), errors=None):
    """Turns in the order the soak runs them; tps/memory: {session: value} or {(session, turn): value}."""

    def pick(table, session, turn, default):
        table = table or {}
        return table.get((session, turn), table.get(session, default))

    out = []
    for i, (session, turn) in enumerate(turn_order(plan.sessions, plan.turns, plan.open_sessions)):
        error = (errors or {}).get((session, turn))
        out.append(
            SoakTurn(
                session=session,
                turn=turn,
                prompt_tokens=100 * (turn + 1),
                completion_tokens=32,
                decode_tps=None if error else pick(tps, session, turn, 40.0),
                empty_reply=(session, turn) in empty,
                error=error,
                memory_mib=pick(memory, session, turn, 2000.0 + i),
            )
        )
    return out


def test_turn_order_interleaves_two_open_sessions_and_opens_the_next_when_one_ends():
    assert turn_order(3, 2, 2) == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (2, 1)]
    order = turn_order(5, 4, 2)
    assert sorted(order) == [(s, t) for s in range(5) for t in range(4)]
    for session in range(5):
        assert [t for s, t in order if s == session] == [0, 1, 2, 3]
    assert turn_order(1, 3, 2) == [(0, 0), (0, 1), (0, 2)]


def test_clean_run_passes_with_retention_and_growth_from_the_first_clean_session():
    turns = records(tps={0: 40.0, 1: 36.0}, memory={(0, 2): 2100.0, (1, 2): 2150.0})
    report = judge(turns, PLAN, LIMITS, SOURCE)
    assert report.passed, report.failures
    assert (report.baseline_session, report.last_session) == (0, 1)
    assert report.decode_retention == pytest.approx(0.9)
    assert (report.memory_baseline_mib, report.memory_last_mib, report.memory_growth_mib) == (2100.0, 2150.0, 50.0)
    assert (report.turns_run, report.errors, report.answered, report.empty_replies) == (6, 0, 6, 0)


def test_any_error_fails_and_the_baseline_is_the_first_session_without_one():
    turns = records(plan=Plan(3, 2, 64, 32), errors={(0, 1): "timeout: no data for 60 s (client gave up)"})
    report = judge(turns, Plan(3, 2, 64, 32), LIMITS, SOURCE)
    assert not report.passed and report.errors == 1
    assert "1 of 6 turns failed (first: session 0 turn 1: timeout: no data for 60 s" in report.failures[0]
    assert report.baseline_session == 1 and report.last_session == 2


def test_memory_growth_at_the_limit_passes_above_it_fails_with_the_numbers():
    at_limit = judge(records(memory={(0, 2): 2000.0, (1, 2): 2200.0}), PLAN, LIMITS, SOURCE)
    assert at_limit.passed and at_limit.memory_growth_mib == 200.0
    above = judge(records(memory={(0, 2): 2000.0, (1, 2): 2200.5}), PLAN, LIMITS, SOURCE)
    assert above.failures == [
        "memory grew 200.5 MiB (2,000 MiB after the first clean session 0 -> 2,200 MiB after "
        "the last turn; test memory), more than 200 MiB"
    ]


def test_memory_before_the_baseline_does_not_count():
    """Growth is measured from the end of the first clean session: warm-up allocations before it are free."""
    memory = {(0, 0): 500.0, (1, 0): 900.0, (0, 1): 1800.0, (1, 1): 1900.0, (0, 2): 2000.0, (1, 2): 2010.0}
    report = judge(records(memory=memory), PLAN, LIMITS, SOURCE)
    assert report.passed and report.memory_growth_mib == 10.0


def test_decode_retention_at_the_minimum_passes_below_it_fails_with_the_numbers():
    assert judge(records(tps={0: 50.0, 1: 40.0}), PLAN, LIMITS, SOURCE).passed
    report = judge(records(tps={0: 50.0, 1: 39.5}), PLAN, LIMITS, SOURCE)
    assert report.decode_retention == pytest.approx(0.79)
    assert report.failures == [
        "decode retention 79.0%: session 1 decoded 39.5 tok/s vs 50.0 tok/s in the first clean session 0 (at least 80%)"
    ]


def test_retention_is_the_ratio_of_session_means():
    report = judge(records(tps={(0, 0): 60.0, (0, 1): 50.0, (0, 2): 40.0, 1: 45.0}), PLAN, LIMITS, SOURCE)
    assert report.decode_tps_baseline == pytest.approx(50.0) and report.decode_retention == pytest.approx(0.9)


def test_empty_replies_at_the_fraction_fail_just_below_pass():
    half = judge(records(empty={(0, 0), (1, 1), (0, 2)}), PLAN, LIMITS, SOURCE)
    assert half.failures == ["3 of 6 answered turns got an empty reply (50%, the limit is below 50%)"]
    assert judge(records(empty={(0, 0), (1, 1)}), PLAN, LIMITS, SOURCE).passed


def test_errored_turns_do_not_count_as_answered_for_empty_replies():
    plan = Plan(3, 2, 64, 32)
    report = judge(records(plan=plan, empty={(1, 0), (2, 1)}, errors={(0, 0): "E", (0, 1): "E"}), plan, LIMITS, SOURCE)
    assert report.answered == 4 and report.empty_replies == 2
    assert "2 of 4 answered turns got an empty reply (50%" in " ".join(report.failures)


def test_a_rule_that_could_not_be_measured_fails():
    no_memory = judge(records(memory={(1, 2): None}), PLAN, LIMITS, SOURCE)
    assert no_memory.failures == ["memory growth not measured: test memory gave no reading after the last turn"]
    no_decode = judge(records(tps={1: None}), PLAN, LIMITS, SOURCE)
    assert no_decode.failures == [
        "decode retention not measured: no decode speed in session 1 (replies of fewer than 2 tokens?)"
    ]


def test_no_clean_session_fails_without_a_baseline():
    errors = {(0, 0): "E", (1, 0): "E"}
    report = judge(records(errors=errors), PLAN, LIMITS, SOURCE)
    assert report.baseline_session is None and report.decode_retention is None and report.memory_growth_mib is None
    assert any("no conversation ran all its turns without an error" in f for f in report.failures)


def test_a_soak_stopped_early_names_the_turns_that_ran():
    stopped = records(errors={(0, 1): "E", (1, 1): "E", (0, 2): "E"})[:5]
    report = judge(stopped, PLAN, LIMITS, SOURCE)
    assert (
        f"only 5 of 6 turns ran: the soak stopped after {MAX_CONSECUTIVE_ERRORS} failed turns in a row"
        in report.failures
    )


def test_conversation_must_fit_the_served_context():
    plan = Plan(sessions=20, turns=5, message_tokens=256, reply_tokens=128)
    assert conversation_tokens(plan) == 5 * (256 + 128 + 16)
    check_fits(plan, 2000)
    check_fits(plan, None)  # the server did not say: the engine refuses what does not fit, counted as an error
    with pytest.raises(ConfigError) as refused:
        check_fits(plan, 1999)
    assert refused.value.field == "validate_soak_turns" and "validate_soak_turns <= 4" in str(refused.value)


def test_settings_declare_the_soak_off_by_default_with_the_issue_thresholds():
    settings = ValidationSettings.from_data({})
    assert settings.soak_sessions == 0
    assert limits_from(settings) == Limits(200.0, 0.8, 0.5)
    assert plan_from(ValidationSettings.from_data({"validate_soak_sessions": "20"})).sessions == 20


@pytest.mark.parametrize(
    "name, value",
    [
        ("validate_soak_sessions", 1),
        ("validate_soak_decode_retention_min", 1.5),
        ("validate_soak_empty_reply_max_fraction", 0),
    ],
)
def test_bad_soak_settings_are_refused_naming_the_field(name, value):
    with pytest.raises(ConfigError) as refused:
        ValidationSettings.from_data({name: value})
    assert refused.value.field == name


def test_gpu_memory_used_from_real_nvidia_smi_outputs():
    idle = gpu_used_mib((H200 / "query-gpu-noheader.csv").read_text())
    busy = gpu_used_mib((H200 / "query-gpu-busy-noheader.csv").read_text())
    assert idle == 2 * (143771 - 143156)
    assert busy == (143771 - 114018) + (143771 - 137860)
    assert gpu_used_mib("") is None


def test_cgroup_memory_v1_as_read_on_a_lab_rig_and_v2():
    # captured from CGROUP_MEMORY_COMMAND on lab rig1 (cgroup v1 on this VM)
    v1 = "current 1356165120\ntotal_inactive_file 12288\n"
    assert cgroup_used_mib(v1) == pytest.approx((1356165120 - 12288) / 2**20)
    assert cgroup_used_mib("current 4294967296\ninactive_file 1073741824\n") == 3072.0
    assert cgroup_used_mib("current \n") is None


def test_memory_probe_picks_the_cgroup_on_a_host_without_gpus():
    def local_shell(command):
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None

    if local_shell("command -v nvidia-smi"):
        pytest.skip("this host has nvidia-smi")
    assert memory_probe(local_shell) is CGROUP_PROBE


def test_memory_probe_picks_nvidia_smi_where_it_lists_gpus():
    # a fake shell: nvidia-smi cannot run here (no GPU); its answer is a real capture
    answer = (H200 / "query-gpu-busy-noheader.csv").read_text()

    def shell(command):
        return answer if command.startswith("nvidia-smi") else None

    probe = memory_probe(shell)
    assert probe is GPU_PROBE and probe.read(shell) == 35664.0
