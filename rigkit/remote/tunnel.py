"""Reach a rig's serving API as on a real fleet: an SSH local port forward, or direct on a LAN bind.

The serving API binds the rig's loopback by default, so the controller needs a tunnel; it
uses the same connection data pyinfra uses for that host (ssh_hostname, ssh_port, ssh_user,
ssh_key, ssh_known_hosts_file, ssh_strict_host_key_checking, ...). When a knob binds the API
to a LAN address, the controller connects directly.

    with serving_url(host.data, bind="127.0.0.1", port=8000) as url:
        ServingClient(url).models()

A dropped SSH connection is re-established on the next forwarded request (Tunnel.reconnects).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import select
import socket
import socketserver
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import paramiko

from rigkit.errors import RigkitError

DEFAULT_SSH_PORT = 22
# pyinfra 3's SSH connector's default StrictHostKeyChecking (rigkit.settings.connection checks the setting)
STRICT_HOST_KEY_DEFAULT = "accept-new"
SSH_CONNECT_TIMEOUT_S = 15.0
PUMP_BUFFER_BYTES = 65536
# paramiko keepalives: a NAT or firewall between controller and rig must not idle the tunnel out
SSH_KEEPALIVE_S = 30


class _QuietRefusedChannels(logging.Filter):
    """While a rig's API restarts, refused forwards are expected (the client sees a closed socket and
    retries); paramiko would log each one as an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "open FAILED: Connection refused" not in record.getMessage()


logging.getLogger("paramiko.transport").addFilter(_QuietRefusedChannels())


class TunnelError(RigkitError):
    """The controller cannot reach a rig's serving API."""


def is_loopback_bind(bind: str) -> bool:
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return False


def ssh_address(name: str, host_data: Mapping[str, Any]) -> str:
    """The address the inventory reaches host ``name`` at over SSH: ssh_hostname, else the inventory name."""
    return str(host_data.get("ssh_hostname") or name)


def direct_address(bind: str, host_data: Mapping[str, Any], inventory_name: Optional[str] = None) -> str:
    """Where to connect when the API is bound to a non-loopback address."""
    if bind in WILDCARD_ADDRESSES:
        return ssh_address(inventory_name or bind, host_data)
    return bind


def _accept_new_policy(known_hosts_file: Optional[str]) -> paramiko.MissingHostKeyPolicy:
    class AcceptNew(paramiko.MissingHostKeyPolicy):
        """Trust a host key seen for the first time and remember it; a changed key still fails."""

        def missing_host_key(self, client, hostname, key):
            client.get_host_keys().add(hostname, key.get_name(), key)
            if known_hosts_file:
                Path(known_hosts_file).parent.mkdir(parents=True, exist_ok=True)
                client.save_host_keys(known_hosts_file)

    return AcceptNew()


def missing_host_key_policy(
    host_data: Mapping[str, Any], known_hosts: Optional[str] = None
) -> paramiko.MissingHostKeyPolicy:
    """What an unknown host key does, as pyinfra reads ssh_strict_host_key_checking: new keys are accepted only
    for "accept-new" (its default) and trusted blindly only for "no"/"off"; anything else ("yes", "ask", which
    nobody can answer here, or a value validation did not see) rejects it."""
    strict = host_data.get("ssh_strict_host_key_checking")
    strict = STRICT_HOST_KEY_DEFAULT if strict is None else strict
    if strict in ("no", "off"):
        return paramiko.AutoAddPolicy()
    if strict == STRICT_HOST_KEY_DEFAULT:
        return _accept_new_policy(known_hosts)
    return paramiko.RejectPolicy()


