"""Operations the provisioning roles need beyond pyinfra's own.

Each reads facts, compares with the wanted state and yields only the commands that close
the difference, so a host that is already right gets none. The ``*_verified`` operations
are checks: they yield nothing, run only while executing (during prepare or ``--dry`` the
thing they check may not be installed yet) and fail the host with a message naming what
was expected, what was found and the fix.
"""

from __future__ import annotations

import json
from io import StringIO
from typing import Callable, Optional

from pyinfra import host
from pyinfra.api import OperationError, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt, files, server

from rigkit.errors import PreflightError, RigkitError
from roles._common import say, upstream_version
from roles.host_facts import (
    AptHeldPackages, BlockDeviceProbe, DockerEngine, DockerLocalImages, DockerRunCheck, FileText,
    LoadedKernelModules, MountedFilesystem, NvidiaModuleVersion, NvidiaSmiGpus, parse_query_gpus,
)


def fail(field: str, value, problem: str, fix: str) -> OperationError:
    """An OperationError worded like every rigkit error: field, value, problem, fix."""
    return OperationError(str(RigkitError(field, value, problem, fix)))


class any_changed:
    """An ``_if`` condition true when any of the given operations changed the host.

    pyinfra's ``_if=[a, b]`` means all; a reboot is due when either happened. The operations
    are kept on the object so the operation tests can resolve the condition before execution.
    """

    def __init__(self, *ops):
        self.ops = ops

    def __call__(self) -> bool:
        return any(op.did_change() for op in self.ops)


def _executing() -> bool:
    return host.state.is_executing


# ---------------------------------------------------------------------------------- packages

def _spec_name(spec: str) -> str:
    return spec.split("=", 1)[0]


@operation()
def packages_installed(packages: list[str]):
    """
    Install apt packages (``name`` or ``name=version``); a held package may move when its pin does.

    + packages: package specs; a version pins the package to exactly that version

    ``apt-get update`` runs only when something is about to be installed, so a host that
    already has the pinned packages runs nothing. Pins may move down as well as up.
    """
    installed = host.get_fact(DebPackages)
    missing = []
    for spec in packages:
        name, _, version = spec.partition("=")
        have = installed.get(name) or []
        if not have or (version and version not in have):
            missing.append(spec)
    if missing:
        yield "apt-get update"
        yield from apt.packages._inner(
            packages=packages,
            allow_downgrades=True,
            extra_install_args="--allow-change-held-packages",
        )


@operation()
def packages_held(packages: list[str]):
    """
    ``apt-mark hold`` the packages, so an unattended upgrade cannot move them.

    + packages: package names or specs (a ``=version`` suffix is ignored)
    """
    held = host.get_fact(AptHeldPackages)
    to_hold = [_spec_name(spec) for spec in packages if _spec_name(spec) not in held]
    if to_hold:
        yield f"apt-mark hold {' '.join(to_hold)}"


@operation()
def deb_from_url(package: str, url: str):
    """
    Install a .deb downloaded from ``url`` unless ``package`` is already installed.

    + package: the package the .deb provides (e.g. cuda-keyring)
    + url: where the .deb is
    """
    if package in host.get_fact(DebPackages):
        return
    local = f"/tmp/rigkit-{package}.deb"
    yield from files.download._inner(src=url, dest=local)
    yield f"dpkg -i {local}"
    yield f"rm -f {local}"


def apt_source_line(url: str, suite: str, components: str, keyring: str, arch: str) -> str:
    """One deb822-free source line, signed by its own keyring."""
    parts = ["deb", f"[arch={arch} signed-by={keyring}]", url, suite]
    if components:
        parts.append(components)
    return " ".join(parts) + "\n"


# -------------------------------------------------------------------------------- daemon.json

def read_json_file(path: str) -> dict:
    """The JSON object in a file on the host ({} when absent or empty); PreflightError if broken."""
    text = host.get_fact(FileText, path=path)
    if not text or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PreflightError(path, text[:80], f"not valid JSON ({exc})",
                             f"repair or remove {path}; rigkit merges into it and will not guess") from None
    if not isinstance(value, dict):
        raise PreflightError(path, text[:80], "not a JSON object", f"make {path} a JSON object")
    return value


