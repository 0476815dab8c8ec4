"""rigkit.remote.http_session against a server that loses the keep-alive race the way vLLM's uvicorn does."""

import socket
import threading
import time

import pytest
import requests

from rigkit.remote import http_session

SERVER_IDLE_CLOSE_S = 0.3


def next_head(conn, buffer: bytes):
    """(the next request's head, what follows it) read from ``conn`` after ``buffer``; None once the client closed."""
    while b"\r\n\r\n" not in buffer:
        data = conn.recv(65536)
        if not data:
            return None
        buffer += data
    head, rest = buffer.split(b"\r\n\r\n", 1)
    return head, rest


class RacingKeepAliveServer:
    """Answers on keep-alive connections; a request arriving on a connection idle for SERVER_IDLE_CLOSE_S or
    more is met by the close the server had already decided on: no response (what a client sees when its
    request crosses the server's idle-timeout close)."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        idle_since = None
        buffer = b""
        with conn:
            while True:
                if (request := next_head(conn, buffer)) is None:
                    return
                _, buffer = request
                if idle_since is not None and time.monotonic() - idle_since >= SERVER_IDLE_CLOSE_S:
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok")
                idle_since = time.monotonic()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/metrics"

    def close(self):
        self.listener.close()


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setattr(http_session, "REUSE_IDLE_LIMIT_S", SERVER_IDLE_CLOSE_S * 2 / 3)
    racing = RacingKeepAliveServer()
    yield racing
    racing.close()


def test_the_simulated_race_fails_a_plain_session(server):
    session = requests.Session()
    assert session.get(server.url, timeout=5).text == "ok"
    time.sleep(SERVER_IDLE_CLOSE_S + 0.1)
    with pytest.raises(requests.ConnectionError, match="RemoteDisconnected|aborted"):
        session.get(server.url, timeout=5)


def test_a_connection_idle_past_the_limit_is_not_reused(server):
    session = http_session.server_session()
    assert session.get(server.url, timeout=5).text == "ok"
    time.sleep(SERVER_IDLE_CLOSE_S + 0.1)
    assert session.get(server.url, timeout=5).text == "ok"
    assert server.connections == 2


def test_a_connection_used_again_soon_is_kept(server):
    session = http_session.server_session()
    for _ in range(3):
        assert session.get(server.url, timeout=5).text == "ok"
    assert server.connections == 1


class DroppingServer(RacingKeepAliveServer):
    """Drops a request without an answer while ``drop_next`` is set (a connection lost in the tunnel), once, then
    answers."""

    def __init__(self):
        self.requests: list = []
        self.drop_next = True
        super().__init__()

    def _serve(self, conn):
        buffer = b""
        with conn:
            while True:
                if (request := next_head(conn, buffer)) is None:
                    return
                head, buffer = request
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                buffer = buffer[length:]
                self.requests.append(head.split(b" ")[0].decode())
                if self.drop_next:
                    self.drop_next = False
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


def test_a_get_never_answered_is_sent_once_more_and_a_post_is_not():
    server = DroppingServer()
    try:
        session = http_session.server_session()
        assert session.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5).text == "ok"
        assert server.requests == ["GET", "GET"]
        server.requests.clear()
        server.drop_next = True
        with pytest.raises(requests.ConnectionError):
            session.post(f"http://127.0.0.1:{server.port}/v1/completions", json={"prompt": "x"}, timeout=5)
        assert server.requests == ["POST"]  # a completion is never sent twice
    finally:
        server.close()


def test_a_get_that_times_out_is_not_sent_again_and_stays_a_timeout():
    listener = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog), never answers
    try:
        started = time.monotonic()
        with pytest.raises(requests.ReadTimeout):
            http_session.server_session().get(f"http://127.0.0.1:{listener.getsockname()[1]}/", timeout=0.3)
        assert time.monotonic() - started < 0.6
    finally:
        listener.close()
