"""Asking the rigs: the status script over SSH, one round trip per rig, every targeted rig in parallel."""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Optional

from rigkit.errors import RigkitError
from rigkit.fleet.targets import Targets
from rigkit.remote.tunnel import connect_ssh
from rigkit.settings.hostdata import Settings, rig_settings
from rigkit.status.gpu import GpuLimits
from rigkit.status.probe import status_script
from rigkit.status.rig import RigStatus, assess

# One round trip per rig: the script's own time on a healthy rig is well under a second (the API probe
# waits at most rigkit.status.probe.API_TIMEOUT_S); a rig that does not finish in this time is reported unreachable.
SCRIPT_TIMEOUT_S = 60

MAX_PARALLEL_RIGS = 16


def ask_rig(name: str, data: Mapping[str, Any], script: str, timeout_s: float = SCRIPT_TIMEOUT_S) -> str:
    """Run the script on the rig in one SSH round trip; its stdout. RigkitError/OSError when unreachable."""
    client = connect_ssh(data, name)
    try:
        # the script as the command itself, not on stdin: a command in it that reads stdin would eat the rest
        _, stdout, _ = client.exec_command(f"sh -c {shlex.quote(script)}", timeout=timeout_s)
        return stdout.read().decode(errors="replace")
    finally:
        client.close()


def rig_status(
    name: str,
    data: Mapping[str, Any],
    stack: Optional[Settings],
    ask: Callable[[str, Mapping[str, Any], str], str] = ask_rig,
    gpu_limits: Optional[GpuLimits] = None,
) -> RigStatus:
    try:
        output = ask(name, data, status_script(stack))
    except (RigkitError, OSError, EOFError) as exc:
        return RigStatus(name, reachable=False, error=str(exc), declared_image=stack.image if stack else None)
    except Exception as exc:  # paramiko's own (SSHException, socket.timeout): one rig down must not stop the rest
        return RigStatus(
            name, reachable=False, error=f"{type(exc).__name__}: {exc}", declared_image=stack.image if stack else None
        )
    if not output.strip():
        return RigStatus(
            name,
            reachable=False,
            error="the rig's shell printed nothing",
            declared_image=stack.image if stack else None,
        )
    return assess(name, stack, output, gpu_limits)


def fleet_status(targets: Targets, ask: Callable[[str, Mapping[str, Any], str], str] = ask_rig) -> list[RigStatus]:
    """Every targeted rig's status, asked in parallel; ConfigError (before any rig is asked) on bad data."""
    settings = {name: rig_settings(targets.data(name), needs_stack=False) for name in targets.names}
    stacks = {name: settings[name].declared_stack for name in targets.names}
    limits = {name: GpuLimits.from_sections(settings[name].sections, stacks[name]) for name in targets.names}
    with ThreadPoolExecutor(max_workers=min(len(targets.names), MAX_PARALLEL_RIGS)) as pool:
        return list(
            pool.map(lambda name: rig_status(name, targets.data(name), stacks[name], ask, limits[name]), targets.names)
        )
