"""nvidia_driver: a pinned NVIDIA driver, nouveau out of the way, verified with nvidia-smi.

Ensures
- the driver branch (and optionally the exact apt version) is installed and held, open kernel
  modules by default (Turing on; Blackwell needs them):
  Ubuntu 22.04/24.04 from the distribution's archive (``nvidia-driver-580-open``, ``-server`` and
  headless variants); Debian 12 from NVIDIA's CUDA repository, because bookworm's own
  non-free archive ships a single older branch and cannot honour a branch pin: the branch pinning
  package goes in first, in its own apt transaction, so the driver's install already resolves
  within the branch (cuda-drivers' dependencies have only lower bounds);
- persistence mode: nvidia-persistenced enabled and running (``nvidia_driver_persistence_mode``);
- the declared power limit (``nvidia_driver_power_limit_w``, every GPU): refused before any change when a card
  does not accept it (its min/max as nvidia-smi reports them; a host without the driver yet: once it is in), set
  with ``nvidia-smi -pl`` unless every GPU enforces it already, and set again at every boot by a oneshot unit
  after nvidia-persistenced (the driver forgets it at reboot); unset: the cards' default limit, and after an
  earlier declaration (its unit still there) each GPU set back to its default and the unit disabled and removed;
  a limit set by hand, without rigkit's unit, is left alone;
- nouveau is blacklisted (initramfs rebuilt only when that file changed) and unloaded;
- the running kernel uses the installed driver: the module is loaded, or, when the install
  changed and another module is running, the host reboots (``nvidia_driver_allow_reboot``
  false stops with "reboot required" instead) and pyinfra waits for it to come back.
Verifies that nvidia-smi reports the pinned version on every GPU, else fails naming both.
Hosts with ``gpus: 0`` (the lab) skip the role and say so.
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api.deploy import deploy
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File
from pyinfra.facts.server import KernelModules
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

from rigkit.distro import TargetOS, target_os
from rigkit.facts.apt import AptHeldPackages
from rigkit.facts.batch import FactSpec
from rigkit.facts.nvidia import NvidiaPowerLimits, NvidiaSmiGpus
from rigkit.facts.surveyed import put_reads, service_reads
from rigkit.nvidia_smi import power_limit_argv
from rigkit.operations import say
from rigkit.operations.apt import deb_from_url, packages_held, packages_installed, pinned
from rigkit.operations.nvidia import (
    POWER_LIMIT_FIELD,
    gpu_power_limit,
    gpu_power_limit_default,
    gpu_power_limit_in_range,
    kernel_module_unloaded,
    nvidia_driver_verified,
    nvidia_module_current,
)
from rigkit.settings.hostdata import RigSettings
from rigkit.systemd import exec_command_line
from roles import Run

NOUVEAU_BLACKLIST = "/etc/modprobe.d/rigkit-blacklist-nouveau.conf"
NOUVEAU_BLACKLIST_TEXT = (
    "# written by rigkit: the NVIDIA driver needs nouveau out of the way\n"
    "blacklist nouveau\noptions nouveau modeset=0\n"
)
CUDA_KEYRING_PACKAGE = "cuda-keyring"
CUDA_KEYRING_DEB = "cuda-keyring_1.1-1_all.deb"
POWER_LIMIT_UNIT = "rigkit-gpu-power-limit.service"
POWER_LIMIT_UNIT_PATH = f"/etc/systemd/system/{POWER_LIMIT_UNIT}"


def power_limit_unit_text(limit_w: float) -> str:
    """Sets the declared power limit at every boot (the driver forgets it at reboot), ordered after
    nvidia-persistenced so the limit is set once the daemon holds the GPUs initialised."""
    return (
        "[Unit]\n"
        f"Description=rigkit: every GPU's power limit at {limit_w:g} W ({POWER_LIMIT_FIELD})\n"
        "After=nvidia-persistenced.service\n\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        f"ExecStart={exec_command_line(power_limit_argv(limit_w))}\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def branch_pinning_package(settings: dict) -> str:
    """Debian's CUDA repository: the package whose apt preferences keep every driver package on the branch."""
    return f"nvidia-driver-pinning-{settings['nvidia_driver_branch']}"


def driver_packages(os: TargetOS, settings: dict) -> tuple[list[str], str]:
    """(apt package names to install and hold, the package whose version is the driver's)."""
    branch = settings["nvidia_driver_branch"]
    if os.id == "ubuntu":
        flavour = f"{branch}-server" if settings["nvidia_driver_server"] else branch
        open_suffix = "-open" if settings["nvidia_driver_open"] else ""
        if settings["nvidia_driver_headless"]:
            names = [f"nvidia-headless-{flavour}{open_suffix}", f"nvidia-utils-{flavour}"]
            return names, f"nvidia-utils-{flavour}"
        return [f"nvidia-driver-{flavour}{open_suffix}"], f"nvidia-driver-{flavour}{open_suffix}"
    # Debian 12, CUDA repository: the pinning package keeps apt on the branch, the kernel
    # module package carries the driver version.
    kernel = "nvidia-kernel-open-dkms" if settings["nvidia_driver_open"] else "nvidia-kernel-dkms"
    userspace = "nvidia-driver-cuda" if settings["nvidia_driver_headless"] else "cuda-drivers"
    return [branch_pinning_package(settings), userspace, kernel], kernel


def package_specs(os: TargetOS, settings: dict) -> list[str]:
    names, _ = driver_packages(os, settings)
    version = settings["nvidia_driver_version"]
    # The branch-pinning package has its own version scheme: never pin it to the driver's.
    return [name if name == branch_pinning_package(settings) else pinned([name], version)[0] for name in names]


