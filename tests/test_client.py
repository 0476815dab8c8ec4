"""Client logic: prefill timeouts, tunnel routing, the TTFT probe over the tunnel, decode speed from a stream.

Salted prompts are in tests/test_prompts.py, the TTFT cross-check in tests/test_ttft.py.

Requests against a real vLLM are in tests/lab/test_validation_lab.py.
"""

import json
import time

import pytest

from rigkit import client, tunnel
from rigkit.client import prefill_timeout
from rigkit.ttft import RigProbe


def test_prefill_timeout_scales_with_the_measured_rate_and_has_a_floor():
    # 37K tokens at a measured 850 tokens/s: ~43 s predicted, never cut before 5x that
    assert prefill_timeout(36_807, 850.0) == pytest.approx(client.PREFILL_TIMEOUT_FACTOR * 36_807 / 850.0)
    assert prefill_timeout(100, 10_000.0) == client.MIN_PREFILL_TIMEOUT_S
    # a 255K prefill on a rig that prefills 850 tokens/s must get far more than a 300 s client default
    assert prefill_timeout(255_000, 850.0) > 300 * 4
    assert prefill_timeout(1000, None) == client.UNMEASURED_PREFILL_TIMEOUT_S


@pytest.mark.parametrize("bind,loopback", [("127.0.0.1", True), ("127.0.0.53", True), ("localhost", True),
                                           ("::1", True), ("10.0.0.5", False), ("0.0.0.0", False)])
def test_loopback_binds_need_a_tunnel(bind, loopback):
    assert tunnel.is_loopback_bind(bind) is loopback


def test_direct_address_for_lan_and_wildcard_binds():
    data = {"ssh_hostname": "10.0.0.7"}
    assert tunnel.direct_address("10.0.0.5", data) == "10.0.0.5"
    assert tunnel.direct_address("0.0.0.0", data) == "10.0.0.7"
    assert tunnel.direct_address("0.0.0.0", {}, "rig3.lan") == "rig3.lan"


# --- the tunnel against a real SSH server -------------------------------------------------------
# No sshd on this machine's host side: paramiko's own server implementation plays the rig's sshd
# (real SSH protocol, real direct-tcpip channels); the forwarded service is a real HTTP server.
import http.server  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402

import paramiko  # noqa: E402
import requests  # noqa: E402


class _RigSSHServer(paramiko.ServerInterface):
    def __init__(self, authorized: paramiko.PKey):
        self.authorized = authorized
        self.destinations: dict[int, tuple] = {}

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        ok = username == "root" and key.get_base64() == self.authorized.get_base64()
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel, command):
        """A command the client runs on the "rig": run here by a shell, stdin from the channel, stdout back."""
        def execute():
            stdin = channel.makefile("rb").read()  # until the client's shutdown_write
            done = subprocess.run(command.decode(), shell=True, input=stdin, capture_output=True, timeout=60)
            channel.sendall(done.stdout)
            channel.send_exit_status(done.returncode)
            channel.close()

        threading.Thread(target=execute, daemon=True).start()
        return True

    def check_channel_direct_tcpip_request(self, chanid, origin, destination):
        self.destinations[chanid] = destination
        return paramiko.OPEN_SUCCEEDED


def _pump(channel, destination):
    with socket.create_connection(destination) as upstream:
        upstream.settimeout(5)
        channel.settimeout(5)
        while True:
            data = channel.recv(65536)
            if not data:
                break
            upstream.sendall(data)
            if b"\r\n\r\n" in data:
                break
        while True:
            data = upstream.recv(65536)
            if not data:
                break
            channel.sendall(data)
    channel.close()


