"""rigkit validate --url: the tier procedure and card of an endpoint known by URL alone, on the fake OpenAI server
replaying a real vLLM CPU run's /metrics (tests/recorded_run.py); each bad input refused before any request is
measured, naming the option."""

from __future__ import annotations

import json
import socket

import pytest
from fake_openai import FakeOpenAI
from recorded_run import RecordedRun

from rigkit.cli import main
from rigkit.commands.validate import NO_RESTART, card_name


def validate(*args: str) -> int:
    return main(
        ["validate", "--profile", "cpu-lab", "--data", "validate_sessions=1", "--data", "validate_seed=1234", *args]
    )


def test_an_endpoint_by_url_gets_its_card_the_persistent_tier_not_applicable_without_a_restart(tmp_path, capsys):
    with FakeOpenAI() as server:
        recorded = RecordedRun(server)
        assert validate("--url", server.url, "--run-dir", str(tmp_path), "--name", "endpoint") == 0
    assert recorded.step == "04-after-warm-connector"  # cold, warm-gpu, fillers, warm-connector: no restart
    card = json.loads((tmp_path / "endpoint.card.json").read_text())
    assert [tier["expected"] for tier in card["tiers"]] == ["cold", "warm-gpu", "warm-connector"]
    assert all(tier["passed"] for tier in card["tiers"])
    assert card["not_applicable"] == {"warm-persistent": NO_RESTART}
    assert card["repro"]["image_digest"].startswith("unknown (an endpoint rigkit did not deploy")
    assert (tmp_path / "endpoint.md").exists() and (tmp_path / "fleet.md").exists()
    assert card["repro"]["machine_read"] is False  # no GPU listed, and none claimed absent
    assert "| GPUs | not read (an endpoint known by its URL) |" in (tmp_path / "endpoint.md").read_text()
    out = capsys.readouterr().out
    assert out.startswith("endpoint: PASS") and "warm-connector" in out


def restart_on_marker(recorded: RecordedRun, marker) -> None:
    """The fake's engine restarts (its recorded idle text after a restart, a new process start time) once the restart
    command left its marker, as /metrics is next read."""

    def on_metrics() -> None:
        if marker.exists() and recorded.step == "04-after-warm-connector":
            recorded.restart()

    recorded.server.on_metrics = on_metrics


def test_a_restart_command_measures_the_persistent_tier(tmp_path):
    with FakeOpenAI() as server:
        recorded = RecordedRun(server)
        marker = tmp_path / "restarted"
        restart_on_marker(recorded, marker)
        code = validate(
            "--url", server.url, "--run-dir", str(tmp_path), "--name", "e", "--restart-command", f"touch {marker}"
        )
    card = json.loads((tmp_path / "e.card.json").read_text())
    assert code == 0, card["failures"]
    assert [tier["expected"] for tier in card["tiers"]][-1] == "warm-persistent"
    assert card["not_applicable"] == {}