def operation_reads(rig: RigSettings) -> list[FactSpec]:
    """What this role's operations read on a rig whose driver is right (the CUDA keyring's package among the
    packages; the loaded module's version only after an install, read then)."""
    if rig.host["gpus"] == 0:
        return []
    persistence = service_reads("nvidia-persistenced") if rig.nvidia_driver["nvidia_driver_persistence_mode"] else []
    if rig.nvidia_driver[POWER_LIMIT_FIELD] is None:
        power = [*service_reads(POWER_LIMIT_UNIT), FactSpec.of(File, path=POWER_LIMIT_UNIT_PATH)]
    else:
        power = [FactSpec.of(NvidiaPowerLimits), *put_reads(POWER_LIMIT_UNIT_PATH), *service_reads(POWER_LIMIT_UNIT)]
    return [
        FactSpec.of(DebPackages),
        *put_reads(NOUVEAU_BLACKLIST),
        FactSpec.of(KernelModules),
        FactSpec.of(AptHeldPackages),
        *persistence,
        *power,
        FactSpec.of(NvidiaSmiGpus),
    ]


@deploy("nvidia_driver")
def nvidia_driver(rig: RigSettings, run: Run) -> None:
    settings = rig.nvidia_driver
    if rig.host["gpus"] == 0:
        say(host, "nvidia_driver: skipped, this host declares gpus: 0")
        return
    os = target_os(run.rig_state(rig).os_release, "nvidia_driver")
    power_limit = settings[POWER_LIMIT_FIELD]
    if power_limit is not None:
        gpu_power_limit_in_range(name="The cards accept the declared power limit", limit_w=power_limit)
    if os.id == "debian":
        if settings["nvidia_driver_server"]:
            say(host, "nvidia_driver: nvidia_driver_server applies to Ubuntu only; Debian uses the CUDA repo")
        repo = f"{settings['nvidia_driver_cuda_repo_url']}/debian{os.version}/x86_64"
        deb_from_url(
            name="NVIDIA CUDA repository keyring", package=CUDA_KEYRING_PACKAGE, url=f"{repo}/{CUDA_KEYRING_DEB}"
        )

    blacklist = files.put(
        name="Blacklist nouveau", src=StringIO(NOUVEAU_BLACKLIST_TEXT), dest=NOUVEAU_BLACKLIST, mode="644"
    )
    server.shell(
        name="Rebuild the initramfs without nouveau", commands=["update-initramfs -u"], _if=blacklist.did_change
    )
    kernel_module_unloaded(name="Unload nouveau", module="nouveau")

    _, version_package = driver_packages(os, settings)
    specs = package_specs(os, settings)
    if os.id == "debian":
        # NVIDIA's Debian guide: the pinning package first, on its own; installed in one transaction with the
        # driver, apt may resolve cuda-drivers' lower-bound dependencies to a newer branch before the pin applies
        pinning = branch_pinning_package(settings)
        packages_installed(name="Install the NVIDIA branch pinning package", packages=[pinning])
        specs = [spec for spec in specs if spec != pinning]
    install = packages_installed(name="Install the NVIDIA driver", packages=specs)
    packages_held(name="Hold the NVIDIA driver packages", packages=package_specs(os, settings))
    nvidia_module_current(
        name="Load the installed NVIDIA driver (reboot if another is running)",
        version_package=version_package,
        pinned_version=settings["nvidia_driver_version"],
        branch=settings["nvidia_driver_branch"],
        allow_reboot=settings["nvidia_driver_allow_reboot"],
        reboot_timeout=settings["nvidia_driver_reboot_timeout"],
        _if=any_changed(install, blacklist),
    )
    if settings["nvidia_driver_persistence_mode"]:
        systemd.service(
            name="Persistence mode (nvidia-persistenced)", service="nvidia-persistenced", running=True, enabled=True
        )
    nvidia_driver_verified(
        name="Verify nvidia-smi reports the pinned driver",
        version_package=version_package,
        pinned_version=settings["nvidia_driver_version"],
        branch=settings["nvidia_driver_branch"],
    )
    power_limit_applied(power_limit, rig.gpu_health["gpu_power_limit_tolerance_w"])


def power_limit_applied(limit_w, tolerance_w: float) -> None:
    """The declared limit set now and at every boot; none declared: the cards' default (set back after an earlier
    declaration), no unit left behind."""
    if limit_w is None:
        gpu_power_limit_default(
            name="No declared power limit: the cards back at their default",
            unit_path=POWER_LIMIT_UNIT_PATH,
            tolerance_w=tolerance_w,
        )
        systemd.service(
            name="No declared power limit: its boot unit disabled",
            service=POWER_LIMIT_UNIT,
            running=None,
            enabled=False,
        )
        removed = files.file(
            name="No declared power limit: its boot unit removed", path=POWER_LIMIT_UNIT_PATH, present=False
        )
        systemd.daemon_reload(name="systemd forgets the power limit unit", _if=removed.did_change)
        return
    gpu_power_limit(name=f"Every GPU's power limit at {limit_w:g} W", limit_w=limit_w, tolerance_w=tolerance_w)
    unit = files.put(
        name="Power limit unit (sets it again at every boot)",
        src=StringIO(power_limit_unit_text(limit_w)),
        dest=POWER_LIMIT_UNIT_PATH,
        mode="644",
    )
    systemd.daemon_reload(name="systemd reads the power limit unit", _if=unit.did_change)
    # enabled only: the limit is set above; the unit sets it at the next boot
    systemd.service(name="Power limit unit enabled", service=POWER_LIMIT_UNIT, running=None, enabled=True)
