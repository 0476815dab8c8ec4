"""nvidia: the driver's kernel module, the driver and GPU-container checks, the container runtime."""

from __future__ import annotations

from typing import Optional

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File
from pyinfra.facts.server import KernelModules
from pyinfra.operations import server

from rigkit.facts.docker import DockerRunCheck
from rigkit.facts.nvidia import NvidiaModuleVersion, NvidiaPowerLimits, NvidiaSmiGpus, parse_query_gpus
from rigkit.nvidia_smi import power_limit_argv
from rigkit.operations import fail, say
from rigkit.operations.apt import upstream_version
from rigkit.operations.docker import pick_verify_image, read_json_file


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
        host.noop(f"{daemon_json} has the nvidia runtime{' as its default' if is_default else ''}")
        return
    yield StringCommand(
        "nvidia-ctk", "runtime", "configure", "--runtime=docker", *(["--set-as-default"] if set_default else [])
    )


@operation()
def kernel_module_unloaded(module: str):
    """
    Unload a kernel module if it is loaded; a module in use stays until the next boot.

    + module: module name (e.g. nouveau)
    """
    if module not in host.get_fact(KernelModules):
        host.noop(f"module {module} is not loaded")
        return
    # a module in use cannot be unloaded now: not an error, it stays until the next boot
    yield StringCommand(
        "modprobe",
        "-r",
        QuoteString(module),
        "||",
        "echo",
        QuoteString(f"{module} is in use: it stays loaded until a reboot"),
    )


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
def nvidia_module_current(
    version_package: str, pinned_version: Optional[str], branch: str, allow_reboot: bool, reboot_timeout: int = 600
):
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
    nouveau_loaded = "nouveau" in host.get_fact(KernelModules)
    action = module_action(loaded, target, branch, nouveau_loaded)
    if action == "none":
        host.noop(f"module nvidia {loaded} is loaded")
    elif action == "load":
        yield StringCommand("modprobe", "nvidia")
    elif action == "reboot":
        if not allow_reboot:
            running = "nouveau" if nouveau_loaded else f"nvidia {loaded}"
            if not host.state.is_executing:
                # Stop only once the packages are in, so a later reboot picks the new driver up.
                say(
                    host,
                    f"reboot required after this install ({running} is loaded) and "
                    "nvidia_driver_allow_reboot=false: the deploy will stop there",
                )
                return
            raise fail(
                "nvidia_driver_allow_reboot",
                False,
                f"reboot required: the running kernel has {running} loaded, "
                f"the installed driver is {target or 'branch ' + branch}",
                "reboot the host (then run the deploy again), or set nvidia_driver_allow_reboot=true",
            )
        yield from server.reboot._inner(reboot_timeout=reboot_timeout)


@operation()
def nvidia_driver_verified(version_package: str, pinned_version: Optional[str], branch: str):
    """
    Check: nvidia-smi answers and reports the pinned driver on every GPU.

    + version_package / pinned_version / branch: as for ``nvidia_module_current``
    """
    yield from ()  # a check: it never yields a command
    if not host.state.is_executing:
        host.noop("nvidia-smi is checked while the deploy runs")
        return
    expected = upstream_version(pinned_version) if pinned_version else installed_driver_version(version_package)
    wanted = expected or f"branch {branch}"
    smi = host.get_fact(NvidiaSmiGpus)
    if smi is None:
        raise fail(
            "nvidia_driver_branch",
            branch,
            "nvidia-smi is not installed after the driver install",
            "check the apt output above; the driver packages should provide nvidia-smi",
        )
    if smi["error"]:
        raise fail(
            "nvidia_driver_version",
            wanted,
            f"nvidia-smi fails: {smi['error']}",
            "a driver/library mismatch means the new driver is installed but not loaded: reboot",
        )
    reported = sorted({gpu["driver_version"] for gpu in smi["gpus"]})
    if not reported:
        raise fail("gpus", "?", "nvidia-smi lists no GPU", "check the GPUs are seen (lspci) and the module loads")
    matches = all(v == expected for v in reported) if expected else all(v.split(".")[0] == branch for v in reported)
    if not matches:
        raise fail(
            "nvidia_driver_version",
            wanted,
            f"nvidia-smi reports driver {', '.join(reported)} but {wanted} is pinned",
            "reboot to load the installed driver, or pin the version the host runs",
        )
    host.noop(f"nvidia-smi reports driver {', '.join(reported)} on {len(smi['gpus'])} GPU(s)")


POWER_LIMIT_FIELD = "nvidia_driver_power_limit_w"


def power_limit_refusal(limit_w: float, gpus: list[dict]):
    """The OperationError for a limit some card does not accept (its min/max as nvidia-smi reports them), else None."""
    outside = [
        g for g in gpus if g["min_w"] is not None and g["max_w"] is not None and not g["min_w"] <= limit_w <= g["max_w"]
    ]
    if not outside:
        return None
    ranges = "; ".join(f"GPU {g['index']} accepts {g['min_w']:g}-{g['max_w']:g} W" for g in outside)
    low = max(g["min_w"] for g in gpus if g["min_w"] is not None)
    high = min(g["max_w"] for g in gpus if g["max_w"] is not None)
    within = f"declare a limit within {low:g}-{high:g} W" if low <= high else "the cards share no power limit"
    return fail(
        POWER_LIMIT_FIELD,
        limit_w,
        f"lies outside the card's range ({ranges}: nvidia-smi -q -d POWER, Min/Max Power Limit)",
        f"{within}, or remove {POWER_LIMIT_FIELD} to keep the cards' default limit",
    )


