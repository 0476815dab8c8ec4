"""The rig image: Debian from debootstrap (bookworm, or trixie for compose v2), systemd as PID 1, sshd,
python3, its own Docker engine.

Built once per distribution and tagged by a hash of its inputs (suite, packages, recipe), so a second
`lab up` finds it in the engine's image cache (the engine's data root outlives `lab down`) and takes seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from rigkit.errors import PreflightError
from rigkit.lab.proc import LabStepError, Progress, run, run_with_progress
from rigkit.paths import CACHE_DIR, LAB_DIR

SUITE = "bookworm"  # the default rig: Debian 12, docker.io 20.10 + docker-compose v1.29
# Debian 13 ships docker.io 26.1 with compose v2 (the Go plugin) and the CLI as its own package.
SUITES = ("bookworm", "trixie")
EXTRA_PACKAGES = {"bookworm": (), "trixie": ("docker-cli",)}
# Debian 13's systemd fails loading kernel modules in a container (the host's kernel owns them).
EXTRA_MASKED_UNITS = {"bookworm": (), "trixie": ("systemd-modules-load.service",)}
# Where Debian 13's compose v2 lives in a rig; `lab up` keeps a copy on the controller for the tests.
COMPOSE_V2_IN_RIG = "/usr/libexec/docker/cli-plugins/docker-compose"
RECIPE_VERSION = "4"
IMAGE_REPOSITORY = "rigkit-lab/rig"
BASE_REPOSITORY = "rigkit-lab/rig-base"
# Labels on everything the lab builds: `lab down --purge-cache` removes images by them.
IMAGE_LABEL = "rigkit.lab.image"
CONTAINER_LABEL = "rigkit.lab"

RIG_PACKAGES = (
    "openssh-server",
    "python3",
    "systemd",
    "systemd-sysv",
    "dbus",
    "docker.io",
    "docker-compose",
    "e2fsprogs",
    "xfsprogs",
    "util-linux",
    "iproute2",
    "sudo",
    "ca-certificates",
    "procps",
    "curl",
    # the api_firewall role's nft (a netns rig cannot reach a package mirror to install it)
    "nftables",
)
# Units that make no sense (or fight the host) in a container sharing the host's network and /dev.
MASKED_UNITS = (
    "getty@.service",
    "serial-getty@.service",
    "console-getty.service",
    "getty.target",
    "systemd-udevd.service",
    "systemd-udevd-control.socket",
    "systemd-udevd-kernel.socket",
    "systemd-logind.service",
    "systemd-timesyncd.service",
    "systemd-networkd.service",
    "systemd-networkd.socket",
    "systemd-networkd-wait-online.service",
    "systemd-resolved.service",
    # its ExecStop is `nft flush ruleset`: on a host-network rig that would be this machine's whole firewall
    "nftables.service",
)
# A rig shares the host network: its engine must never create a bridge or touch iptables.
RIG_DAEMON_JSON = {"bridge": "none", "iptables": False, "ip-forward": False, "ip-masq": False}
# The rig's spare "NVMe" is a host loop device; this unit gives it a stable path at every boot
# (a privileged container's /dev is rebuilt on each start). The env file is bind-mounted per rig.
NVME_ENV_IN_RIG = "/etc/rigkit-lab/nvme.env"
NVME_LINK_UNIT = f"""[Unit]
Description=rigkit lab: stable path for this rig's spare NVMe (a host loop device)
DefaultDependencies=no
ConditionPathExists={NVME_ENV_IN_RIG}
Before=sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
EnvironmentFile={NVME_ENV_IN_RIG}
ExecStart=/bin/mkdir -p ${{NVME_DIR}}
ExecStart=/bin/ln -sfn ${{LOOP_DEVICE}} ${{NVME_PATH}}

[Install]
WantedBy=sysinit.target
"""

# A real host's udev brings /dev/disk/by-uuid up at boot and systemd mounts fstab from it; a rig has
# no udev, so an fstab mount by UUID would not come back after a rig restart. mount(8) resolves
# UUID= itself (libblkid), so mount what fstab declares before the engine starts its containers.
FSTAB_MOUNT_UNIT = """[Unit]
Description=rigkit lab: mount fstab after boot (a rig has no udev)
After=rigkit-lab-nvme.service local-fs.target
Before=containerd.service docker.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=-/bin/mount -a