def merge_options(current: dict, wanted: dict) -> dict:
    """``current`` with ``wanted`` laid over it; nested objects merge key by key, other keys stay."""
    merged = dict(current)
    for key, value in wanted.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_options(merged[key], value)
        else:
            merged[key] = value
    return merged


def render_json(value: dict) -> str:
    return json.dumps(value, indent=2, sort_keys=True) + "\n"


@operation()
def json_file_merged(path: str, options: dict):
    """
    Merge ``options`` into the JSON object in ``path`` and write it only if that changes it.

    + path: the JSON file (e.g. /etc/docker/daemon.json)
    + options: keys rigkit owns; every other key in the file is kept as it is
    """
    current = read_json_file(path)
    merged = merge_options(current, options)
    exists = host.get_fact(FileText, path=path) is not None
    if merged == current and (exists or not options):
        return
    yield from files.put._inner(src=StringIO(render_json(merged)), dest=path, mode="644")


@operation()
def nvidia_runtime_configured(daemon_json: str, set_default: bool):
    """
    ``nvidia-ctk runtime configure --runtime=docker`` unless daemon.json already has it.

    + daemon_json: path of the engine's daemon.json
    + set_default: also make nvidia the default runtime (never unset by rigkit)
    """
    current = read_json_file(daemon_json)
    has_runtime = "nvidia" in (current.get("runtimes") or {})
    is_default = current.get("default-runtime") == "nvidia"
    if has_runtime and (is_default or not set_default):
        return
    command = "nvidia-ctk runtime configure --runtime=docker"
    if set_default:
        command += " --set-as-default"
    yield command


# ----------------------------------------------------------------------------- kernel, driver

@operation()
def kernel_module_unloaded(module: str):
    """
    Unload a kernel module if it is loaded; a module in use stays until the next boot.

    + module: module name (e.g. nouveau)
    """
    if module in host.get_fact(LoadedKernelModules):
        yield f"modprobe -r {module} || echo '{module} is in use: it stays loaded until a reboot'"


def module_action(loaded: Optional[str], target: Optional[str], branch: str, nouveau_loaded: bool) -> str:
    """What the running kernel needs after an install: "none", "load" or "reboot".

    ``target`` is the installed (or pinned) driver version; without one, any module of the
    pinned branch counts as right.
    """
    if nouveau_loaded:
        return "reboot"
    if loaded is None:
        return "load"
    if target is not None:
        return "none" if loaded == target else "reboot"
    return "none" if loaded.split(".")[0] == branch else "reboot"


def installed_driver_version(version_package: str) -> Optional[str]:
    versions = host.get_fact(DebPackages).get(version_package) or []
    return upstream_version(sorted(versions)[-1]) if versions else None


@operation()
def nvidia_module_current(version_package: str, pinned_version: Optional[str], branch: str,
                          allow_reboot: bool, reboot_timeout: int = 600):
    """
    Make the running kernel use the installed driver: load it, or reboot when another is loaded.

    + version_package: the package whose version is the driver's (e.g. nvidia-utils-580-server)
    + pinned_version: exact apt version pinned, if any
    + branch: the driver branch (e.g. "580")
    + allow_reboot: False fails the host with "reboot required" instead of rebooting
    + reboot_timeout: seconds to wait for the host to come back
    """
    target = installed_driver_version(version_package)
    if target is None and pinned_version:
        target = upstream_version(pinned_version)
    loaded = host.get_fact(NvidiaModuleVersion)
    nouveau_loaded = "nouveau" in host.get_fact(LoadedKernelModules)
    action = module_action(loaded, target, branch, nouveau_loaded)
    if action == "load":
        yield "modprobe nvidia"
    elif action == "reboot":
        if not allow_reboot:
            running = "nouveau" if nouveau_loaded else f"nvidia {loaded}"
            if not _executing():
                # Stop only once the packages are in, so a later reboot picks the new driver up.
                say(host, f"reboot required after this install ({running} is loaded) and "
                          "nvidia_driver_allow_reboot=false: the deploy will stop there")
                return
            raise fail("nvidia_driver_allow_reboot", False,
                       f"reboot required: the running kernel has {running} loaded, "
                       f"the installed driver is {target or 'branch ' + branch}",
                       "reboot the host (then run the deploy again), or set nvidia_driver_allow_reboot=true")
        yield from server.reboot._inner(reboot_timeout=reboot_timeout)