@operation()
def gpu_power_limit_in_range(limit_w: float):
    """
    Check, before the role changes anything: every GPU accepts ``limit_w``. A host whose nvidia-smi does not
    answer yet (no driver) is checked by ``gpu_power_limit`` once the driver is in.

    + limit_w: the declared power limit (watts)
    """
    yield from ()  # a check: it never yields a command
    limits = host.get_fact(NvidiaPowerLimits)
    if not limits or limits["error"] or not limits["gpus"]:
        host.noop(f"the cards' power range is read once nvidia-smi answers: {limit_w:g} W checked after the install")
        return
    refusal = power_limit_refusal(limit_w, limits["gpus"])
    if refusal:
        raise refusal
    host.noop(f"every GPU accepts a {limit_w:g} W power limit")


@operation()
def gpu_power_limit(limit_w: float, tolerance_w: float):
    """
    Every GPU's power limit set to ``limit_w`` (``nvidia-smi -pl``) unless each enforces it already; refused when
    a card does not accept it.

    + limit_w: the declared power limit (watts), for all GPUs
    + tolerance_w: how far an enforced limit may lie from ``limit_w`` and still hold (gpu_power_limit_tolerance_w)
    """
    limits = host.get_fact(NvidiaPowerLimits)
    if not limits or limits["error"] or not limits["gpus"]:
        if not host.state.is_executing:
            host.noop(f"the power limit is set once nvidia-smi answers: {limit_w:g} W after the driver install")
            return
        problem = (limits or {}).get("error") or ("nvidia-smi lists no GPU" if limits else "nvidia-smi is missing")
        raise fail(
            POWER_LIMIT_FIELD,
            limit_w,
            f"the GPUs' power limits cannot be read: {problem}",
            "check the driver verification above (a driver/library mismatch needs a reboot)",
        )
    refusal = power_limit_refusal(limit_w, limits["gpus"])
    if refusal:
        raise refusal
    off = [g for g in limits["gpus"] if g["enforced_w"] is None or abs(g["enforced_w"] - limit_w) > tolerance_w]
    if not off:
        host.noop(f"every GPU enforces a {limit_w:g} W power limit")
        return
    yield StringCommand(*power_limit_argv(limit_w))


@operation()
def gpu_power_limit_default(unit_path: str, tolerance_w: float):
    """
    No limit declared: each GPU back at its default limit when rigkit's boot unit shows one was declared before
    (the unit is removed after this); a limit set by hand (no unit) is left alone.

    + unit_path: the boot unit an earlier declaration wrote
    + tolerance_w: as for ``gpu_power_limit``
    """
    if host.get_fact(File, path=unit_path) is None:
        host.noop("no power limit declared: the cards' limits are left as they are")
        return
    limits = host.get_fact(NvidiaPowerLimits)
    if not limits or limits["error"]:
        host.noop("nvidia-smi does not answer: the cards return to their default limit at the next reboot")
        return
    off = [
        g
        for g in limits["gpus"]
        if g["default_w"] is not None
        and (g["enforced_w"] is None or abs(g["enforced_w"] - g["default_w"]) > tolerance_w)
    ]
    if not off:
        host.noop("every GPU enforces its default power limit")
        return
    for g in off:
        yield StringCommand(*power_limit_argv(g["default_w"], g["index"]))


@operation()
def gpu_container_verified(image: Optional[str], image_field: str):
    """
    Check: a container with ``--gpus all`` sees the same GPUs (by UUID) as the host.

    + image: image to run nvidia-smi in (the runtime injects nvidia-smi); None = a local image
    + image_field: the variable that sets ``image``, named in errors
    """
    yield from ()  # a check: it never yields a command
    if not host.state.is_executing:
        host.noop("a GPU container is checked while the deploy runs")
        return
    smi = host.get_fact(NvidiaSmiGpus)
    host_gpus = sorted(gpu["uuid"] for gpu in (smi or {}).get("gpus", []))
    if not host_gpus:
        raise fail("gpus", "?", "the host's nvidia-smi lists no GPU", "run the nvidia_driver role first")
    chosen = pick_verify_image(image)
    if chosen is None:
        say(host, f"no local image to start a GPU container from: GPU check skipped (set {image_field})")
        return
    run = host.get_fact(
        DockerRunCheck,
        image=chosen,
        run_args="--gpus all",
        container_command="nvidia-smi --query-gpu=uuid,driver_version --format=csv",
    )
    seen = sorted(gpu["uuid"] for gpu in parse_query_gpus(run["output"].splitlines()))
    if not run["ok"] or seen != host_gpus:
        raise fail(
            "nvidia_ctk_verify_image",
            chosen,
            f"a GPU container sees {seen or run['output'][-200:]}, the host has {host_gpus}",
            "check `nvidia-ctk runtime configure` ran and the engine was restarted",
        )
    host.noop(f"a container from {chosen} with --gpus all sees the host's {len(host_gpus)} GPU(s)")