[Install]
WantedBy=multi-user.target
"""


def rig_packages(suite: str = SUITE) -> tuple[str, ...]:
    return RIG_PACKAGES + EXTRA_PACKAGES[suite]


def install_script(suite: str = SUITE) -> str:
    script = INSTALL_SCRIPT.replace(" ".join(RIG_PACKAGES), " ".join(rig_packages(suite)))
    return script.replace(" ".join(MASKED_UNITS), " ".join(MASKED_UNITS + EXTRA_MASKED_UNITS[suite]))


INSTALL_SCRIPT = f"""set -eu
export DEBIAN_FRONTEND=noninteractive
# package scripts must not start daemons: with host networking sshd would bind the HOST's port 22
printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d
chmod +x /usr/sbin/policy-rc.d
echo '[rig image] apt-get update'
apt-get update -q
echo '[rig image] apt-get install'
apt-get install -y -q --no-install-recommends {" ".join(RIG_PACKAGES)}
rm -f /usr/sbin/policy-rc.d
apt-get clean
rm -rf /var/lib/apt/lists/*
systemctl mask {" ".join(MASKED_UNITS)}
# rigs boot lean; the docker role enables the engine (tests start it with systemctl start docker)
systemctl disable docker.service docker.socket containerd.service
mkdir -p /etc/docker /etc/rigkit-lab
echo '{json.dumps(RIG_DAEMON_JSON)}' > /etc/docker/daemon.json
cat > /etc/systemd/system/rigkit-lab-nvme.service <<'UNIT'
{NVME_LINK_UNIT}UNIT
systemctl enable rigkit-lab-nvme.service
cat > /etc/systemd/system/rigkit-lab-fstab.service <<'UNIT'
{FSTAB_MOUNT_UNIT}UNIT
systemctl enable rigkit-lab-fstab.service
# per-rig host keys are bind-mounted (the lab writes known_hosts from them)
rm -f /etc/ssh/ssh_host_*
# no audit/loginuid in a container
sed -i 's/^session\\s\\+required\\s\\+pam_loginuid.so/session optional pam_loginuid.so/' /etc/pam.d/sshd
# each rig gets its own machine id at boot
: > /etc/machine-id
echo '[rig image] done'
"""


def recipe_hash(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def base_tag(suite: str = SUITE) -> str:
    return f"{BASE_REPOSITORY}:{suite}-{recipe_hash(suite, 'minbase', RECIPE_VERSION)}"


def rig_image_tag(suite: str = SUITE) -> str:
    return f"{IMAGE_REPOSITORY}:{suite}-{recipe_hash(base_tag(suite), install_script(suite), RECIPE_VERSION)}"


def parse_apt_mirror(sources: dict[str, str], suite: str = SUITE) -> str | None:
    """The first `deb` URI serving SUITE, from apt source files' contents (deb822 .sources or one-line .list)."""
    for filename in sorted(sources):
        text = sources[filename]
        if filename.endswith(".sources"):
            for stanza in text.split("\n\n"):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line or line[:1].isspace():
                        continue
                    key, value = line.split(":", 1)
                    fields[key.strip().lower()] = value.strip()
                if fields.get("enabled", "yes").lower() == "no":
                    continue
                if "deb" in fields.get("types", "").split() and suite in fields.get("suites", "").split():
                    uris = fields.get("uris", "").split()
                    if uris:
                        return uris[0]
        elif filename.endswith(".list"):
            for line in text.splitlines():
                words = line.split("#", 1)[0].split()
                if words[:1] != ["deb"]:
                    continue
                words = words[1:]
                if words and words[0].startswith("["):  # options like [arch=amd64 signed-by=...]
                    while words and not words[0].endswith("]"):
                        words = words[1:]
                    words = words[1:]
                if len(words) >= 2 and words[1] == suite:
                    return words[0]
    return None


def host_apt_mirror() -> str:
    sources: dict[str, str] = {}
    candidates = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in candidates:
        if path.is_file():
            sources[path.name] = path.read_text(errors="replace")
    mirror = parse_apt_mirror(sources)
    if not mirror:
        raise PreflightError(
            "apt sources",
            "/etc/apt/sources.list.d",
            f"no enabled `deb` source for {SUITE}",
            f"add a Debian {SUITE} mirror to /etc/apt/sources.list.d/ (debootstrap uses it)",
        )
    return mirror


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def _build_base(tag: str, progress: Progress, suite: str = SUITE) -> None:
    if not shutil.which("debootstrap"):
        raise PreflightError("debootstrap", None, "not installed", "apt-get install debootstrap (or bin/setup)")
    mirror = host_apt_mirror()  # the same Debian mirror serves every suite
    build_dir = CACHE_DIR / "build"
    build_dir.mkdir(parents=True, exist_ok=True)
    rootfs = Path(tempfile.mkdtemp(prefix="rig-rootfs-", dir=build_dir))
    try:
        progress(f"rig base: debootstrap --variant=minbase {suite} (about a minute)")
        run_with_progress(
            ["debootstrap", "--variant=minbase", suite, str(rootfs), mirror],
            "rig base: debootstrap",
            "check the mirror in /etc/apt/sources.list.d/ is reachable; rerun `rigkit lab up`",
            progress,
            "debootstrap",
        )
        progress(f"rig base: docker import as {tag}")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["docker", "import", "--change", f"LABEL {IMAGE_LABEL}=base", "-", tag],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
        )
        tar.stdout.close()
        if tar.wait() != 0 or imported.returncode != 0:
            raise LabStepError(
                "rig base: docker import",
                tag,
                imported.stderr.strip() or "tar failed",
                "check free space under the engine's data root",
            )
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)


def _build_rig_image(base: str, tag: str, progress: Progress, suite: str = SUITE) -> None:
    builder = f"rigkit-lab-build-{tag.rsplit(':', 1)[1]}"
    subprocess.run(["docker", "rm", "-f", builder], capture_output=True)
    try:
        progress(f"rig image: installing {len(rig_packages(suite))} packages in {builder} (about a minute)")
        run_with_progress(
            [
                "docker",
                "run",
                "--name",
                builder,
                "--network",
                "host",
                "--label",
                f"{CONTAINER_LABEL}={LAB_DIR}",
                base,
                "bash",
                "-c",
                install_script(suite),
            ],
            "rig image: package install",
            "check the apt mirror is reachable; rerun `rigkit lab up`",
            progress,
            "rig image",
        )
        run(
            [
                "docker",
                "commit",
                "--change",
                'CMD ["/sbin/init"]',
                "--change",
                f"LABEL {IMAGE_LABEL}=rig",
                builder,
                tag,
            ],
            "rig image: docker commit",
            "check free space under the engine's data root",
        )
    finally:
        subprocess.run(["docker", "rm", "-f", builder], capture_output=True)


def ensure_rig_image(progress: Progress, suite: str = SUITE) -> str:
    """The rig image tag of ``suite``, built if the engine does not have it yet."""
    if suite not in SUITES:
        raise PreflightError(
            "--distros", suite, "not a rig distribution the lab builds", f"use one of {', '.join(SUITES)}"
        )
    tag = rig_image_tag(suite)
    if image_exists(tag):
        progress(f"rig image: cached ({tag})")
        return tag
    if os.geteuid() != 0:
        raise PreflightError(
            "user", os.geteuid(), "building the rig image needs root (debootstrap)", "run as root (sudo rigkit lab up)"
        )
    base = base_tag(suite)
    if image_exists(base):
        progress(f"rig base: cached ({base})")
    else:
        _build_base(base, progress, suite)
    _build_rig_image(base, tag, progress, suite)
    progress(f"rig image: built {tag}")
    return tag


def compose_v2_path(suite: str = "trixie") -> Path:
    """Where `lab up` keeps a copy of the rig image's compose v2 (a static binary that runs here too)."""
    return CACHE_DIR / "bin" / f"docker-compose-v2-{rig_image_tag(suite).rsplit(':', 1)[1]}"


def ensure_compose_v2_copy(image: str, suite: str, progress: Progress) -> Path:
    """A copy of ``image``'s compose v2 plugin on the controller, for the tests that read files with it."""
    target = compose_v2_path(suite)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with partial.open("wb") as out:
        copied = subprocess.run(
            ["docker", "run", "--rm", "--network", "none", image, "cat", COMPOSE_V2_IN_RIG],
            stdout=out,
            stderr=subprocess.PIPE,
        )
    if copied.returncode != 0:
        partial.unlink(missing_ok=True)
        raise LabStepError(
            "rig image: copy compose v2",
            image,
            copied.stderr.decode().strip() or "cat failed",
            "check the image has the docker-compose package",
        )
    partial.chmod(0o755)
    partial.rename(target)
    progress(f"rig image: compose v2 copied to {target}")
    return target
