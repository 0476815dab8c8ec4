"""rigkit/files/ttft_probe.py run as on a rig: the exact command RigProbe sends over SSH, run here by a local
shell (the probe is standard library only), against the fake OpenAI-compatible server on loopback."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Optional

import pytest
from fake_openai import FakeOpenAI

from rigkit.files.ttft_probe import OVERHEAD_SAMPLES, api_overhead
from rigkit.remote.client import ServingClient, ServingError
from rigkit.remote.probe import API_OVERHEAD_MODEL, RigProbe


def local_shell(command: str, stdin: str) -> Optional[str]:
    """What validate.py's pyinfra connection does on a rig: run `command` with `stdin`, return its stdout."""
    done = subprocess.run(command, shell=True, input=stdin, capture_output=True, text=True, timeout=60)
    return done.stdout if done.returncode == 0 else None


@pytest.fixture
def server():
    with FakeOpenAI() as fake:
        yield fake


def probed(server: FakeOpenAI, run=local_shell, base_url: Optional[str] = None) -> ServingClient:
    probe = RigProbe(run=run, base_url=base_url or server.url, transport="the rig's loopback (test)")
    return ServingClient(server.url, model="tiny", probe=probe)


def test_the_probe_times_the_first_token_event_not_the_headers_nor_the_end(server):
    server.first_token_delay_s, server.token_gap_s, server.stream_chunks = 0.3, 0.1, 4
    result = probed(server).stream_completion("hello " * 10_000, max_tokens=4, seed=7)
    assert not result.aborted, result.error
    assert result.chunks == 4 and result.completion_tokens == 4 and result.text == " w0 w1 w2 w3"
    # the server sends its headers at once and the first token after 0.3 s, the last 0.3 s later
    assert result.ttft_s >= 0.3
    assert result.total_s - result.ttft_s >= 0.25
    assert result.decode_tps == pytest.approx(3 / 0.3, rel=0.5)


def test_the_probe_sends_the_greedy_request_with_its_seed_and_the_whole_prompt(server):
    prompt = "Session abc. " + "x" * 200_000  # larger than one argv entry may be: the request goes on stdin
    probed(server).stream_completion(prompt, max_tokens=2, seed=1234)
    body = server.completions[-1]
    assert body["prompt"] == prompt and body["temperature"] == 0.0 and body["seed"] == 1234
    assert body["stream"] is True and body["max_tokens"] == 2


def test_a_stream_cut_by_the_server_is_an_aborted_decode_on_the_rig(server):
    server.drop_stream_after = 2
    result = probed(server).stream_completion("hi", max_tokens=8)
    assert result.aborted and result.abort_phase == "decode" and result.chunks == 2
    assert "before [DONE]" in result.error


def test_a_rig_without_python3_is_an_aborted_request_that_says_so(server):
    def no_python(command: str, stdin: str) -> Optional[str]:
        return local_shell(command.replace("python3 ", "python3-missing-on-this-rig ", 1), stdin)

    result = probed(server, run=no_python).stream_completion("hi", max_tokens=2)
    assert result.aborted and result.abort_phase == "prefill" and "python3" in result.error
    assert server.completions == []


def test_a_refused_request_raises_naming_the_status(server):
    with pytest.raises(ServingError, match="404"):
        probed(server, base_url=server.url + "/not-the-api").stream_completion("hi", max_tokens=2)


def test_a_server_that_is_not_listening_is_an_aborted_prefill(server):
    result = probed(server, base_url="http://127.0.0.1:9").stream_completion("hi", max_tokens=2)
    assert result.aborted and result.abort_phase == "prefill" and "Connection" in result.error


def test_the_api_overhead_is_the_same_body_refused_under_a_model_the_server_does_not_serve(server):
    server.api_overhead_s, server.first_token_delay_s, server.stream_chunks = 0.2, 0.3, 2
    result = probed(server).stream_completion("hello " * 1000, max_tokens=2, seed=3, api_overhead=True)
    assert not result.aborted, result.error
    assert 0.2 <= result.api_overhead_s < 0.45 and result.api_overhead_error is None
    assert result.ttft_s >= 0.5  # the overhead request comes before the measured stream, not inside its clock
    assert len(server.refused_completions) == OVERHEAD_SAMPLES  # their median is the figure
    assert all(
        refused["model"] == API_OVERHEAD_MODEL and refused["prompt"] == server.completions[-1]["prompt"]
        for refused in server.refused_completions
    )
    assert len(server.completions) == 1  # the engine saw one request: the window's metrics move once


def test_without_the_flag_no_overhead_request_is_sent(server):
    result = probed(server).stream_completion("hi", max_tokens=2)
    assert result.api_overhead_s is None and server.refused_completions == []


def test_an_overhead_request_the_server_does_not_refuse_is_no_figure_and_says_why(server):
    server.served_names = ["tiny", API_OVERHEAD_MODEL]  # a server that serves any name (a proxy, say)
    result = probed(server).stream_completion("hi", max_tokens=2, api_overhead=True)
    assert result.api_overhead_s is None and "not 404" in result.api_overhead_error
    assert not result.aborted


def test_measure_compares_the_client_figure_less_the_overhead_on_the_controller_too(server):
    from rigkit.validation.measure import measure

    server.api_overhead_s, server.first_token_delay_s = 0.15, 0.2
    measured = measure(ServingClient(server.url, model="tiny"), "hi", max_tokens=2)
    assert measured.ttft_check is not None
    assert measured.ttft_check.api_overhead_s == measured.result.api_overhead_s >= 0.15
    assert measured.ttft_check.compared_s == pytest.approx(measured.result.ttft_s - measured.result.api_overhead_s)


def test_the_overhead_is_the_median_of_its_samples_so_one_stray_sample_does_not_move_it(server):
    delays = iter([0.05, 0.4, 0.05])  # the second 404 is slow (a busy host)
    server.on_refused = lambda body: time.sleep(next(delays))
    measured = api_overhead(f"{server.url}/v1/completions", {"prompt": "hi"}, API_OVERHEAD_MODEL, 10, samples=3)
    assert 0.05 <= measured["overhead_s"] < 0.3 and max(measured["overhead_samples_s"]) >= 0.4


def test_the_probe_request_and_a_probe_that_printed_nothing_read_as_the_rig_answered():
    sent = []

    def rig(answer: Optional[str]):
        def run(command: str, stdin: str) -> Optional[str]:
            sent.append(json.loads(stdin))
            return answer

        return RigProbe(run=run, base_url="http://127.0.0.1:8101/", transport="test")

    answered = rig('progress\n{"ttft_s": 0.03, "total_s": 0.1}\n').stream("/v1/completions", {"n": 1}, 2.0, 30.0, "m")
    assert answered == {"ttft_s": 0.03, "total_s": 0.1}
    assert sent[-1] == {
        "url": "http://127.0.0.1:8101/v1/completions",
        "body": {"n": 1},
        "connect_timeout_s": 2.0,
        "timeout_s": 30.0,
        "overhead_model": "m",
    }
    long_trace = "Traceback " + "x" * 300  # shown cut to its first 200 characters
    for printed, shown in [
        (None, "''"),
        ("", "''"),
        ("Traceback: no module json\n", "'Traceback: no module json'"),
        (long_trace, repr(long_trace[:200])),
    ]:
        assert rig(printed).stream("/v1/completions", {}, 2.0, 30.0) == {
            "error": f"the TTFT probe on the rig printed no result ({shown}): check that the rig has python3",
            "total_s": 0.0,
        }
