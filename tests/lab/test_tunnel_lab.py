"""The SSH tunnel against a lab rig in its own network namespace.

On host networking every rig shares the controller's loopback, which would hide a missing tunnel.
A netns rig has its own loopback: a service bound there is unreachable from the controller,
directly or at the rig's address, and reachable through rigkit.remote.tunnel with the same connection
data the lab inventory gives pyinfra.
"""

from __future__ import annotations

import secrets
import socket
import time

import pytest
import requests

from rigkit.remote import tunnel

pytestmark = pytest.mark.lab

MARKER_DIR = "/tmp/rigkit-tunnel-test"


def _connection_data(lab, rig) -> dict:
    return {
        "ssh_hostname": rig.ssh_host,
        "ssh_port": rig.ssh_port,
        "ssh_user": "root",
        "ssh_key": lab.ssh_key,
        "ssh_known_hosts_file": lab.known_hosts,
        "ssh_strict_host_key_checking": "yes",
        "ssh_allow_agent": False,
        "ssh_look_for_keys": False,
    }


def _free_on_controller() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(ssh, command: str) -> str:
    _, stdout, stderr = ssh.exec_command(command, timeout=30)
    status = stdout.channel.recv_exit_status()
    out = stdout.read().decode()
    assert status == 0, f"{command}: {out} {stderr.read().decode()}"
    return out.strip()


@pytest.fixture
def service_on_rig_loopback(lab, netns_rig):
    """A tiny HTTP server bound to the netns rig's 127.0.0.1, serving a random marker."""
    rig, data = netns_rig, _connection_data(lab, netns_rig)
    port = _free_on_controller()  # free here too, so a controller-side listener cannot fake the result
    marker = secrets.token_hex(8)
    ssh = tunnel.connect_ssh(data)
    pid = _run(
        ssh,
        f"mkdir -p {MARKER_DIR} && echo {marker} > {MARKER_DIR}/marker && "
        f"(nohup python3 -m http.server --bind 127.0.0.1 --directory {MARKER_DIR} {port} "
        f">/dev/null 2>&1 & echo $!)",
    )
    try:
        for _ in range(50):
            probe = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 1)\""
            _, stdout, _ = ssh.exec_command(probe, timeout=10)
            if stdout.channel.recv_exit_status() == 0:
                break
            time.sleep(0.2)
        yield rig, data, port, marker
    finally:
        _run(ssh, f"kill {int(pid)}; rm -rf {MARKER_DIR}")
        ssh.close()


def test_rig_loopback_is_unreachable_without_the_tunnel(service_on_rig_loopback):
    rig, _, port, _ = service_on_rig_loopback
    assert not tunnel.port_is_open("127.0.0.1", port)
    assert not tunnel.port_is_open(rig.rig_address, port)


def test_the_tunnel_reaches_the_rigs_loopback(service_on_rig_loopback):
    _, data, port, marker = service_on_rig_loopback
    with tunnel.serving_url(data, "127.0.0.1", port) as url:
        assert requests.get(f"{url}/marker", timeout=10).text.strip() == marker


def test_the_tunnel_survives_a_dropped_ssh_connection(service_on_rig_loopback):
    """A validation outlives network blips: the next request after a dropped connection reconnects."""
    _, data, port, marker = service_on_rig_loopback
    with tunnel.open_tunnel(data, "127.0.0.1", port) as forward:
        assert requests.get(f"{forward.url}/marker", timeout=10).text.strip() == marker
        forward.drop_connection()
        deadline = time.monotonic() + 10
        while forward.transport_active() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not forward.transport_active(), "the SSH connection was not cut"
        assert requests.get(f"{forward.url}/marker", timeout=10).text.strip() == marker
        assert forward.reconnects == 1
