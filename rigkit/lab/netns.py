"""Rigs in their own network namespace: a veth pair, a private /30 per rig, and a registry forwarder.

A rig on host networking shares the host's loopback, so a controller that forgot the SSH tunnel
would still reach its serving API. A netns rig (`docker run --network none`) has its own loopback:
the controller reaches it only at its own address (sshd on RIG_ADDRESS:22), and its serving API,
bound to the rig's loopback, only through the tunnel.

Per rig N: host end `rigkit-rigN` = 10.213.N.1/30, rig end `eth0` = 10.213.N.2/30. The veth dies
with the rig's namespace (container stopped or restarted), so `ensure_link` re-plumbs whenever the
rig's end is missing. Meanwhile the host's default route would send packets for the rig's address
out of the machine: an `unreachable` route for the lab's /16 (the /30s are more specific) keeps
them in. The rig pulls from the lab registry by the same reference as every rig
(127.0.0.1:5000/...): rigkit/lab/forwarder.py binds 127.0.0.1:5000 inside the rig's namespace and
relays to the registry on the host's loopback (one process per rig, PID in the rig's directory).
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

from rigkit.errors import PreflightError
from rigkit.lab.proc import LabStepError, Progress, read_pid, run, start_daemon, stop_pid, wait_until

SUBNET_PREFIX = "10.213"  # 10.213.N.0/30 for rig N
PREFIX_LENGTH = 30
LAB_SUBNET = ipaddress.ip_network(f"{SUBNET_PREFIX}.0.0/16")
MAX_NETNS_RIG_INDEX = 255
VETH_PREFIX = "rigkit-rig"  # host end rigkit-rigN (IFNAMSIZ: at most 15 characters)
RIG_INTERFACE = "eth0"
RIG_SSH_PORT = 22
FORWARDER_SCRIPT = Path(__file__).resolve().with_name("forwarder.py")
FORWARDER_PID_FILE = "registry-forwarder.pid"
FORWARDER_LOG_FILE = "registry-forwarder.log"
FORWARDER_READY_TIMEOUT_S = 10.0


def addresses(index: int) -> tuple[str, str]:
    """(host end, rig end) of rig INDEX's private /30."""
    if not 1 <= index <= MAX_NETNS_RIG_INDEX:
        raise PreflightError(
            "netns rig index", index, f"outside 1..{MAX_NETNS_RIG_INDEX} ({SUBNET_PREFIX}.N.0/30)", "use fewer rigs"
        )
    return f"{SUBNET_PREFIX}.{index}.1", f"{SUBNET_PREFIX}.{index}.2"


def veth_name(index: int) -> str:
    name = f"{VETH_PREFIX}{index}"
    assert len(name) <= 15, name
    return name


def peer_name(index: int) -> str:
    """The rig end's name until it is moved into the rig and renamed RIG_INTERFACE."""
    return f"{veth_name(index)}r"


def foreign_addresses_in_lab_subnet(ip_addr_json: str) -> list[str]:
    """Host addresses (from `ip -j addr`) in the lab's /16 on links the lab did not make."""
    found = []
    for link in json.loads(ip_addr_json or "[]"):
        if link.get("ifname", "").startswith(VETH_PREFIX):
            continue
        for info in link.get("addr_info", []):
            if info.get("family") == "inet" and ipaddress.ip_address(info["local"]) in LAB_SUBNET:
                found.append(f"{info['local']} on {link.get('ifname')}")
    return found


def lab_links(ip_link_json: str) -> list[str]:
    """Host-side lab veths (from `ip -j link`)."""
    return [
        link["ifname"] for link in json.loads(ip_link_json or "[]") if link.get("ifname", "").startswith(VETH_PREFIX)
    ]


def has_address(ip_addr_json: str, interface: str, address: str) -> bool:
    """INTERFACE (from `ip -j addr show`) carries ADDRESS/PREFIX_LENGTH and is administratively up."""
    for link in json.loads(ip_addr_json or "[]"):
        if link.get("ifname") != interface or "UP" not in link.get("flags", []):
            continue
        if any(
            info.get("local") == address and info.get("prefixlen") == PREFIX_LENGTH
            for info in link.get("addr_info", [])
        ):
            return True
    return False


# ---- plumbing -----------------------------------------------------------------------------------


def _ip_json(*args: str, pid: int | None = None) -> str:
    prefix = ["nsenter", "--target", str(pid), "--net"] if pid else []
    return subprocess.run([*prefix, "ip", "-j", *args], capture_output=True, text=True).stdout


def _link_ok(index: int, pid: int) -> bool:
    host_address, rig_address = addresses(index)
    return has_address(
        _ip_json("addr", "show", "dev", veth_name(index)), veth_name(index), host_address
    ) and has_address(_ip_json("addr", "show", "dev", RIG_INTERFACE, pid=pid), RIG_INTERFACE, rig_address)


def ensure_guard_route() -> None:
    """Lab addresses without a veth fail at once instead of following the default route out."""
    run(
        ["ip", "route", "replace", "unreachable", str(LAB_SUBNET)],
        "netns rigs: guard route",
        f"ip route show {LAB_SUBNET}; remove what conflicts",
    )


def guard_route_present() -> bool:
    routes = subprocess.run(["ip", "-j", "route", "show", str(LAB_SUBNET)], capture_output=True, text=True).stdout
    return any(route.get("type") == "unreachable" for route in json.loads(routes or "[]"))


def _check_subnet_free() -> None:
    foreign = foreign_addresses_in_lab_subnet(_ip_json("addr"))
    if foreign:
        raise PreflightError(
            "netns rig subnet",
            str(LAB_SUBNET),
            f"already used on this host: {', '.join(foreign)}",
            "free it, or bring up rigs on host networking only (--netns-rigs 0)",
        )


