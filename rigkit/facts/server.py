"""Facts about the host itself: a file's exact text, memory, /dev/shm, TCP listeners."""

from __future__ import annotations

import base64
import json
import shlex
from typing import Optional

from pyinfra.api import FactBase


class ExactFileText(FactBase):
    """A file's exact text (base64 on the wire, so no line or final newline is lost), None when absent."""

    present_marker = "present"

    def command(self, path: str) -> str:
        quoted = shlex.quote(path)
        return f"if [ -f {quoted} ]; then echo {self.present_marker}; base64 -w0 {quoted}; echo; fi"

    def process(self, output: list[str]) -> Optional[str]:
        if not output or output[0] != self.present_marker:
            return None
        return base64.b64decode("".join(output[1:])).decode()


class MemInfo(FactBase):
    """/proc/meminfo in bytes, e.g. {"MemTotal": ..., "MemAvailable": ...}."""

    def command(self) -> str:
        return "cat /proc/meminfo"

    def process(self, output):
        values = {}
        for line in output:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
        return values


class ShmSize(FactBase):
    """Size in bytes of the rig's /dev/shm (what an `ipc: host` container gets), or None."""

    def command(self) -> str:
        return "df -B1 --output=size /dev/shm 2>/dev/null | tail -n 1"

    def process(self, output):
        text = "".join(output).strip()
        return int(text) if text.isdigit() else None


class ShmFree(FactBase):
    """The rig's /dev/shm: {"free_bytes": what df says is available, "offload_bytes": the size of the vLLM CPU-tier
    segments (/dev/shm/vllm_offload_*.mmap) in it, which the stack's restart frees (the running engine's at down, a
    stopped one's by rigkit.serving.commands.shm_cleanup_command)}; None when /dev/shm cannot be read."""

    def command(self) -> str:
        return (
            "df -B1 --output=avail /dev/shm 2>/dev/null | tail -n 1; "
            "find /dev/shm -maxdepth 1 -name 'vllm_offload_*.mmap' -printf '%s\\n' 2>/dev/null"
        )

    def process(self, output):
        lines = [line.strip() for line in output if line.strip()]
        if not lines or not lines[0].isdigit():
            return None
        return {"free_bytes": int(lines[0]), "offload_bytes": sum(int(n) for n in lines[1:] if n.isdigit())}


# Runs on the rig (python3 only): who listens on each TCP port given, a JSON line a port. The listening sockets
# come from the kernel's sock_diag netlink (what `ss -lt` reads: /proc/net/tcp walks every socket's hash bucket,
# ~10 ms of a rig's system CPU at each read, more on a rig with much RAM), else from /proc/net/tcp{,6}
# (LISTEN = 0A). A socket no visible process owns (another network namespace's user, e.g. another rig) has pid
# None. Python without site and with os, sys and the C socket module only (json imports re: each module ~6 ms of
# a rig's CPU at every survey): the container ids are the cgroup's 64-hex runs, and the JSON is written by hand
# (a comm is at most 15 bytes of text).
_LISTENERS_SCRIPT = r"""
import os, sys
def netlink_listeners(ports):
    from _socket import socket
    from struct import pack, unpack_from
    by_port = {port: set() for port in ports}
    for family in (2, 10):  # AF_INET, AF_INET6
        link = socket(16, 2, 4)  # AF_NETLINK, SOCK_DGRAM, NETLINK_SOCK_DIAG
        try:
            # nlmsghdr (SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP), inet_diag_req_v2 (TCP, 1 << TCP_LISTEN)
            link.sendto(pack("=IHHII", 72, 20, 0x301, 1, 0) + pack("=BBBBI", family, 6, 0, 0, 1 << 10) + bytes(48), (0, 0))
            done = False
            while not done:
                data, at = link.recv(65536), 0
                if not data:
                    raise OSError("netlink ended early")
                while at < len(data):
                    length, kind = unpack_from("=IH", data, at)
                    if kind == 3:  # NLMSG_DONE
                        done = True
                        break
                    if kind != 20 or length < 88:  # NLMSG_ERROR (no tcp_diag here) or not an inet_diag_msg
                        raise OSError("sock_diag refused")
                    port, inode = unpack_from(">H", data, at + 20)[0], unpack_from("=I", data, at + 84)[0]
                    if port in by_port:
                        by_port[port].add(str(inode))
                    at += (length + 3) & ~3
        finally:
            link.close()
    return by_port
def proc_listeners(ports):
    by_port = {port: set() for port in ports}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            port = int(cols[1].rsplit(":", 1)[1], 16)
            if cols[3] == "0A" and port in by_port:
                by_port[port].add(cols[9])
    return by_port
def hex64(text):
    runs = "".join(c if c in "0123456789abcdef" else " " for c in text).split()
    return [run[i:i + 64] for run in runs for i in range(0, len(run) - 63, 64)]
def js(value):
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(js, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(js(k) + ": " + js(v) for k, v in value.items()) + "}"
    return '"' + "".join(c if c not in '"\\' and " " <= c < "\x7f" else "\\u%04x" % ord(c) for c in value) + '"'
def owners(inodes):
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")) if inodes else ():
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        for link in links:
            inode = link[8:-1] if link.startswith("socket:[") else None
            if inode in inodes and inode not in found:
                try:
                    cgroup = open(f"/proc/{pid}/cgroup").read()
                except OSError:
                    cgroup = ""
                found[inode] = {"pid": int(pid), "containers": hex64(cgroup),
                                "command": open(f"/proc/{pid}/comm").read().strip()}
        if len(found) == len(inodes):  # the lowest pid holding each socket is found: the rest cannot change it
            break
    return found
if __name__ == "__main__":
    ports = [int(arg) for arg in sys.argv[1:]]
    try:
        by_port = netlink_listeners(ports)
    except OSError:
        by_port = proc_listeners(ports)
    found = owners(set().union(*by_port.values()))
    for port in ports:
        print(js([found.get(i, {"pid": None, "containers": [], "command": None}) for i in sorted(by_port[port])]))
"""


def listeners_command(ports: list[int]) -> str:
    """The listeners of each port, one JSON line a port in this order, read by one Python process."""
    return f"python3 -I -S -c {shlex.quote(_LISTENERS_SCRIPT)} {' '.join(str(int(port)) for port in ports)}"


class PortListeners(FactBase):
    """Listeners on TCP ``port``: [{"pid": int | None, "containers": [container ids], "command": str | None}]."""

    def command(self, port: int) -> str:
        return listeners_command([port])

    def process(self, output):
        return json.loads("".join(output) or "[]")
