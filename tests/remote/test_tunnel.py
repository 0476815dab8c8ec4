"""rigkit.remote.tunnel: which binds need a tunnel, the direct address, the tunnel against a real SSH server
(tests/ssh_rig.py), URLs for every bind address, a connection whose SSH transport died."""

import socket
import time

import paramiko
import pytest
import requests
from ssh_rig import api_on_loopback, ssh_rig  # noqa: F401 (fixtures)

from rigkit.remote import tunnel


@pytest.mark.parametrize(
    "bind,loopback",
    [
        ("127.0.0.1", True),
        ("127.0.0.53", True),
        ("localhost", True),
        ("::1", True),
        ("10.0.0.5", False),
        ("0.0.0.0", False),
    ],
)
def test_loopback_binds_need_a_tunnel(bind, loopback):
    assert tunnel.is_loopback_bind(bind) is loopback


def test_direct_address_for_lan_and_wildcard_binds():
    data = {"ssh_hostname": "10.0.0.7"}
    assert tunnel.direct_address("10.0.0.5", data) == "10.0.0.5"
    assert tunnel.direct_address("0.0.0.0", data) == "10.0.0.7"
    assert tunnel.direct_address("0.0.0.0", {}, "rig3.lan") == "rig3.lan"


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


def test_tunnel_to_an_unreachable_rig_names_the_address():
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    with pytest.raises(tunnel.TunnelError, match=f"127.0.0.1:{dead_port}"):
        with tunnel.open_tunnel(
            {"ssh_hostname": "127.0.0.1", "ssh_port": dead_port, "ssh_allow_agent": False, "ssh_look_for_keys": False},
            "127.0.0.1",
            8000,
        ):
            pass


@pytest.mark.parametrize(
    "address, expected",
    [
        ("127.0.0.1", "127.0.0.1"),
        ("::1", "[::1]"),
        ("[::1]", "[::1]"),
        ("fe80::1%eth0", "[fe80::1%25eth0]"),
        ("rig1.lab", "rig1.lab"),
    ],
)
def test_url_host_brackets_ipv6(address, expected):
    assert tunnel.url_host(address) == expected


@pytest.mark.parametrize(
    "bind, url",
    [
        ("127.0.0.1", "http://127.0.0.1:8000/v1/models"),
        ("::1", "http://[::1]:8000/v1/models"),
        ("0.0.0.0", "http://127.0.0.1:8000/v1/models"),
        ("::", "http://127.0.0.1:8000/v1/models"),
        ("2001:db8::5", "http://[2001:db8::5]:8000/v1/models"),
    ],
)
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