@operation()
def nvidia_driver_verified(version_package: str, pinned_version: Optional[str], branch: str):
    """
    Check: nvidia-smi answers and reports the pinned driver on every GPU.

    + version_package / pinned_version / branch: as for ``nvidia_module_current``
    """
    yield from ()  # a check: it never yields a command
    if not _executing():
        return
    expected = upstream_version(pinned_version) if pinned_version else installed_driver_version(version_package)
    wanted = expected or f"branch {branch}"
    smi = host.get_fact(NvidiaSmiGpus)
    if smi is None:
        raise fail("nvidia_driver_branch", branch, "nvidia-smi is not installed after the driver install",
                   "check the apt output above; the driver packages should provide nvidia-smi")
    if smi["error"]:
        raise fail("nvidia_driver_version", wanted, f"nvidia-smi fails: {smi['error']}",
                   "a driver/library mismatch means the new driver is installed but not loaded: reboot")
    reported = sorted({gpu["driver_version"] for gpu in smi["gpus"]})
    if not reported:
        raise fail("gpus", "?", "nvidia-smi lists no GPU", "check the GPUs are seen (lspci) and the module loads")
    matches = all(v == expected for v in reported) if expected else all(
        v.split(".")[0] == branch for v in reported)
    if not matches:
        raise fail("nvidia_driver_version", wanted,
                   f"nvidia-smi reports driver {', '.join(reported)} but {wanted} is pinned",
                   "reboot to load the installed driver, or pin the version the host runs")


# --------------------------------------------------------------------------------- docker checks

def pick_verify_image(image: Optional[str]) -> Optional[str]:
    """The image to run a check container from: the declared one, else one already on the host."""
    if image:
        return image
    local = host.get_fact(DockerLocalImages)
    return local[0] if local else None


@operation()
def docker_engine_verified(image: Optional[str], image_field: str):
    """
    Check: the engine answers ``docker info`` and runs a container from ``image``.

    + image: image to run (``true`` inside, host network); None = an image already on the host,
      and when there is none the run step is skipped with a notice (no registry is contacted)
    + image_field: the variable that sets ``image``, named in errors
    """
    yield from ()  # a check: it never yields a command
    if not _executing():
        return
    engine = host.get_fact(DockerEngine)
    if engine is None or engine["error"]:
        problem = "no docker CLI" if engine is None else f"the engine does not answer: {engine['error']}"
        raise fail("docker", "engine", problem, "see `journalctl -u docker` on the host")
    chosen = pick_verify_image(image)
    if chosen is None:
        say(host, f"docker {engine['server_version']} answers; no local image to run a container from, "
                  f"run check skipped (set {image_field} to check it)")
        return
    run = host.get_fact(DockerRunCheck, image=chosen)
    if not run["ok"]:
        raise fail(image_field, chosen, f"the engine cannot run a container: {run['output'][-300:]}",
                   f"fix the engine, or set {image_field} to an image that has /bin/true")


@operation()
def gpu_container_verified(image: Optional[str], image_field: str):
    """
    Check: a container with ``--gpus all`` sees the same GPUs (by UUID) as the host.

    + image: image to run nvidia-smi in (the runtime injects nvidia-smi); None = a local image
    + image_field: the variable that sets ``image``, named in errors
    """
    yield from ()  # a check: it never yields a command
    if not _executing():
        return
    smi = host.get_fact(NvidiaSmiGpus)
    host_gpus = sorted(gpu["uuid"] for gpu in (smi or {}).get("gpus", []))
    if not host_gpus:
        raise fail("gpus", "?", "the host's nvidia-smi lists no GPU", "run the nvidia_driver role first")
    chosen = pick_verify_image(image)
    if chosen is None:
        say(host, f"no local image to start a GPU container from: GPU check skipped (set {image_field})")
        return
    run = host.get_fact(DockerRunCheck, image=chosen, run_args="--gpus all",
                        container_command="nvidia-smi --query-gpu=uuid,driver_version --format=csv")
    seen = sorted(gpu["uuid"] for gpu in parse_query_gpus(run["output"].splitlines()))
    if not run["ok"] or seen != host_gpus:
        raise fail("nvidia_ctk_verify_image", chosen,
                   f"a GPU container sees {seen or run['output'][-200:]}, the host has {host_gpus}",
                   "check `nvidia-ctk runtime configure` ran and the engine was restarted")


