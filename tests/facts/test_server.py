"""rigkit.facts.server's PortListeners script, run here for real: its hand-written JSON and its container ids (no
json, no re on the rig) read what json and re would, for a listener whose name needs escaping; its sockets read
from the kernel's sock_diag netlink are the ones /proc/net/tcp{,6} lists."""

from __future__ import annotations

import re
import socket
import subprocess
import sys

from rigkit.facts.server import _LISTENERS_SCRIPT, PortListeners

# a listener on loopback whose comm (what ps shows, at most 15 bytes) has a quote, a backslash, a non-ASCII letter
LISTENER = r"""
import ctypes, socket, sys
ctypes.CDLL(None).prctl(15, 'q"b\\ü'.encode(), 0, 0, 0)  # PR_SET_NAME
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
print(server.getsockname()[1], flush=True)
sys.stdin.read()
"""


def test_a_listener_with_an_awkward_name_is_read_as_json_would():
    child = subprocess.Popen([sys.executable, "-c", LISTENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        command = PortListeners().command(port)
        output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
        cgroup = open(f"/proc/{child.pid}/cgroup").read()
    finally:
        child.communicate("")
    listeners = PortListeners().process(output.splitlines())
    assert listeners == [{"pid": child.pid, "containers": re.findall(r"[0-9a-f]{64}", cgroup), "command": 'q"b\\ü'}]


def script_functions() -> dict:
    namespace = {"__name__": "listeners"}  # the script's functions, without its main part
    exec(compile(_LISTENERS_SCRIPT, "listeners", "exec"), namespace)
    return namespace


def test_netlink_reads_the_listening_sockets_proc_lists():
    """IPv4 and IPv6 listeners, a connected (not listening) socket, a port nobody uses: the same inodes."""
    listeners = [socket.socket(socket.AF_INET), socket.socket(socket.AF_INET6)]
    listeners[0].bind(("127.0.0.1", 0))
    listeners[1].bind(("::1", listeners[0].getsockname()[1]))
    for listener in listeners:
        listener.listen()
    client = socket.create_connection(listeners[0].getsockname())
    free = socket.socket()
    free.bind(("127.0.0.1", 0))  # bound, never listening: its port has no listener
    try:
        script = script_functions()
        ports = [listeners[0].getsockname()[1], client.getsockname()[1], free.getsockname()[1]]
        by_netlink = script["netlink_listeners"](ports)
        assert by_netlink == script["proc_listeners"](ports)
        assert len(by_netlink[ports[0]]) == 2 and by_netlink[ports[1]] == by_netlink[ports[2]] == set()
    finally:
        for each in [*listeners, client, free]:
            each.close()


def test_the_walk_for_owners_finds_the_listening_process():
    """The /proc walk that stops once every socket has an owner still finds each one's."""
    child = subprocess.Popen([sys.executable, "-c", LISTENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        script = script_functions()
        inodes = script["netlink_listeners"]([port])[port]
        owners = script["owners"](inodes)
    finally:
        child.communicate("")
    assert {inode: owner["pid"] for inode, owner in owners.items()} == {inode: child.pid for inode in inodes}
