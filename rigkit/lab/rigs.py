"""Lab rigs: privileged systemd containers that behave like SSH hosts.

Each rig has key-only root login with the lab key, its own /var/lib/docker bind dir (so it can run
its own engine), a serving port, and an unformatted file-backed loop device at a stable path as its
spare "NVMe". A rig on host networking runs sshd on 127.0.0.1:<ssh port>; a netns rig
(rigkit.lab.netns) runs sshd on its own address, port 22, and shares nothing with the host's loopback.
A rig's network mode is fixed when its container is made: `lab up` never converts a running rig.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from rigkit.errors import PreflightError
from rigkit.lab import netns
from rigkit.lab.proc import LabStepError, Progress, run, wait_until
from rigkit.lab.registry_server import REGISTRY
from rigkit.lab.rig_image import CONTAINER_LABEL, NVME_ENV_IN_RIG
from rigkit.lab.state import RigState
from rigkit.paths import LAB_DIR

SSH_HOST = "127.0.0.1"
SSH_PORT_BASE = 2200  # rig1 -> 2201
SERVING_PORT_BASE = 8100  # rig1 -> 8101
RESERVED_PORTS = frozenset({2024})  # taken on the development machine
NVME_SIZE_BYTES = 2 * 1024**3  # sparse, unformatted
NVME_PATH_TEMPLATE = "/dev/disk/by-id/nvme-rigkit-lab-{name}"
RIG_LABEL = "rigkit.lab.rig"
RIG_IMAGE_LABEL = "rigkit.lab.rig-image"
RIG_LOOP_LABEL = "rigkit.lab.loop"
RIG_SHM_LABEL = "rigkit.lab.shm"
RIG_NETWORK_LABEL = "rigkit.lab.network"
NETWORK_HOST = "host"
NETWORK_NETNS = "netns"
# A real rig's /dev/shm is half its RAM; the serving stack runs with `ipc: host`, so it uses the
# rig's /dev/shm (its shm_size is ignored) and vLLM needs more than Docker's 64 MiB default.
RIG_SHM_SIZE = "2g"
PARALLEL_RIG_STARTS = 3
SSH_READY_TIMEOUT_S = 90.0

SSH_DIR = LAB_DIR / "ssh"
LAB_KEY = SSH_DIR / "id_ed25519"
KNOWN_HOSTS = SSH_DIR / "known_hosts"
RIGS_DIR = LAB_DIR / "rigs"
# The stand-in for a NAS: one host directory bind-mounted into every rig at the same path (kv_share_fstype
# none); `lab down` removes it with the rest of LAB_DIR.
KV_SHARE_DIR = LAB_DIR / "kv-share"
KV_SHARE_IN_RIG = "/mnt/rigkit-kv-share"
# The lab's model store (model_store_path), on each rig's own disk: lab tests wipe a rig's NVMe (the default store's
# home) and re-run a plain pyinfra deploy, which never stages
LAB_MODEL_STORE = "/var/lib/rigkit-models"


def rig_name(index: int) -> str:
    return f"rig{index}"


def container_name(name: str) -> str:
    return f"rigkit-lab-{name}"


def rig_index(container: str) -> int | None:
    """rigkit-lab-rig3 -> 3; None for a name that is not a lab rig's."""
    prefix = container_name(rig_name(0))[:-1]
    suffix = container.removeprefix(prefix)
    return int(suffix) if container.startswith(prefix) and suffix.isdigit() else None


def allocate_ports(count: int, base: int, reserved: frozenset[int] = RESERVED_PORTS) -> list[int]:
    """COUNT ports from BASE+1 upward, skipping reserved ones; index i (1-based) always maps to the same port."""
    ports: list[int] = []
    port = base
    while len(ports) < count:
        port += 1
        if port not in reserved:
            ports.append(port)
    return ports


def sshd_config(ssh_port: int, host_key_path: str, listen_address: str = SSH_HOST) -> str:
    return (
        f"Port {ssh_port}\n"
        f"ListenAddress {listen_address}\n"
        f"HostKey {host_key_path}\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UseDNS no\n"
    )


