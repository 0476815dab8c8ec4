"""preflight: refuse, before any role changes the rig, what the bare host already shows is wrong.

Runs right after rig_lock (roles.PIPELINE), from facts read under the lock, and needs no engine. Refuses
(rigkit.preflight.bare_host_preflight, ``force`` as in serving):
- RAM: MemAvailable < L1 + ``ram_reserve_gb`` (even forced); MemTotal below the profile's minimum;
- the rig's /dev/shm below what the engine needs (the stack runs with ``ipc: host``);
- ``serving_port`` held by anything but rigkit's own stack;
- a GPU profile on a rig whose PCI bus shows no (or too few) NVIDIA GPUs, or whose ``gpus`` makes the
  driver roles skip them; GPU memory where nvidia-smi already answers;
- ``l2_device`` missing, holding what l2_disk must not format, or another device on ``l2_mount_point``
  (l2_disk's own ``checked_device``);
- L2 free space below ``l2_budget_gb`` once the L2 filesystem (or, with ``kv_share``, the shared mount) is mounted.
A refusal is one failing operation ("Preflight refused before any change") naming the field, the value and
the fix; that rig gets nothing else, the other rigs carry on. What needs the engine (compose, the image, the
registry) stays in the serving role's preflight, which repeats these checks.
Its gates take the rig survey (rigkit.survey, read once per run right after the lock: one round trip).
Declares no variables of its own: it reads the serving knobs, ``gpus`` and the l2_disk role's variables.
"""

from __future__ import annotations

from typing import Optional

from pyinfra import host
from pyinfra.api.deploy import deploy
from pyinfra.operations import python

from rigkit.errors import PreflightError
from rigkit.operations import refusal_of, refuse, say
from rigkit.preflight import Finding, HostFacts, bare_host_preflight, refusals
from rigkit.settings.hostdata import RigSettings
from rigkit.survey import RigState
from roles import Run
from roles.l2_disk import checked_device


def _l2_device(rig: RigSettings, state: RigState) -> tuple[Optional[Finding], bool]:
    """(l2_disk's refusal of the declared device, whether l2_path's filesystem can be measured now)."""
    disk = rig.l2_disk
    if rig.declared_stack is not None and rig.declared_stack.knobs["kv_share"]:
        return None, state.kv_share_mount is not None  # the store is on the shared mount, once kv_share mounted it
    if not disk["l2_device"]:
        return None, True  # no L2 disk role on this rig: l2_path's filesystem is what it is
    try:
        probe, _, _ = checked_device(disk, state)
    except PreflightError as refused:
        return Finding.refused_by("l2-device", refused), False
    return None, state.l2_mount is not None and state.l2_mount["source"] == probe["path"]


def gather_findings(rig: RigSettings, state: RigState) -> list[Finding]:
    settings = rig.stack
    device_refusal, l2_measurable = _l2_device(rig, state)
    # a broken nvidia-smi (driver/library mismatch) is the driver role's to fix: count the bus instead
    smi_answers = state.nvidia_smi is not None and not state.nvidia_smi["error"]
    facts = HostFacts.from_state(
        state,
        gpu_memory_csv="\n".join(state.gpu_memory) if smi_answers else None,
        l2_free_bytes=state.l2_free_bytes if l2_measurable else None,
    )
    findings = bare_host_preflight(settings, facts, state.pci_gpus, rig.host["gpus"])
    return findings + ([device_refusal] if device_refusal else [])


@deploy("preflight")
def preflight(rig: RigSettings, run: Run) -> None:
    """One failing operation naming every refusal (and ``run.refused_by``) when the bare host refuses."""
    findings = gather_findings(rig, run.rig_state(rig))
    refused = refusals(findings)
    if not refused:
        say(host, f"preflight: {len(findings)} host checks passed before any change")
        return
    python.call(name="Preflight refused before any change", function=refuse, **refusal_of(refused))
    run.refused_by = "preflight"
