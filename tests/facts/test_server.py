"""rigkit.facts.server's PortListeners script, run here for real: its hand-written JSON and its container ids (no
json, no re on the rig) read what json and re would, for a listener whose name needs escaping."""

from __future__ import annotations

import re
import subprocess
import sys

from rigkit.facts.server import PortListeners

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