def connect_ssh(host_data: Mapping[str, Any], inventory_name: Optional[str] = None) -> paramiko.SSHClient:
    """An SSH client connected with pyinfra's connection data for one host."""
    hostname = ssh_address(inventory_name or "", host_data)
    if not hostname:
        raise TunnelError(
            "ssh_hostname", None, "no address to reach the rig", "set ssh_hostname in the inventory for this host"
        )
    client = paramiko.SSHClient()
    known_hosts = host_data.get("ssh_known_hosts_file")
    known_hosts = os.path.expanduser(known_hosts) if known_hosts else None
    if known_hosts and os.path.exists(known_hosts):
        client.load_host_keys(known_hosts)
    else:
        client.load_system_host_keys()
    client.set_missing_host_key_policy(missing_host_key_policy(host_data, known_hosts))
    key = host_data.get("ssh_key")
    port = int(host_data.get("ssh_port") or DEFAULT_SSH_PORT)
    try:
        client.connect(
            hostname,
            port=port,
            username=host_data.get("ssh_user"),
            key_filename=os.path.expanduser(key) if key else None,
            passphrase=host_data.get("ssh_key_password"),
            password=host_data.get("ssh_password"),
            allow_agent=bool(host_data.get("ssh_allow_agent", True)),
            look_for_keys=bool(host_data.get("ssh_look_for_keys", True)),
            timeout=SSH_CONNECT_TIMEOUT_S,
        )
    except (paramiko.SSHException, OSError) as exc:
        client.close()
        raise TunnelError(
            "ssh_hostname",
            f"{hostname}:{port}",
            f"SSH connection failed ({exc})",
            "check ssh_hostname/ssh_port/ssh_user/ssh_key and the rig's known host key",
        ) from None
    return client


class _ForwardServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class Tunnel:
    """A local port forward that survives a dropped SSH connection.

    A validation runs for minutes and restarts the stack; a dropped SSH connection (a rig's network
    blip, sshd restarted, a NAT timeout) must not turn every later request into "connection closed"
    while the server is fine. Each forwarded connection checks the transport and reconnects it once
    when it is dead; `reconnects` counts how often that happened (the card's notes, the tests).
    """

    def __init__(self, connect: Callable[[], paramiko.SSHClient], remote_host: str, remote_port: int):
        self._connect = connect
        self.remote_host = remote_host
        self.remote_port = remote_port
        self.reconnects = 0
        self._lock = threading.Lock()
        self._ssh = self._open()
        self._server: Optional[_ForwardServer] = None

    def _open(self) -> paramiko.SSHClient:
        ssh = self._connect()
        transport = ssh.get_transport()
        if transport is None or not transport.is_active():
            ssh.close()
            raise TunnelError("ssh", None, "the SSH transport is closed", "reconnect before opening a tunnel")
        transport.set_keepalive(SSH_KEEPALIVE_S)
        return ssh

    def transport(self) -> paramiko.Transport:
        """The live transport, reconnecting when the old one died."""
        with self._lock:
            current = self._ssh.get_transport()
            if current is not None and current.is_active():
                return current
            self._ssh.close()
            self._ssh = self._open()
            self.reconnects += 1
            logging.getLogger(__name__).info(
                "tunnel to %s:%d: SSH connection re-established (%d)",
                self.remote_host,
                self.remote_port,
                self.reconnects,
            )
            return self._ssh.get_transport()

    def transport_active(self) -> bool:
        current = self._ssh.get_transport()
        return current is not None and current.is_active()

    def run(self, command: str, stdin: str) -> Optional[str]:
        """Run `command` on the rig over this tunnel's SSH connection with `stdin` fed to it: its stdout, or None
        when it exited non-zero or the connection failed (rigkit.remote.probe.RigCommand; the lab's TTFT probe)."""
        try:
            channel = self.transport().open_session()
        except (paramiko.SSHException, EOFError, OSError, TunnelError):
            return None
        try:
            channel.exec_command(command)
            channel.sendall(stdin.encode())
            channel.shutdown_write()
            output = channel.makefile("rb").read()
            status = channel.recv_exit_status()
        except (paramiko.SSHException, EOFError, OSError):
            return None
        finally:
            channel.close()
        return output.decode("utf-8", "replace") if status == 0 else None

    def drop_connection(self) -> None:
        """Cut the SSH connection under the tunnel, as a network failure would (tests, diagnostics)."""
        current = self._ssh.get_transport()
        if current is not None:
            current.sock.shutdown(socket.SHUT_RDWR)

    def start(self) -> int:
        self._server = _ForwardServer(("127.0.0.1", 0), _make_handler(self))
        threading.Thread(target=self._server.serve_forever, name="rigkit-tunnel", daemon=True).start()
        return self._server.server_address[1]

    @property
    def local_port(self) -> int:
        assert self._server is not None, "start() the tunnel first"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self._ssh.close()