def test_a_restart_command_that_returns_before_the_engine_restarted_is_named(tmp_path, capsys):
    """`kubectl rollout restart` without `rollout status` returns at once: the old engine still answers, its GPU cache
    warm. Measured, the persistent tier would read as warm-gpu, a tier failure that is the command's."""
    with FakeOpenAI() as server:
        RecordedRun(server)
        code = validate("--url", server.url, "--run-dir", str(tmp_path), "--restart-command", "true")
    err = capsys.readouterr().err
    assert code == 1 and "--restart-command='true'" in err and "process_start_time_seconds unchanged" in err, err
    assert "rollout status" in err


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(
    "case, option",
    [
        ("ftp", "--url"),
        ("unreachable", "--url"),
        ("no-metrics", "--metrics-url"),
        ("not-vllm", "--metrics-url"),
        ("metrics-not-http", "--metrics-url"),
        ("lmcache-unreachable", "--lmcache-metrics-url"),
        ("no-profile", "--profile"),
        ("unknown-data", "--data"),
        ("power-selftest", "--data"),
        ("name-a-path", "--name"),
        ("run-dir-a-file", "--run-dir"),
    ],
)
def test_bad_input_is_refused_naming_the_option_before_anything_is_measured(case, option, tmp_path, capsys):
    with FakeOpenAI() as server:
        RecordedRun(server)
        args = {
            "ftp": ["--url", "ftp://127.0.0.1/"],
            "unreachable": ["--url", f"http://127.0.0.1:{closed_port()}"],
            "no-metrics": ["--url", server.url, "--metrics-url", f"{server.url}/nothing-here"],
            "not-vllm": ["--url", server.url],
            "metrics-not-http": ["--url", server.url, "--metrics-url", "127.0.0.1:9/metrics"],
            "lmcache-unreachable": [
                "--url",
                server.url,
                "--lmcache-metrics-url",
                f"http://127.0.0.1:{closed_port()}/m",
            ],
            "no-profile": ["--url", server.url],
            "unknown-data": ["--url", server.url, "--data", "validate_sesions=2"],
            "power-selftest": ["--url", server.url, "--data", "validate_power_selftest=true"],
            "name-a-path": ["--url", server.url, "--name", "../outside"],
            "run-dir-a-file": ["--url", server.url],
        }[case]
        if case == "not-vllm":
            server.metrics_text = "# a router's own metrics\nrouter_requests_total 3\n"
        extra = ["--profile", "no-such-profile"] if case == "no-profile" else []
        if case == "run-dir-a-file":
            a_file = tmp_path.with_name(tmp_path.name + ".file")
            a_file.write_text("")
            extra = ["--run-dir", str(a_file)]
        assert validate(*args, "--run-dir", str(tmp_path), *extra) == 2
        assert server.completions == []  # nothing measured
    err = capsys.readouterr().err
    assert "refused before anything was measured" in err and f"{option}=" in err and "Fix:" in err
    assert not list(tmp_path.iterdir())


SECRET = "sk-rigkit-test-9f3a"


@pytest.mark.parametrize(
    "variable, value, answer",
    [(None, None, "it wants an API key"), ("RIGKIT_TEST_KEY", "sk-wrong", "the API key given was not accepted")],
    ids=["no-key", "wrong-key"],
)
def test_an_endpoint_wanting_a_key_is_refused_until_the_right_one_is_named(
    variable, value, answer, tmp_path, capsys, monkeypatch
):
    with FakeOpenAI() as server:
        RecordedRun(server)
        server.api_key = SECRET
        extra = []
        if variable:
            monkeypatch.setenv(variable, value)
            extra = ["--api-key-env", variable]
        assert validate("--url", server.url, "--run-dir", str(tmp_path), *extra) == 2
        assert server.completions == []
    err = capsys.readouterr().err
    assert "--url=" in err and answer in err and "--api-key-env NAME" in err, err
    assert value is None or value not in err


def test_a_key_variable_that_is_unset_is_refused_by_name(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RIGKIT_TEST_KEY", raising=False)
    assert validate("--url", "http://127.0.0.1:9", "--api-key-env", "RIGKIT_TEST_KEY", "--run-dir", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "--api-key-env='RIGKIT_TEST_KEY'" in err and "unset or empty" in err


def test_the_key_from_its_variable_opens_the_endpoint_and_is_never_shown(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RIGKIT_TEST_KEY", SECRET)
    with FakeOpenAI() as server:
        RecordedRun(server)
        server.api_key = SECRET
        code = validate(
            "--url", server.url, "--api-key-env", "RIGKIT_TEST_KEY", "--run-dir", str(tmp_path), "--name", "e"
        )
        assert server.completions  # measured through the key
    assert code == 0
    out = capsys.readouterr()
    written = "".join(path.read_text() for path in tmp_path.rglob("*") if path.suffix in (".json", ".md"))
    assert SECRET not in out.out + out.err + written


@pytest.mark.parametrize(
    "url, name",
    [("http://vllm.example:8000", "vllm.example-8000"), ("http://[::1]:8000/", "1-8000"), ("https://svc", "svc")],
)
def test_the_default_card_name_is_a_plain_file_name_from_the_url(url, name):
    assert card_name(None, url) == name
