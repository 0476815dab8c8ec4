"""rigkit/files/wait_ready.py, the rig-side wait for the API: it notices the API within a poll of its answering
(the release's overhead on top of the engine's start), and checks the containers less often."""

from __future__ import annotations

import http.server
import threading
import time

from rigkit.files import wait_ready


class Answers(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def test_the_api_is_noticed_within_a_poll_of_answering(monkeypatch, capsys):
    checks = []
    monkeypatch.setattr(wait_ready, "stack_containers", lambda label: checks.append(label) or [])
    server = http.server.HTTPServer(("127.0.0.1", 0), Answers)
    url = f"http://127.0.0.1:{server.server_port}/v1/models"
    server.server_close()  # nothing listens yet: the engine is starting
    answering_at = []

    def start_later():
        time.sleep(1.0)
        listening = http.server.HTTPServer(("127.0.0.1", server.server_port), Answers)
        answering_at.append(time.monotonic())
        listening.serve_forever(poll_interval=0.05)

    threading.Thread(target=start_later, daemon=True).start()
    assert wait_ready.main(url, 30, "label=org.rigkit.stack=serving") == 0
    noticed = time.monotonic() - answering_at[0]
    assert noticed < 0.6, f"noticed {noticed:.2f} s after the API answered"
    assert len(checks) <= 1  # the containers are checked every CONTAINERS_EVERY_S, not at every poll
    assert "ready:" in capsys.readouterr().out


def test_a_dead_container_is_still_reported(monkeypatch, capsys):
    monkeypatch.setattr(wait_ready, "CONTAINERS_EVERY_S", 0.0)
    monkeypatch.setattr(wait_ready, "stack_containers", lambda label: [("abc", "exited", 0)])
    monkeypatch.setattr(wait_ready, "print_logs", lambda cid: print(f"logs of {cid}"))
    assert wait_ready.main("http://127.0.0.1:9/v1/models", 30, "label=x") == 1
    assert "container abc died" in capsys.readouterr().out
