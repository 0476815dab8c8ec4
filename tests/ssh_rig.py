"""A rig's sshd for tests on this machine: paramiko's own server implementation (real SSH protocol, real
direct-tcpip channels, real exec) and a real HTTP API on loopback for the tunnel to forward to."""

import http.server
import socket
import subprocess
import threading

import paramiko
import pytest


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
                        threading.Thread(
                            target=_pump, args=(channel, server.destinations[channel.get_id()]), daemon=True
                        ).start()

            threading.Thread(target=channels, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    data = {
        "ssh_hostname": "127.0.0.1",
        "ssh_port": listener.getsockname()[1],
        "ssh_user": "root",
        "ssh_key": str(key_file),
        "ssh_known_hosts_file": str(tmp_path / "known_hosts"),
        "ssh_allow_agent": False,
        "ssh_look_for_keys": False,
    }
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