def known_hosts_line(ssh_port: int, public_key_openssh: str, ssh_host: str = SSH_HOST) -> str:
    host = ssh_host if ssh_port == 22 else f"[{ssh_host}]:{ssh_port}"
    key_type, key_data = public_key_openssh.split()[:2]
    return f"{host} {key_type} {key_data}\n"


def nvme_env(loop_device: str, nvme_path: str) -> str:
    return f"LOOP_DEVICE={loop_device}\nNVME_PATH={nvme_path}\nNVME_DIR={str(Path(nvme_path).parent)}\n"


def loop_devices_backed_under(losetup_json: str, directory: Path) -> list[str]:
    """Loop devices (from `losetup --list --json`) whose backing file lies under DIRECTORY."""
    prefix = str(directory).rstrip("/") + "/"
    devices = []
    for entry in json.loads(losetup_json or "{}").get("loopdevices", []):
        back_file = (entry.get("back-file") or "").removesuffix(" (deleted)")
        if back_file.startswith(prefix):
            devices.append(entry["name"])
    return devices


def mounts_to_release(findmnt_json: str, loop_devices: list[str], directory: Path) -> list[str]:
    """Mount targets (from `findmnt --json --list`) of the given loop devices or under DIRECTORY, deepest first."""
    prefix = str(directory).rstrip("/") + "/"
    targets = []
    for entry in json.loads(findmnt_json or "{}").get("filesystems", []):
        target = entry.get("target", "")
        if entry.get("source") in loop_devices or target.startswith(prefix):
            targets.append(target)
    return sorted(targets, key=lambda t: t.count("/"), reverse=True)


# ---- keys -------------------------------------------------------------------------------------


def _write_keypair(private_path: Path, comment: str) -> str:
    """An ed25519 key pair in OpenSSH format (created once); returns the public key line."""
    public_path = private_path.with_name(private_path.name + ".pub")
    if not (private_path.exists() and public_path.exists()):
        private_path.parent.mkdir(parents=True, exist_ok=True)
        key = Ed25519PrivateKey.generate()
        private_bytes = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        public_line = (
            key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
        )
        private_path.touch(mode=0o600)
        private_path.write_bytes(private_bytes)
        private_path.chmod(0o600)
        public_path.write_text(f"{public_line} {comment}\n")
    return public_path.read_text().strip()


def ensure_lab_key() -> Path:
    _write_keypair(LAB_KEY, "rigkit-lab")
    return LAB_KEY


# ---- loop devices -----------------------------------------------------------------------------


def _attached_loop(image: Path) -> str | None:
    result = subprocess.run(
        ["losetup", "--associated", str(image), "--noheadings", "--output", "NAME"], capture_output=True, text=True
    )
    names = result.stdout.split()
    return names[0] if names else None


def ensure_loop_device(image: Path) -> str:
    if not image.exists():
        with open(image, "wb") as f:
            f.truncate(NVME_SIZE_BYTES)
    attached = _attached_loop(image)
    if attached:
        return attached
    return run(
        ["losetup", "--find", "--show", str(image)],
        "rig nvme: losetup",
        "free a loop device (losetup -l) or load the loop module (modprobe loop)",
    ).stdout.strip()


def lab_loop_devices() -> list[str]:
    result = subprocess.run(["losetup", "--list", "--json"], capture_output=True, text=True)
    return loop_devices_backed_under(result.stdout, LAB_DIR)


# ---- containers -------------------------------------------------------------------------------


def _inspect(container: str) -> dict | None:
    result = subprocess.run(["docker", "inspect", container], capture_output=True, text=True)
    if result.returncode != 0:
        return None
    return json.loads(result.stdout)[0]


def kv_share_mount_point_in_layer(inspect_info: dict) -> Path | None:
    """Where the rig's shared mount point lies on the host (its container's upper layer), None when it has none."""
    upper = ((inspect_info.get("GraphDriver") or {}).get("Data") or {}).get("UpperDir")
    return Path(upper) / KV_SHARE_IN_RIG.lstrip("/") if upper else None


