"""A fake OpenAI-compatible serving API on 127.0.0.1 (http.server in a thread), for what the smoke and the
tier validation ask of vLLM: /health, /v1/models, chat and streaming completions, /metrics.

Each answer comes from an attribute a test sets (the served names, the stream's chunk count, its timing and
words, the /metrics text); ``on_completion`` sees each completion's JSON body before it is answered (to move the /metrics a
recorded run would show next); ``drop_stream_after`` cuts a stream after that many chunks, as a dying
engine does. /tokenize answers 404 (the client then estimates prompt sizes, as it does without one). A
completion for a model not in ``served_names`` gets vLLM's 404 before any engine work (it lands in
``refused_completions``); ``api_overhead_s`` is slept before every completion is answered, refused or not, as
the API server's own cost outside the engine's TTFT clock.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
import zlib
from typing import Callable, Optional

FAKE_MAX_MODEL_LEN = 8192


class FakeOpenAI:
    def __init__(self, port: int = 0):
        """port: 0 picks a free one; a given one lets a test stop a server and start another where it was."""
        self.served_names = ["tiny"]
        self.chat_text = "Hello there."
        self.stream_chunks = 16
        self.drop_stream_after: Optional[int] = None
        # the prefill (before the first token event) and the decode gap between token events, slept by the server
        self.first_token_delay_s = 0.0
        self.token_gap_s = 0.0
        self.api_overhead_s = 0.0
        # each token event's text is f" {word}{index}": a test changes the word to serve a different completion
        self.token_word: Callable[[dict], str] = lambda body: "w"
        # the word of token `index` (default: token_word's); with "logprobs" in the body each token event carries
        # vLLM's completion logprobs: the token as "token_id:<n>", its logprob, and a top-k where the runner-up
        # f" {runner_up_word}{index}" is `margin_at(body, index)` nats behind the chosen token
        self.word_at: Callable[[dict, int], str] = lambda body, index: self.token_word(body)
        self.runner_up_word = "r"
        self.margin_at: Callable[[dict, int], float] = lambda body, index: 6.0
        self.metrics_text = ""
        # vLLM's --api-key: every /v1 path wants "Authorization: Bearer <key>", /metrics and /health do not
        self.api_key: Optional[str] = None
        self.on_metrics: Callable[[], None] = lambda: None  # before each /metrics is served
        self.on_completion: Callable[[dict], None] = lambda body: None
        self.on_refused: Callable[[dict], None] = lambda body: None
        self.completions: list[dict] = []
        self.refused_completions: list[dict] = []
        # completions being answered now; with ``running_gauge`` /metrics ends with it as vLLM's
        # vllm:num_requests_running (what a drain waits on)
        self.in_flight = 0
        self.running_gauge = False
        self._in_flight_lock = threading.Lock()
        # the Authorization header of each chat completion (None when absent): what a router sent its workers
        self.chat_authorizations: list = []
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "FakeOpenAI":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    @staticmethod
    def token_id(text: str) -> str:
        return f"token_id:{zlib.crc32(text.encode()) % 151_936}"

    def logprobs(self, body: dict, index: int, text: str) -> dict:
        chosen, margin = -0.01, self.margin_at(body, index)
        others = [f" {self.runner_up_word}{index}"] + [f" z{rank}_{index}" for rank in range(body["logprobs"])]
        top = {self.token_id(text): chosen}
        for rank, other in enumerate(others):
            if len(top) < body["logprobs"] and other != text:
                top[self.token_id(other)] = chosen - margin - 2.0 * rank
        return {"tokens": [self.token_id(text)], "token_logprobs": [chosen], "top_logprobs": [top], "text_offset": [0]}

    def _handler(self):
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet: pytest shows failures, not access lines
                pass

            def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _unauthorized(self) -> bool:
                wanted = fake.api_key and self.path.startswith("/v1")
                if wanted and self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                    self._send(401, b'{"error": "Unauthorized"}')
                    return True
                return False

            def do_GET(self) -> None:
                if self._unauthorized():
                    return
                if self.path == "/health":
                    self._send(200, b"")
                elif self.path == "/v1/models":
                    cards = [
                        {"id": name, "object": "model", "max_model_len": FAKE_MAX_MODEL_LEN}
                        for name in fake.served_names
                    ]
                    self._send(200, json.dumps({"object": "list", "data": cards}).encode())
                elif self.path == "/metrics":
                    fake.on_metrics()
                    text = fake.metrics_text
                    if fake.running_gauge:
                        text += f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {fake.in_flight}.0\n'
                    self._send(200, text.encode(), "text/plain; version=0.0.4")
                else:
                    self._send(404, b"{}")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if self._unauthorized():
                    return
                if self.path == "/v1/chat/completions":
                    fake.chat_authorizations.append(self.headers.get("Authorization"))
                    message = {"role": "assistant", "content": fake.chat_text}
                    self._send(200, json.dumps({"choices": [{"index": 0, "message": message}]}).encode())
                elif self.path == "/v1/completions" and body.get("model") not in fake.served_names:
                    time.sleep(fake.api_overhead_s)
                    fake.on_refused(body)
                    fake.refused_completions.append(body)
                    error = {
                        "object": "error",
                        "message": f"The model `{body.get('model')}` does not exist.",
                        "type": "NotFoundError",
                        "param": None,
                        "code": 404,
                    }
                    self._send(404, json.dumps(error).encode())
                elif self.path == "/v1/completions":
                    time.sleep(fake.api_overhead_s)
                    fake.completions.append(body)
                    with fake._in_flight_lock:
                        fake.in_flight += 1
                    try:
                        fake.on_completion(body)
                        self._stream(body)
                    finally:
                        with fake._in_flight_lock:
                            fake.in_flight -= 1
                else:
                    self._send(404, b"{}")

            def _stream(self, body: dict) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunks = min(fake.stream_chunks, body.get("max_tokens") or fake.stream_chunks)
                time.sleep(fake.first_token_delay_s)
                for index in range(chunks):
                    if fake.drop_stream_after is not None and index >= fake.drop_stream_after:
                        self.wfile.flush()
                        self.close_connection = True
                        return  # no terminating chunk: the client sees the stream end mid-way
                    if index:
                        time.sleep(fake.token_gap_s)
                    choice = {"index": 0, "text": f" {fake.word_at(body, index)}{index}"}
                    if body.get("logprobs"):
                        choice["logprobs"] = fake.logprobs(body, index, choice["text"])
                    self._event({"choices": [choice]})
                if (body.get("stream_options") or {}).get("include_usage"):  # as vLLM: only when asked
                    usage = {"prompt_tokens": len(body.get("prompt", "")) // 4, "completion_tokens": chunks}
                    self._event({"choices": [], "usage": usage})
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")

            def _event(self, event: dict) -> None:
                self._chunk(f"data: {json.dumps(event)}\n\n".encode())

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        return Handler