# ------------------------------------------------------------------------------------- disks

@operation()
def filesystem_made(device: str, fstype: str, label: str, uuid: str, mount_point: str,
                    decide: Callable[[Optional[dict]], str]):
    """
    Make a filesystem on ``device`` when ``decide(probe)`` says so.

    + device: the block device
    + fstype / label / uuid: the filesystem to make (the UUID is chosen up front so the
      fstab entry can be written before the filesystem exists)
    + mount_point: unmounted first when the device's current filesystem is mounted there
    + decide: the refusal rules, re-checked against a fresh probe right before formatting;
      returns "use", "format" or "wipe", raises when the device must not be touched
    """
    action = decide(host.get_fact(BlockDeviceProbe, device=device))
    if action == "use":
        return
    if action == "wipe":
        if host.get_fact(MountedFilesystem, mount_point=mount_point) is not None:
            yield f"umount {mount_point}"
        yield f"wipefs -a {device}"
    if fstype == "xfs":
        yield f"mkfs.xfs -f -L {label} -m uuid={uuid} {device}"
    else:
        yield f"mkfs.{fstype} -q -F -L {label} -U {uuid} {device}"


def fstab_with_entry(fstab: str, mount_point: str, entry: str) -> str:
    """/etc/fstab text with the line for ``mount_point`` replaced by ``entry`` (appended if none)."""
    lines = fstab.splitlines()
    out, placed = [], False
    for line in lines:
        fields = line.split()
        if fields and not fields[0].startswith("#") and len(fields) >= 2 and fields[1] == mount_point:
            if not placed:
                out.append(entry)
                placed = True
            continue
        out.append(line)
    if not placed:
        out.append(entry)
    return "\n".join(out) + "\n"


@operation()
def fstab_entry(mount_point: str, entry: str):
    """
    Make ``entry`` the only /etc/fstab line for ``mount_point``; other lines stay as they are.

    + mount_point: the second fstab field the entry owns
    + entry: the whole line (``UUID=... /mnt/x ext4 noatime,nofail 0 2``)
    """
    current = host.get_fact(FileText, path="/etc/fstab") or ""
    wanted = fstab_with_entry(current, mount_point, entry)
    if wanted.rstrip("\n") != current.rstrip("\n"):
        yield from files.put._inner(src=StringIO(wanted), dest="/etc/fstab", mode="644")


# Options fstab accepts that the kernel never shows in the mount's option list.
USERSPACE_MOUNT_OPTIONS = {"defaults", "nofail", "auto", "noauto", "user", "nouser", "users",
                           "owner", "group", "_netdev"}


def kernel_options(options: str) -> list[str]:
    return [o for o in options.split(",") if o and o not in USERSPACE_MOUNT_OPTIONS
            and not o.startswith(("x-", "comment="))]


@operation()
def mounted(mount_point: str, device: str, options: str):
    """
    Mount ``mount_point`` from its fstab entry; remount when a wanted option is missing.

    + mount_point: where the filesystem goes
    + device: the device that must be the one mounted there
    + options: the fstab options (userspace-only ones like nofail are not compared)
    """
    mount = host.get_fact(MountedFilesystem, mount_point=mount_point)
    if mount is None:
        yield f"mount {mount_point}"
        return
    probe = host.get_fact(BlockDeviceProbe, device=device)
    if probe is not None and mount["source"] != probe["path"]:
        raise fail("l2_mount_point", mount_point, f"{mount['source']} is mounted there, not {probe['path']}",
                   "unmount it, or choose another l2_mount_point")
    missing = [o for o in kernel_options(options) if o not in mount["options"]]
    if missing:
        yield f"mount -o remount,{','.join(kernel_options(options))} {mount_point}"