def ensure_link(index: int, pid: int, progress: Progress) -> bool:
    """The veth between the host and rig INDEX (whose PID 1 is PID) is up with both addresses.

    Returns True if it had to be (re)made: a new or restarted container has a fresh namespace.
    """
    if _link_ok(index, pid):
        ensure_guard_route()
        return False
    _check_subnet_free()
    ensure_guard_route()
    name, peer = veth_name(index), peer_name(index)
    host_address, rig_address = addresses(index)
    step, fix = f"rig{index}: veth", f"ip link del {name}; then `rigkit lab up` again"
    in_rig = ["nsenter", "--target", str(pid), "--net"]
    progress(
        f"rig{index}: veth {name} {host_address}/{PREFIX_LENGTH} <-> {RIG_INTERFACE} {rig_address} (rig pid {pid})"
    )
    subprocess.run(["ip", "link", "del", name], capture_output=True)  # half-made earlier
    subprocess.run([*in_rig, "ip", "link", "del", RIG_INTERFACE], capture_output=True)
    run(["ip", "link", "add", name, "type", "veth", "peer", "name", peer], step, fix)
    run(["ip", "link", "set", peer, "netns", str(pid)], step, fix)
    run(["ip", "addr", "add", f"{host_address}/{PREFIX_LENGTH}", "dev", name], step, fix)
    run(["ip", "link", "set", name, "up"], step, fix)
    run([*in_rig, "ip", "link", "set", peer, "name", RIG_INTERFACE], step, fix)
    run([*in_rig, "ip", "addr", "add", f"{rig_address}/{PREFIX_LENGTH}", "dev", RIG_INTERFACE], step, fix)
    run([*in_rig, "ip", "link", "set", RIG_INTERFACE, "up"], step, fix)
    run([*in_rig, "ip", "link", "set", "lo", "up"], step, fix)
    return True


def remove_links(progress: Progress) -> None:
    """Delete host-side lab veths still there (normally they vanish with the rig's namespace), then the
    guard route."""
    for name in lab_links(_ip_json("link")):
        progress(f"veth: deleting {name}")
        subprocess.run(["ip", "link", "del", name], capture_output=True)
    if guard_route_present():
        progress(f"route: deleting the guard route for {LAB_SUBNET}")
        subprocess.run(["ip", "route", "del", "unreachable", str(LAB_SUBNET)], capture_output=True)


# ---- the registry forwarder ---------------------------------------------------------------------


def forwarder_command(pid: int, registry_host: str, registry_port: int) -> list[str]:
    address = f"{registry_host}:{registry_port}"
    return [
        sys.executable,
        str(FORWARDER_SCRIPT),
        "--listen-netns",
        f"/proc/{pid}/ns/net",
        "--listen",
        address,
        "--connect",
        address,
    ]


def _cmdline(pid: int | None) -> list[str]:
    if not pid:
        return []
    try:
        return [arg.decode() for arg in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if arg]
    except OSError:
        return []


def is_forwarder(cmdline: list[str]) -> bool:
    return str(FORWARDER_SCRIPT) in cmdline


def forwarder_processes() -> list[int]:
    """Every running lab forwarder, whoever recorded it (the lab-down check)."""
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and is_forwarder(_cmdline(int(entry.name)))
    ]


def _stop(pid: int) -> bool:
    cmdline = _cmdline(pid)
    return is_forwarder(cmdline) and stop_pid(pid, os.path.basename(cmdline[0]), grace_seconds=5.0)


def ensure_forwarder(
    rig_dir: Path, index: int, pid: int, registry_host: str, registry_port: int, progress: Progress
) -> int:
    """A forwarder for rig INDEX's current namespace runs; returns its PID."""
    wanted = forwarder_command(pid, registry_host, registry_port)
    pid_file = rig_dir / FORWARDER_PID_FILE
    recorded = read_pid(pid_file)
    running = _cmdline(recorded)
    # the same script and namespace, whichever interpreter path started it (python or python3)
    if is_forwarder(running) and running[1:] == wanted[1:]:
        return recorded
    if recorded and _stop(recorded):
        progress(f"rig{index}: stopped the registry forwarder of an earlier namespace (pid {recorded})")
    forwarder = start_daemon(wanted, rig_dir / FORWARDER_LOG_FILE, pid_file)
    progress(f"rig{index}: registry forwarder {registry_host}:{registry_port} inside the rig -> host (pid {forwarder})")
    return forwarder


def wait_registry_reachable(container: str, index: int, registry: str) -> None:
    """The rig reaches the lab registry by its usual address (through the forwarder)."""
    probe = ["docker", "exec", container, "curl", "-sf", "-o", "/dev/null", "-m", "3", f"http://{registry}/v2/"]
    if not wait_until(
        lambda: subprocess.run(probe, capture_output=True).returncode == 0, FORWARDER_READY_TIMEOUT_S, 0.3
    ):
        raise LabStepError(
            f"rig{index}: registry forwarder",
            registry,
            "the rig cannot reach the lab registry",
            f"read {FORWARDER_LOG_FILE} in the rig's lab directory; is the registry up?",
        )


def stop_forwarders(progress: Progress) -> None:
    for pid in forwarder_processes():
        progress(f"registry forwarder: stopping pid {pid}")
        _stop(pid)


def stop_forwarder(rig_dir: Path) -> None:
    pid = read_pid(rig_dir / FORWARDER_PID_FILE)
    if pid:
        _stop(pid)
