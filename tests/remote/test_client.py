"""Client logic: prefill timeouts, the TTFT probe over a tunnel, decode speed from a stream.

Salted prompts are in tests/validation/test_prompts.py, the TTFT cross-check in tests/validation/test_ttft.py, the tunnel in
tests/remote/test_tunnel.py.

Requests against a real vLLM are in tests/lab/test_validation_lab.py.
"""

import http.server
import json
import threading
import time

import pytest
from ssh_rig import ssh_rig  # noqa: F401 (fixture)

from rigkit.paths import REPO_ROOT
from rigkit.prompts import PromptSpec
from rigkit.remote import client, tunnel
from rigkit.remote.client import prefill_timeout
from rigkit.remote.probe import RigProbe


def test_prefill_timeout_scales_with_the_measured_rate_and_has_a_floor():
    # 37K tokens at a measured 850 tokens/s: ~43 s predicted, never cut before 5x that
    assert prefill_timeout(36_807, 850.0) == pytest.approx(client.PREFILL_TIMEOUT_FACTOR * 36_807 / 850.0)
    assert prefill_timeout(100, 10_000.0) == client.MIN_PREFILL_TIMEOUT_S
    # a 255K prefill on a rig that prefills 850 tokens/s must get far more than a 300 s client default
    assert prefill_timeout(255_000, 850.0) > 300 * 4
    assert prefill_timeout(1000, None) == client.UNMEASURED_PREFILL_TIMEOUT_S


def test_the_ttft_probe_runs_on_the_rig_over_the_tunnels_ssh_connection(ssh_rig):
    """The lab's validation streams through this: the probe's source and the request reach the rig over the
    tunnel's own SSH connection, and the rig's python3 times the stream on its loopback."""
    from fake_openai import FakeOpenAI

    data, _ = ssh_rig
    with FakeOpenAI() as api:
        api.first_token_delay_s = 0.2
        port = int(api.url.rsplit(":", 1)[1])
        with tunnel.open_tunnel(data, "127.0.0.1", port) as forward:
            probe = RigProbe.on("rig1", forward.run, "127.0.0.1", port)
            result = client.ServingClient(forward.url, model="tiny", probe=probe).stream_completion("hi", max_tokens=3)
            assert forward.run("exit 3", "") is None
    assert not result.aborted, result.error
    assert result.text == " w0 w1 w2" and result.ttft_s >= 0.2
    assert probe.base_url == f"http://127.0.0.1:{port}" and "rig1's loopback" in probe.transport


EVENT_GAP_S = 0.05


@pytest.fixture
def sse_server_with_empty_token_events():
    """A real HTTP server streaming five token events EVENT_GAP_S apart, the last ones with empty text
    (what vLLM sends while the detokenizer holds back a partial UTF-8 sequence), then usage and [DONE]."""
    texts = ["a", "", "b", "", ""]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked, as vLLM's server streams: each event arrives as sent

        def send_chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            for i, text in enumerate(texts):
                if i:
                    time.sleep(EVENT_GAP_S)
                self.send_chunk(f'data: {{"choices": [{{"index": 0, "text": "{text}"}}]}}\n\n'.encode())
            usage = {"prompt_tokens": 7, "completion_tokens": len(texts)}
            self.send_chunk(f'data: {{"choices": [], "usage": {json.dumps(usage)}}}\n\ndata: [DONE]\n\n'.encode())
            self.send_chunk(b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", len(texts)
    server.shutdown()


def test_decode_speed_counts_token_events_with_empty_text(sse_server_with_empty_token_events):
    url, events = sse_server_with_empty_token_events
    result = client.ServingClient(url, model="tiny").stream_completion("hi", max_tokens=events)
    assert result.completion_tokens == events and result.chunks == events and result.text == "ab"
    # the decode interval spans every token event: the server's sleeps between the first and the last,
    # less at most one gap when a loaded machine delivers the first two events together; timing only
    # non-empty text would end it two gaps early
    decode_interval = (events - 1) / result.decode_tps
    assert decode_interval >= (events - 2) * EVENT_GAP_S


IDLE_METRICS = (REPO_ROOT / "tests" / "fixtures" / "metrics" / "00-idle.txt").read_text()  # the lab's, block_size 128


@pytest.fixture
def tokenizing_server():
    """A real HTTP server: /tokenize counts `state["tokens"]` (129: 1 + one lab block) for any prompt, one more per
    trailing newline; /metrics serves a captured lab scrape, or 404 when `state["metrics"]` is False."""
    state = {"metrics": True, "tokenized": 0, "tokens": 129}

    class Handler(http.server.BaseHTTPRequestHandler):
        def reply(self, status: int, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.reply(200, IDLE_METRICS) if state["metrics"] else self.reply(404, "")

        def do_POST(self):
            prompt = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["prompt"]
            state["tokenized"] += 1
            self.reply(200, json.dumps({"count": state["tokens"] + len(prompt) - len(prompt.rstrip("\n"))}))

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()


def test_a_prompt_one_token_past_a_block_is_nudged_off_it(tokenizing_server):
    url, state = tokenizing_server
    prompt = client.ServingClient(url, model="tiny").build_prompt(PromptSpec("narrative", 129, seed=3))
    assert prompt.tokens == 130 and prompt.text.endswith("\n") and prompt.tokens_exact
    state["metrics"] = False  # the block size unknown: the prompt as drafted
    prompt = client.ServingClient(url, model="tiny").build_prompt(PromptSpec("narrative", 129, seed=3))
    assert prompt.tokens == 129


def test_a_prompt_of_whole_blocks_is_nudged_past_both_edges(tokenizing_server):
    url, state = tokenizing_server
    state["tokens"] = 256  # two lab blocks: the GPU cache stops a block short; 257 is the ExampleConnector's miss
    prompt = client.ServingClient(url, model="tiny").build_prompt(PromptSpec("narrative", 256, seed=3))
    assert prompt.tokens == 258 and prompt.text.endswith("\n\n")
