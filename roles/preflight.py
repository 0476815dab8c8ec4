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
- L2 free space below ``l2_budget_gb`` once the L2 filesystem is mounted.
A refusal is one failing operation ("Preflight refused before any change") naming the field, the value and
the fix; that rig gets nothing else, the other rigs carry on. What needs the engine (compose, the image, the
registry) stays in the serving role's preflight, which repeats these checks.
Every fact the roles read while the deploy is prepared (this role's, l2_disk's device check, the serving
preflight's, the target OS) is read here in one round trip and kept for the run (roles._common.prepared_fact):
no operation has run yet, so the later roles' reads would return the same.
Declares no variables of its own: it reads the serving knobs, ``gpus`` and the l2_disk role's variables.
"""

from __future__ import annotations

from typing import Optional

from pyinfra import host
from pyinfra.api.deploy import deploy
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import python

from rigkit.errors import PreflightError
from rigkit.facts.batch import FactSpec, prepare_facts, prepared_fact
from rigkit.facts.disk import DiskFree, MountedFilesystem
from rigkit.facts.docker import DockerEngine
from rigkit.facts.nvidia import NvidiaGpuMemory, NvidiaPciGpus, NvidiaSmiGpus
from rigkit.facts.server import MemInfo, PortListeners, ShmSize
from rigkit.facts.stack import StackContainers
from rigkit.hostdata import RigSettings
from rigkit.operations import refuse, say
from rigkit.preflight import Finding, HostFacts, bare_host_preflight, refusals
from rigkit.render import STACK_NAME
from roles import Run
from roles.docker import engine_check_fact_specs
from roles.l2_disk import checked_device, device_fact_specs
from roles.serving import preflight_fact_specs as serving_fact_specs


def _gpu_facts(rig: RigSettings) -> tuple[Optional[str], int, int]:
    """(nvidia-smi's memory csv where it answers, NVIDIA GPUs on the PCI bus, declared ``gpus``)."""
    if not rig.stack.profile.needs_gpus:
        return None, 0, 0
    smi = prepared_fact(host, NvidiaSmiGpus)
    # a broken nvidia-smi (driver/library mismatch) is the driver role's to fix: count the bus instead
    csv = "\n".join(prepared_fact(host, NvidiaGpuMemory) or []) if smi and not smi["error"] else None
    return csv, prepared_fact(host, NvidiaPciGpus), rig.host["gpus"]


def _l2_device(rig: RigSettings) -> tuple[Optional[Finding], bool]:
    """(l2_disk's refusal of the declared device, whether l2_path's filesystem can be measured now)."""
    disk = rig.l2_disk
    if not disk["l2_device"]:
        return None, True  # no L2 disk role on this rig: l2_path's filesystem is what it is
    try:
        probe, _, _ = checked_device(disk)
    except PreflightError as refused:
        return Finding.refused_by("l2-device", refused), False
    mounted = prepared_fact(host, MountedFilesystem, mount_point=disk["l2_mount_point"])
    return None, mounted is not None and mounted["source"] == probe["path"]


def _stack_container_ids() -> tuple[str, ...]:
    engine = prepared_fact(host, DockerEngine)
    if not engine or not engine["server_version"]:  # no engine, or a stopped one: no stack of ours runs
        return ()
    return tuple(c["id"] for c in prepared_fact(host, StackContainers, stack=STACK_NAME) or [] if c["running"])


def prepared_fact_specs(rig: RigSettings) -> list[FactSpec]:
    """Every fact the roles read while the deploy is prepared, when they read it on most rigs.

    A fact read here but not needed after all (DiskFree while the L2 disk is unmounted, the stack without an
    engine) is harmless: all are read-only. What only some paths need (lsblk for a missing device, the
    registry probe for an absent image) is read by that path alone."""
    settings = rig.stack
    specs = [FactSpec.of(LinuxDistribution), FactSpec.of(MemInfo), FactSpec.of(ShmSize),
             FactSpec.of(PortListeners, port=settings.knobs["serving_port"]), FactSpec.of(DockerEngine),
             FactSpec.of(StackContainers, stack=STACK_NAME)]
    if rig.l2_disk["l2_device"]:
        specs += device_fact_specs(rig.l2_disk)
    if settings.l2_active:
        specs.append(FactSpec.of(DiskFree, path=settings.knobs["l2_path"]))
    if settings.profile.needs_gpus:
        specs += [FactSpec.of(NvidiaSmiGpus), FactSpec.of(NvidiaGpuMemory), FactSpec.of(NvidiaPciGpus)]
    return specs + engine_check_fact_specs() + serving_fact_specs(settings)


def gather_findings(rig: RigSettings) -> list[Finding]:
    prepare_facts(host, prepared_fact_specs(rig))
    settings = rig.stack
    device_refusal, l2_measurable = _l2_device(rig)
    gpu_csv, pci_gpus, declared_gpus = _gpu_facts(rig)
    port = settings.knobs["serving_port"]
    facts = HostFacts(
        meminfo=prepared_fact(host, MemInfo),
        host_shm_bytes=prepared_fact(host, ShmSize),
        l2_free_bytes=prepared_fact(host, DiskFree, path=settings.knobs["l2_path"])
        if settings.l2_active and l2_measurable else None,
        gpu_memory_csv=gpu_csv,
        port_listeners=prepared_fact(host, PortListeners, port=port),
        stack_container_ids=_stack_container_ids(),
    )
    findings = bare_host_preflight(settings, facts, pci_gpus, declared_gpus)
    return findings + ([device_refusal] if device_refusal else [])


@deploy("preflight")
def preflight(rig: RigSettings, run: Run) -> None:
    """One failing operation naming every refusal (and ``run.refused_by``) when the bare host refuses."""
    findings = gather_findings(rig)
    refused = refusals(findings)
    if not refused:
        say(host, f"preflight: {len(findings)} host checks passed before any change")
        return
    first = refused[0]
    python.call(name="Preflight refused before any change", function=refuse, field=first.field,
                value=first.value, problem="; ".join(str(f) for f in refused),
                fix=first.fix if len(refused) == 1 else "each refusal's Fix above")
    run.refused_by = "preflight"