@pytest.fixture
def ssh_rig(tmp_path):
    host_key = paramiko.RSAKey.generate(2048)
    user_key = paramiko.RSAKey.generate(2048)
    key_file = tmp_path / "id_rsa"
    user_key.write_private_key_file(str(key_file))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(sock)
            transport.add_server_key(host_key)
            server = _RigSSHServer(user_key)
            try:
                transport.start_server(server=server)
            except (paramiko.SSHException, OSError):  # a client that refused our host key hangs up
                continue

            def channels(transport=transport, server=server):
                while transport.is_active():
                    channel = transport.accept(1)
                    if channel is not None and channel.get_id() in server.destinations:  # else: a session
                        threading.Thread(target=_pump, args=(channel, server.destinations[channel.get_id()]),
                                         daemon=True).start()

            threading.Thread(target=channels, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    data = {"ssh_hostname": "127.0.0.1", "ssh_port": listener.getsockname()[1], "ssh_user": "root",
            "ssh_key": str(key_file), "ssh_known_hosts_file": str(tmp_path / "known_hosts"),
            "ssh_allow_agent": False, "ssh_look_for_keys": False}
    yield data, host_key
    stop.set()
    listener.close()


@pytest.fixture
def api_on_loopback():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"data": [{"id": "tiny"}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def test_tunnel_forwards_to_the_rigs_loopback_port(ssh_rig, api_on_loopback):
    data, host_key = ssh_rig
    with tunnel.serving_url(data, "127.0.0.1", api_on_loopback) as url:
        assert url.startswith("http://127.0.0.1:") and not url.endswith(f":{api_on_loopback}")
        assert requests.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"] == "tiny"
    # accept-new (pyinfra's default) remembered the rig's host key
    remembered = paramiko.HostKeys(data["ssh_known_hosts_file"]).lookup(f"[127.0.0.1]:{data['ssh_port']}")
    assert remembered[host_key.get_name()].get_base64() == host_key.get_base64()


def test_tunnel_refuses_a_changed_host_key(ssh_rig, api_on_loopback, tmp_path):
    data, _ = ssh_rig
    impostor = paramiko.RSAKey.generate(2048)
    known = tmp_path / "known_hosts_other"
    hosts = paramiko.HostKeys()
    hosts.add(f"[127.0.0.1]:{data['ssh_port']}", impostor.get_name(), impostor)
    hosts.save(str(known))
    with pytest.raises(tunnel.TunnelError, match="ssh_hostname"):
        with tunnel.serving_url({**data, "ssh_known_hosts_file": str(known)}, "127.0.0.1", api_on_loopback):
            pass


def test_lan_bind_connects_directly_without_ssh(api_on_loopback):
    # no ssh data at all: a direct bind must not try to open SSH
    with tunnel.serving_url({}, "0.0.0.0", api_on_loopback, inventory_name="127.0.0.1") as url:
        assert url == f"http://127.0.0.1:{api_on_loopback}"
        assert requests.get(f"{url}/v1/models", timeout=10).status_code == 200


def test_tunnel_reconnects_after_the_ssh_connection_drops(ssh_rig, api_on_loopback):
    data, _ = ssh_rig
    with tunnel.open_tunnel(data, "127.0.0.1", api_on_loopback) as forward:
        assert requests.get(f"{forward.url}/v1/models", timeout=10).status_code == 200
        forward.drop_connection()
        for _ in range(100):
            if not forward.transport_active():
                break
            time.sleep(0.05)
        assert not forward.transport_active()
        assert requests.get(f"{forward.url}/v1/models", timeout=10).json()["data"][0]["id"] == "tiny"
        assert forward.reconnects == 1
        assert requests.get(f"{forward.url}/v1/models", timeout=10).status_code == 200
        assert forward.reconnects == 1  # a live connection is reused, not replaced


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


def test_tunnel_to_an_unreachable_rig_names_the_address():
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    with pytest.raises(tunnel.TunnelError, match=f"127.0.0.1:{dead_port}"):
        with tunnel.open_tunnel({"ssh_hostname": "127.0.0.1", "ssh_port": dead_port, "ssh_allow_agent": False,
                                 "ssh_look_for_keys": False}, "127.0.0.1", 8000):
            pass


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


@pytest.mark.parametrize("address, expected", [("127.0.0.1", "127.0.0.1"), ("::1", "[::1]"), ("[::1]", "[::1]"),
                                               ("fe80::1%eth0", "[fe80::1%25eth0]"), ("rig1.lab", "rig1.lab")])
def test_url_host_brackets_ipv6(address, expected):
    assert tunnel.url_host(address) == expected


@pytest.mark.parametrize("bind, url", [("127.0.0.1", "http://127.0.0.1:8000/v1/models"),
                                       ("::1", "http://[::1]:8000/v1/models"),
                                       ("0.0.0.0", "http://127.0.0.1:8000/v1/models"),
                                       ("::", "http://127.0.0.1:8000/v1/models"),
                                       ("2001:db8::5", "http://[2001:db8::5]:8000/v1/models")])
def test_rig_local_url_is_a_valid_url_for_every_bind_address(bind, url):
    import urllib.parse

    assert tunnel.rig_local_url(bind, 8000, "/v1/models") == url
    assert urllib.parse.urlsplit(url).port == 8000


class _ChannelOfADeadTransport:
    """A paramiko channel whose SSH transport died: paramiko raises EOFError on send and on close."""

    def __init__(self):
        self.reader, self.writer = socket.socketpair()
        self.writer.sendall(b"x")  # readable, so the pump tries to use it

    def fileno(self):
        return self.reader.fileno()

    def recv(self, size):
        return self.reader.recv(size)

    def sendall(self, data):
        raise EOFError()

    def close(self):
        self.reader.close()
        self.writer.close()
        raise EOFError()


def test_a_connection_whose_ssh_transport_died_ends_quietly(monkeypatch):
    channel = _ChannelOfADeadTransport()
    monkeypatch.setattr(tunnel, "_open_channel", lambda tunnel_, peer: channel)
    client_end, server_end = socket.socketpair()
    client_end.sendall(b"GET / HTTP/1.1\r\n\r\n")
    with client_end, server_end:
        tunnel._make_handler(tunnel=None)(server_end, ("127.0.0.1", 1), None)  # raises nothing
    assert channel.reader.fileno() == -1  # closed all the same
