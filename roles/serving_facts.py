"""Facts the serving role reads from a rig: its running stack, images, memory and disk."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

from rigkit.nvidia_smi import GPU_MEMORY_QUERY

STACK_LABEL = "org.rigkit.stack"


class StackContainers(FactBase):
    """``docker inspect`` of every container (running or not) that carries rigkit's stack label."""

    def requires_command(self, *args, **kwargs) -> str:
        return "docker"

    def command(self, stack: str) -> str:
        selector = shlex.quote(f"label={STACK_LABEL}={stack}")
        return f"ids=$(docker ps -aq --filter {selector}); [ -z \"$ids\" ] && echo '[]' || docker inspect $ids"

    def process(self, output):
        return [
            {
                "id": c["Id"][:12],
                "name": c["Name"].lstrip("/"),
                "image": c["Config"]["Image"],
                "labels": c["Config"].get("Labels") or {},
                "running": bool(c["State"].get("Running")),
                "status": c["State"].get("Status"),
            }
            for c in json.loads("".join(output))
        ]


class DockerImagePresent(FactBase):
    """True when the image reference (repository@sha256:...) is in the rig's local store."""

    def requires_command(self, *args, **kwargs) -> str:
        return "docker"

    def command(self, image: str) -> str:
        return f"docker image inspect --format present {shlex.quote(image)} 2>/dev/null || echo absent"

    def process(self, output):
        return "".join(output).strip() == "present"


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


class DiskFree(FactBase):
    """Free bytes on the filesystem holding ``path`` (its nearest existing parent), or None."""

    def command(self, path: str) -> str:
        quoted = shlex.quote(path)
        return (f"p={quoted}; while [ ! -e \"$p\" ] && [ \"$p\" != / ]; do p=$(dirname \"$p\"); done; "
                "df -B1 --output=avail \"$p\" | tail -n 1")

    def process(self, output):
        text = "".join(output).strip()
        return int(text) if text.isdigit() else None


class ShmSize(FactBase):
    """Size in bytes of the rig's /dev/shm (what an `ipc: host` container gets), or None."""

    def command(self) -> str:
        return "df -B1 --output=size /dev/shm 2>/dev/null | tail -n 1"

    def process(self, output):
        text = "".join(output).strip()
        return int(text) if text.isdigit() else None


class ComposeCommand(FactBase):
    """``docker compose`` (v2 plugin) or ``docker-compose`` (v1), whichever the rig has, else None."""

    def command(self) -> str:
        return ("if docker compose version >/dev/null 2>&1; then echo 'docker compose'; "
                "elif command -v docker-compose >/dev/null 2>&1; then echo docker-compose; fi")

    def process(self, output):
        text = "".join(output).strip()
        return text or None


class GpuMemory(FactBase):
    """nvidia-smi's per-GPU free/total memory, one CSV line per GPU (rigkit.nvidia_smi parses it)."""

    def requires_command(self, *args, **kwargs) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        return GPU_MEMORY_QUERY

    def process(self, output):
        return list(output)


# Runs on the rig (python3 only): who listens on a TCP port. Sockets come from /proc/net/tcp{,6} (LISTEN = 0A);
# a socket no visible process owns (another network namespace's user, e.g. another rig) has pid None.
_LISTENERS_SCRIPT = r"""
import json, os, re, sys
port = int(sys.argv[1])
inodes = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        rows = open(table).read().splitlines()[1:]
    except OSError:
        continue
    for row in rows:
        cols = row.split()
        if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
            inodes.add(cols[9])
found = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
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
            found[inode] = {"pid": int(pid), "containers": re.findall(r"[0-9a-f]{64}", cgroup),
                            "command": open(f"/proc/{pid}/comm").read().strip()}
print(json.dumps([found.get(i, {"pid": None, "containers": [], "command": None}) for i in sorted(inodes)]))
"""


class PortListeners(FactBase):
    """Listeners on TCP ``port``: [{"pid": int | None, "containers": [container ids], "command": str | None}]."""

    def command(self, port: int) -> str:
        return f"python3 -c {shlex.quote(_LISTENERS_SCRIPT)} {int(port)}"

    def process(self, output):
        return json.loads("".join(output) or "[]")


class ManifestProbe(FactBase):
    """Can the rig's engine see the image in its registry? None when it can, else the registry's answer.

    ``docker manifest inspect`` asks the registry with the rig's own credentials and network, without pulling.
    """

    def requires_command(self, *args, **kwargs) -> str:
        return "docker"

    def command(self, image: str) -> str:
        from rigkit.registry import api_base, parse_reference

        quoted = shlex.quote(image)
        # plain http only where docker itself allows it without configuration: loopback registries
        insecure = "--insecure " if api_base(parse_reference(image).registry).startswith("http://") else ""
        return (f"out=$(DOCKER_CLI_EXPERIMENTAL=enabled docker manifest inspect {insecure}{quoted} 2>&1) "
                f"&& echo available || printf 'missing %s\\n' \"$(printf '%s' \"$out\" | tail -n 1)\"")

    def process(self, output):
        text = "\n".join(output).strip()
        return None if text == "available" else (text.removeprefix("missing ").strip() or "no answer")