def unseal_kv_share_mount_points(containers: Sequence[str]) -> None:
    """The kv_share role makes the directory under the rig's shared mount immutable (rigkit.disk): docker could not
    remove a container whose layer holds it (rmdir(2): EPERM on an immutable directory). Cleared from the host."""
    for container in containers:
        info = _inspect(container)
        path = kv_share_mount_point_in_layer(info) if info else None
        if path is not None and path.is_dir():
            subprocess.run(["chattr", "-i", str(path)], capture_output=True)


def lab_containers() -> list[str]:
    result = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label={CONTAINER_LABEL}={LAB_DIR}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
    )
    return result.stdout.split()


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((SSH_HOST, port)) != 0


def _ssh_ready(rig: RigState, key_path: Path, known_hosts: Path) -> bool:
    client = paramiko.SSHClient()
    try:
        client.load_host_keys(str(known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(
            rig.ssh_host,
            port=rig.ssh_port,
            username="root",
            key_filename=str(key_path),
            allow_agent=False,
            look_for_keys=False,
            timeout=3,
            banner_timeout=3,
            auth_timeout=3,
        )
        _, stdout, _ = client.exec_command("true", timeout=5)
        return stdout.channel.recv_exit_status() == 0
    except (paramiko.SSHException, OSError, EOFError):
        return False
    finally:
        client.close()


def ssh_ready(rig: RigState) -> bool:
    return _ssh_ready(rig, LAB_KEY, KNOWN_HOSTS)


def _prepare_rig_files(
    index: int, ssh_port: int, serving_port: int, own_netns: bool = False, distro: str = "bookworm"
) -> tuple[RigState, Path, str]:
    name = rig_name(index)
    rig_dir = RIGS_DIR / name
    (rig_dir / "hostkeys").mkdir(parents=True, exist_ok=True)
    (rig_dir / "docker").mkdir(exist_ok=True)
    host_public = _write_keypair(rig_dir / "hostkeys" / "ssh_host_ed25519_key", f"{name}@rigkit-lab")
    host_address, rig_address = netns.addresses(index) if own_netns else ("", "")
    ssh_host, ssh_port = (rig_address, netns.RIG_SSH_PORT) if own_netns else (SSH_HOST, ssh_port)
    (rig_dir / "sshd.conf").write_text(sshd_config(ssh_port, "/etc/ssh/rigkit/ssh_host_ed25519_key", ssh_host))
    loop_image = rig_dir / "nvme.img"
    loop_device = ensure_loop_device(loop_image)
    nvme_path = NVME_PATH_TEMPLATE.format(name=name)
    (rig_dir / "nvme.env").write_text(nvme_env(loop_device, nvme_path))
    rig = RigState(
        name=name,
        container=container_name(name),
        ssh_host=ssh_host,
        ssh_port=ssh_port,
        serving_port=serving_port,
        nvme_path=nvme_path,
        loop_device=loop_device,
        loop_image=str(loop_image),
        docker_dir=str(rig_dir / "docker"),
        netns=own_netns,
        host_address=host_address,
        rig_address=rig_address,
        distro=distro,
    )
    return rig, rig_dir, host_public


def has_kv_share(inspect_info: dict) -> bool:
    """The rig container (its `docker inspect`) has the lab's shared KV directory at KV_SHARE_IN_RIG."""
    return any(
        mount.get("Source") == str(KV_SHARE_DIR) and mount.get("Destination") == KV_SHARE_IN_RIG
        for mount in inspect_info.get("Mounts") or []
    )


def _run_container(rig: RigState, rig_dir: Path, image: str) -> None:
    mounts = {
        f"{LAB_KEY}.pub": "/root/.ssh/authorized_keys:ro",
        str(rig_dir / "sshd.conf"): "/etc/ssh/sshd_config.d/rigkit-lab.conf:ro",
        str(rig_dir / "hostkeys"): "/etc/ssh/rigkit:ro",
        str(rig_dir / "nvme.env"): f"{NVME_ENV_IN_RIG}:ro",
        rig.docker_dir: "/var/lib/docker",
        str(KV_SHARE_DIR): KV_SHARE_IN_RIG,
    }
    if rig.netns:
        # sshd may start before the veth has the rig's address: let it bind that address anyway
        network = [
            "--network",
            "none",
            "--sysctl",
            "net.ipv4.ip_nonlocal_bind=1",
            "--add-host",
            f"{rig.name}:{rig.rig_address}",
        ]
    else:
        network = ["--network", "host"]
    cmd = [
        "docker",
        "run",
        "-d",
        "--name",
        rig.container,
        "--hostname",
        rig.name,
        "--privileged",
        "--cgroupns=private",
        *network,
        "--stop-signal",
        "SIGRTMIN+3",
        "--tmpfs",
        "/run",
        "--tmpfs",
        "/run/lock",
        "--shm-size",
        RIG_SHM_SIZE,
        "--label",
        f"{RIG_SHM_LABEL}={RIG_SHM_SIZE}",
        "--label",
        f"{CONTAINER_LABEL}={LAB_DIR}",
        "--label",
        f"{RIG_LABEL}={rig.name}",
        "--label",
        f"{RIG_IMAGE_LABEL}={image}",
        "--label",
        f"{RIG_LOOP_LABEL}={rig.loop_device}",
        "--label",
        f"{RIG_NETWORK_LABEL}={NETWORK_NETNS if rig.netns else NETWORK_HOST}",
    ]
    for source, target in mounts.items():
        cmd += ["-v", f"{source}:{target}"]
    run(
        [*cmd, image],
        f"rig {rig.name}: docker run",
        "read `docker logs` of the container; `rigkit lab down` then `rigkit lab up` starts clean",
    )


def _ensure_container(rig: RigState, rig_dir: Path, image: str, progress: Progress) -> None:
    info = _inspect(rig.container)
    if info is not None:
        labels = info["Config"].get("Labels") or {}
        same = (
            labels.get(RIG_IMAGE_LABEL) == image
            and labels.get(RIG_LOOP_LABEL) == rig.loop_device
            and labels.get(RIG_SHM_LABEL) == RIG_SHM_SIZE
            and has_kv_share(info)
        )
        if same and info["State"]["Running"]:
            progress(f"{rig.name}: running, reused")
            return
        if same:
            progress(f"{rig.name}: starting the stopped container")
            run(
                ["docker", "start", rig.container],
                f"rig {rig.name}: docker start",
                "`rigkit lab down` then `rigkit lab up`",
            )
            return
        progress(f"{rig.name}: image, loop device, shm size or shared KV directory changed, recreating the container")
        unseal_kv_share_mount_points([rig.container])
        run(["docker", "rm", "-f", rig.container], f"rig {rig.name}: docker rm", "remove it by hand")
    for port in () if rig.netns else (rig.ssh_port, rig.serving_port):
        if not _port_free(port):
            raise PreflightError(
                f"{rig.name} port",
                port,
                "something the lab did not start listens there",
                f"stop it (ss -ltnp 'sport = :{port}') or bring up fewer rigs (--rigs)",
            )
    progress(
        f"{rig.name}: starting (ssh {rig.ssh_host}:{rig.ssh_port}, serving {rig.serving_port}, "
        f"nvme {rig.loop_device}{', own network namespace' if rig.netns else ''})"
    )
    _run_container(rig, rig_dir, image)


def container_pid(container: str) -> int:
    info = _inspect(container)
    pid = info["State"]["Pid"] if info and info["State"]["Running"] else 0
    if not pid:
        raise LabStepError(f"{container}: pid", container, "the container is not running", f"docker logs {container}")
    return pid


def ensure_rig_network(rig: RigState, rig_dir: Path, registry: str, progress: Progress) -> None:
    """A netns rig: its veth is up and it reaches the lab registry at its usual address (re-plumbed
    after a restart, which gives the container a new namespace). Nothing to do on host networking."""
    if not rig.netns:
        return
    index = rig_index(rig.container)
    assert index is not None, rig.container
    pid = container_pid(rig.container)
    netns.ensure_link(index, pid, progress)
    registry_host, registry_port = registry.rsplit(":", 1)
    netns.ensure_forwarder(rig_dir, index, pid, registry_host, int(registry_port), progress)
    netns.wait_registry_reachable(rig.container, index, registry)


def _wait_ready(rig: RigState) -> None:
    nvme_ok = wait_until(
        lambda: (
            subprocess.run(
                ["docker", "exec", rig.container, "test", "-b", rig.nvme_path], capture_output=True
            ).returncode
            == 0
        ),
        30,
        0.5,
    )
    if not nvme_ok:
        raise LabStepError(
            f"rig {rig.name}: nvme",
            rig.nvme_path,
            f"no block device link to {rig.loop_device}",
            f"docker exec {rig.container} systemctl status rigkit-lab-nvme",
        )
    if not wait_until(lambda: ssh_ready(rig), SSH_READY_TIMEOUT_S, 0.5):
        raise LabStepError(
            f"rig {rig.name}: ssh",
            f"{rig.ssh_host}:{rig.ssh_port}",
            "sshd did not accept the lab key",
            f"docker exec {rig.container} systemctl status ssh; docker logs {rig.container}",
        )


def netns_indices(count: int, netns_count: int) -> set[int]:
    """The rigs asked to get their own network namespace: the last NETNS_COUNT of COUNT."""
    if not 0 <= netns_count <= count:
        raise PreflightError(
            "--netns-rigs",
            netns_count,
            f"must be between 0 and --rigs ({count})",
            "pass a smaller --netns-rigs or a larger --rigs",
        )
    return set(range(count - netns_count + 1, count + 1))


def unconvertible(rigs: Sequence[RigState], count: int, netns_count: int) -> list[str]:
    """The existing rigs (a lab's state) asked to have their own network namespace that run on host networking: `lab
    up` never converts one, so a lab of this shape cannot give what was asked (say so before changing any rig)."""
    asked = netns_indices(count, netns_count)
    return [rig.name for rig in rigs if rig_index(rig.container) in asked and not rig.netns]


def network_modes(requested_netns: set[int], existing: dict[int, str], count: int) -> dict[int, bool]:
    """Index -> own netns, for rigs 1..COUNT: an existing rig keeps its mode (no label: host networking)."""
    return {
        index: existing[index] == NETWORK_NETNS if index in existing else index in requested_netns
        for index in range(1, count + 1)
    }


def distros_of(rigs: Sequence[RigState]) -> list[str]:
    """Each rig's suite by its index (rig1 first), bookworm where a rig is missing."""
    by_index = {rig_index(rig.container): rig.distro for rig in rigs}
    return [by_index.get(index, "bookworm") for index in range(1, max(by_index, default=0) + 1)]


def ensure_rigs(
    count: int,
    images: dict[str, str],
    progress: Progress,
    netns_count: int = 0,
    registry: str = REGISTRY,
    distros: Sequence[str] = (),
) -> list[RigState]:
    """At least COUNT rigs answering SSH, rig N running the image of ``distros[N-1]`` (``images``: suite ->
    rig image; bookworm where the list is shorter); the last NETNS_COUNT of them new ones in their own
    network namespace. A rig whose distribution changed is recreated.

    Rigs beyond COUNT from an earlier, bigger lab are kept (and listed): `up` never removes a rig
    someone may be using; `rigkit lab down` is the way to shrink. Likewise an existing rig keeps its
    network mode (converting it would kill whatever runs in it).
    """
    if count < 1:
        raise PreflightError("--rigs", count, "a lab needs at least one rig", "pass --rigs 1 or more")
    requested_netns = netns_indices(count, netns_count)
    ensure_lab_key()
    existing_modes = _existing_network_modes()
    existing = list(existing_modes)
    extra = sorted(index for index in existing if index and index > count)
    if extra:
        progress(
            f"rigs: keeping {', '.join(rig_name(i) for i in extra)} beyond --rigs {count} (`rigkit lab down` to shrink)"
        )
        count = extra[-1]
    modes = network_modes(requested_netns, existing_modes, count)
    for index in sorted(i for i in existing_modes if i in requested_netns and not modes[i]):
        progress(
            f"{rig_name(index)}: keeps host networking (an existing rig is never converted; "
            "`rigkit lab down` to change)"
        )
    ssh_ports = allocate_ports(count, SSH_PORT_BASE)
    serving_ports = allocate_ports(count, SERVING_PORT_BASE)
    suites = [distros[i - 1] if i <= len(distros) else "bookworm" for i in range(1, count + 1)]
    prepared = [
        _prepare_rig_files(i, ssh_ports[i - 1], serving_ports[i - 1], modes[i], suites[i - 1])
        for i in range(1, count + 1)
    ]
    _release_unused_rig_dirs({rig.name for rig, _, _ in prepared}, progress)
    KV_SHARE_DIR.mkdir(exist_ok=True)
    KNOWN_HOSTS.write_text("".join(known_hosts_line(rig.ssh_port, public, rig.ssh_host) for rig, _, public in prepared))

    def bring_up(item: tuple[RigState, Path, str]) -> RigState:
        rig, rig_dir, _ = item
        _ensure_container(rig, rig_dir, images[rig.distro], progress)
        ensure_rig_network(rig, rig_dir, registry, progress)
        _wait_ready(rig)
        return rig

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=PARALLEL_RIG_STARTS) as pool:
        rigs = list(pool.map(bring_up, prepared))
    progress(f"rigs: {count} answering SSH ({time.monotonic() - started:.1f} s)")
    return rigs


def _rig_containers() -> list[str]:
    result = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "--filter",
            f"label={CONTAINER_LABEL}={LAB_DIR}",
            "--filter",
            f"label={RIG_LABEL}",
            "--format",
            "{{.Names}}",
        ],
        capture_output=True,
        text=True,
    )
    return result.stdout.split()


