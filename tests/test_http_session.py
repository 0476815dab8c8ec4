"""rigkit.http_session against a server that loses the keep-alive race the way vLLM's uvicorn does."""

import socket
import threading
import time

import pytest
import requests

from rigkit import http_session

SERVER_IDLE_CLOSE_S = 0.3


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
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                _, buffer = buffer.split(b"\r\n\r\n", 1)
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
