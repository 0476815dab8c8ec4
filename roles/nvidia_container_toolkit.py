"""nvidia_container_toolkit: containers get the GPUs (NVIDIA Container Toolkit, pinned).

Ensures
- NVIDIA's libnvidia-container apt repository (key under /etc/apt/keyrings, ``signed-by``) and
  the toolkit packages, pinned when ``nvidia_ctk_version`` is set, and held;
- the Docker engine knows the nvidia runtime (``nvidia-ctk runtime configure --runtime=docker``,
  run only when /etc/docker/daemon.json lacks it), optionally as the default runtime; the engine
  restarts only when that changed.
Verifies that a container started with ``--gpus all`` sees the same GPUs (UUIDs) as the host.
Hosts with ``gpus: 0`` (the lab) skip the role and say so. Runs after the docker role.
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api.deploy import deploy
from pyinfra.facts.deb import DebArch, DebPackages
from pyinfra.operations import files, systemd

from rigkit.distro import target_os
from rigkit.facts.apt import AptHeldPackages
from rigkit.facts.batch import FactSpec
from rigkit.facts.surveyed import directory_reads, put_reads
from rigkit.operations import say
from rigkit.operations.apt import APT_KEYRINGS_DIR, packages_held, packages_installed, pinned
from rigkit.operations.nvidia import gpu_container_verified, nvidia_runtime_configured
from rigkit.settings.hostdata import RigSettings
from roles import Run
from roles.docker import DAEMON_JSON, DOCKER_SERVICE

# NVIDIA's install guide pins these four together to one version.
TOOLKIT_PACKAGES = [
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
]
TOOLKIT_KEYRING = f"{APT_KEYRINGS_DIR}/nvidia-container-toolkit.asc"
TOOLKIT_SOURCE_LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"


def operation_reads(rig: RigSettings) -> list[FactSpec]:
    """What this role's operations read on a rig whose toolkit is right (the signing key's download and the
    runtime's daemon.json check read as they run)."""
    if rig.host["gpus"] == 0:
        return []
    return [
        *directory_reads(APT_KEYRINGS_DIR),
        *put_reads(TOOLKIT_SOURCE_LIST),
        FactSpec.of(DebPackages),
        FactSpec.of(AptHeldPackages),
    ]


@deploy("nvidia_container_toolkit")
def nvidia_container_toolkit(rig: RigSettings, run: Run) -> None:
    settings = rig.nvidia_container_toolkit
    if rig.host["gpus"] == 0:
        say(host, "nvidia_container_toolkit: skipped, this host declares gpus: 0")
        return
    target_os(run.rig_state(rig).os_release, "nvidia_container_toolkit")

    url = settings["nvidia_ctk_apt_url"]
    files.directory(name="apt keyrings directory", path=APT_KEYRINGS_DIR, mode="755")
    files.download(name="NVIDIA container toolkit signing key", src=f"{url}/gpgkey", dest=TOOLKIT_KEYRING, mode="644")
    arch = host.get_fact(DebArch)
    source = f"deb [signed-by={TOOLKIT_KEYRING}] {url}/stable/deb/{arch} /\n"
    files.put(
        name="NVIDIA container toolkit apt repository", src=StringIO(source), dest=TOOLKIT_SOURCE_LIST, mode="644"
    )
    toolkit = pinned(TOOLKIT_PACKAGES, settings["nvidia_ctk_version"])
    packages_installed(name="Install the NVIDIA container toolkit", packages=toolkit)
    packages_held(name="Hold the NVIDIA container toolkit packages", packages=toolkit)

    runtime = nvidia_runtime_configured(
        name="Register the nvidia runtime with Docker",
        daemon_json=DAEMON_JSON,
        set_default=settings["nvidia_ctk_default_runtime"],
    )
    systemd.service(
        name="Restart the engine for the nvidia runtime", service=DOCKER_SERVICE, restarted=True, _if=runtime.did_change
    )
    gpu_container_verified(
        name="Verify a GPU container sees the host's GPUs",
        image=settings["nvidia_ctk_verify_image"],
        image_field="nvidia_ctk_verify_image",
    )