def _existing_network_modes() -> dict[int, str]:
    """Index -> network mode label of every existing rig container (rigs made before the label: host)."""
    result = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "--filter",
            f"label={CONTAINER_LABEL}={LAB_DIR}",
            "--filter",
            f"label={RIG_LABEL}",
            "--format",
            f'{{{{.Names}}}} {{{{.Label "{RIG_NETWORK_LABEL}"}}}}',
        ],
        capture_output=True,
        text=True,
    )
    modes = {}
    for line in result.stdout.splitlines():
        name, _, mode = line.partition(" ")
        index = rig_index(name)
        if index:
            modes[index] = mode.strip() or NETWORK_HOST
    return modes


def _release_unused_rig_dirs(keep: set[str], progress: Progress) -> None:
    if not RIGS_DIR.exists():
        return
    for rig_dir in RIGS_DIR.iterdir():
        if rig_dir.name in keep:
            continue
        image = rig_dir / "nvme.img"
        device = _attached_loop(image) if image.exists() else None
        if device:
            subprocess.run(["losetup", "--detach", device], capture_output=True)
        netns.stop_forwarder(rig_dir)
        progress(f"{rig_dir.name}: removing its files")
        shutil.rmtree(rig_dir, ignore_errors=True)


def release_all(progress: Progress) -> None:
    """Remove every lab container, then every forwarder, veth, mount and loop device the lab made."""
    netns.stop_forwarders(progress)  # first: a forwarder's socket keeps its rig's namespace (and veth) alive
    containers = lab_containers()
    if containers:
        progress(f"containers: stopping and removing {', '.join(containers)}")
        subprocess.run(["docker", "stop", "-t", "15", *containers], capture_output=True)
        unseal_kv_share_mount_points(containers)
        run(["docker", "rm", "-f", *containers], "lab down: docker rm", "remove them by hand (docker rm -f ...)")
    release_all_without_engine(progress)


def release_all_without_engine(progress: Progress) -> None:
    """Stop forwarders, delete veths, unmount and detach every mount and loop device backed by a lab
    file (no engine needed)."""
    netns.stop_forwarders(progress)
    netns.remove_links(progress)
    devices = lab_loop_devices()
    findmnt = subprocess.run(
        ["findmnt", "--json", "--list", "--output", "SOURCE,TARGET"], capture_output=True, text=True
    )
    for target in mounts_to_release(findmnt.stdout, devices, LAB_DIR):
        progress(f"mounts: unmounting {target}")
        if subprocess.run(["umount", target], capture_output=True).returncode != 0:
            run(["umount", "--lazy", target], "lab down: umount", f"find who holds it: fuser -vm {target}")
    for device in devices:
        progress(f"loop devices: detaching {device}")
        run(["losetup", "--detach", device], "lab down: losetup -d", f"find who holds it: fuser -v {device}")