def _open_channel(tunnel: Tunnel, peer) -> Optional[paramiko.Channel]:
    try:
        return tunnel.transport().open_channel("direct-tcpip", (tunnel.remote_host, tunnel.remote_port), peer)
    except paramiko.ChannelException:
        return None  # the rig refused the port: the client sees a closed connection, as without a tunnel
    except (paramiko.SSHException, EOFError, OSError):
        # the transport died between the check and the open: one fresh connection, then give up
        try:
            return tunnel.transport().open_channel("direct-tcpip", (tunnel.remote_host, tunnel.remote_port), peer)
        except (paramiko.SSHException, EOFError, OSError, TunnelError):
            return None
    except TunnelError:
        return None  # the rig is unreachable over SSH right now; the next connection tries again


def _make_handler(tunnel: Tunnel):
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            channel = _open_channel(tunnel, self.request.getpeername())
            if channel is None:
                return
            try:
                while True:
                    readable, _, _ = select.select([self.request, channel], [], [])
                    if self.request in readable:
                        data = self.request.recv(PUMP_BUFFER_BYTES)
                        if not data:
                            break
                        channel.sendall(data)
                    if channel in readable:
                        data = channel.recv(PUMP_BUFFER_BYTES)
                        if not data:
                            break
                        self.request.sendall(data)
            except (OSError, EOFError):  # paramiko says EOFError when the SSH transport died under the channel
                pass
            finally:
                try:
                    channel.close()
                except (OSError, EOFError):
                    pass  # the transport went first: nothing is left to close

    return Handler


@contextmanager
def open_tunnel(
    host_data: Mapping[str, Any], bind: str, port: int, inventory_name: Optional[str] = None
) -> Iterator[Tunnel]:
    """A started Tunnel to bind:port as the rig sees it (bind must be a loopback address)."""
    tunnel = Tunnel(lambda: connect_ssh(host_data, inventory_name), "127.0.0.1" if bind == "localhost" else bind, port)
    try:
        tunnel.start()
        yield tunnel
    finally:
        tunnel.close()


@contextmanager
def serving_url(
    host_data: Mapping[str, Any], bind: str, port: int, inventory_name: Optional[str] = None
) -> Iterator[str]:
    """Base URL of the rig's serving API, through a tunnel when it binds the rig's loopback."""
    if not is_loopback_bind(bind):
        yield f"http://{url_host(direct_address(bind, host_data, inventory_name))}:{port}"
        return
    with open_tunnel(host_data, bind, port, inventory_name) as tunnel:
        yield tunnel.url


# Addresses a server binds to listen on every interface; a client on the same machine reaches it on loopback
# (Linux's "::" socket takes IPv4 too unless net.ipv6.bindv6only is set).
WILDCARD_ADDRESSES = ("0.0.0.0", "::")


def url_host(address: str) -> str:
    """``address`` as the host part of a URL: IPv6 in brackets (``[::1]``), a zone's '%' as '%25' (RFC 6874)."""
    if ":" in address and not address.startswith("["):
        return "[" + address.replace("%", "%25") + "]"
    return address


def rig_local_url(bind_address: str, port: int, path: str = "") -> str:
    """The URL a process on the rig uses to reach a server bound to ``bind_address`` (a wildcard via loopback)."""
    host = "127.0.0.1" if bind_address in WILDCARD_ADDRESSES else bind_address
    return f"http://{url_host(host)}:{port}{path}"


def port_is_open(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection to host:port succeeds from the controller (the netns test's negative check)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
