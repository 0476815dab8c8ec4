"""Preflight: host facts + Settings -> findings (ok / warn / refuse), each naming the number and the fix.

Pure: the roles read the facts (rigkit.facts) and pass them in. Two gates:
- ``bare_host_preflight``: the preflight role, right after rig_lock and before any role changes the rig.
  Only what the bare host answers (RAM, the rig's /dev/shm, the serving port, GPUs, L2 free space on a
  mounted L2 disk); what the later roles provide (the driver's nvidia-smi, the mounted L2 disk) is checked
  as far as the host shows it already.
- ``preflight``: the serving role, once the engine is in: every check, including engine, compose, image.
  Where the engine is not in yet but the docker role installs it in the same run, the serving role checks
  the rest as the deploy is prepared and ``engine_preflight`` (engine, compose, image) once that role ran.
Both apply ``force``: forceable refusals (GPU memory below gpu_free_fraction_min, L2 budget, MemTotal) become
warnings; the RAM gate, GPU memory below gpu_memory_utilization (vLLM would not start), a GPU profile on a
GPU-less rig, a missing engine/compose and an unobtainable image never do.

One module per gate subject: findings (HostFacts, Finding), memory (RAM, /dev/shm), l2, gpus, engine (engine,
compose, image, ports); this one runs them.
"""

from __future__ import annotations

from dataclasses import replace

from rigkit.errors import PreflightError
from rigkit.preflight.engine import check_engine, check_image, check_port
from rigkit.preflight.findings import Finding, HostFacts, Level
from rigkit.preflight.gpus import check_gpus, check_gpus_before_driver
from rigkit.preflight.l1_session import check_l1_session
from rigkit.preflight.l2 import L2_FREE_BUDGETS_WARN, L2_FREE_WARN_GB, check_l2, check_l2_if_mounted
from rigkit.preflight.memory import ENGINE_SHM_MIN_MB, check_host_shm, check_ram
from rigkit.settings.hostdata import Settings

# what callers import from rigkit.preflight (the gates themselves live in their modules)
__all__ = [
    "ENGINE_LATER",
    "ENGINE_SHM_MIN_MB",
    "L2_FREE_BUDGETS_WARN",
    "L2_FREE_WARN_GB",
    "Finding",
    "HostFacts",
    "Level",
    "bare_host_preflight",
    "check_engine",
    "check_gpus",
    "check_gpus_before_driver",
    "check_host_shm",
    "check_image",
    "check_l2",
    "check_l2_if_mounted",
    "check_port",
    "check_ram",
    "engine_checks",
    "engine_preflight",
    "preflight",
    "raise_if_refused",
    "refusals",
    "with_force",
]


def with_force(settings: Settings, findings: list[Finding]) -> list[Finding]:
    """``force`` turns forceable refusals into warnings; the others stay refusals."""
    if not settings.knobs["force"]:
        return findings
    return [
        replace(f, level="warn", message=f"{f.message} (forced)") if f.level == "refuse" and f.forceable else f
        for f in findings
    ]


ENGINE_LATER = Finding(
    "ok",
    "engine",
    "docker",
    None,
    "no Docker engine or compose yet: the docker role installs it in this run; engine, compose "
    "and image are checked once it ran, before the serving role changes anything",
)


def engine_checks(settings: Settings, facts: HostFacts) -> list[Finding]:
    """What needs the engine: the engine itself, compose, the image (on the rig or served by its registry)."""
    return check_engine(facts) + check_image(settings, facts)


def preflight(settings: Settings, facts: HostFacts, engine_later: bool = False) -> list[Finding]:
    """Every check (the serving role). ``engine_later``: an earlier role of this run installs the engine (the
    facts predate it), so its checks are left to ``engine_preflight`` once that role ran."""
    engine = [ENGINE_LATER] if engine_later else engine_checks(settings, facts)
    return with_force(
        settings,
        check_ram(settings, facts.meminfo)
        + check_host_shm(settings, facts.host_shm_bytes, facts.host_shm_free)
        + check_l2(settings, facts.l2_free_bytes)
        + check_l1_session(settings)
        + check_gpus(settings, facts.gpu_memory_csv)
        + engine
        + check_port(settings, facts),
    )


def engine_preflight(settings: Settings, facts: HostFacts) -> list[Finding]:
    """The engine's checks alone, from facts read once the role installing the engine ran (the other
    ``HostFacts`` fields are not read)."""
    return with_force(settings, engine_checks(settings, facts))


def bare_host_preflight(
    settings: Settings, facts: HostFacts, nvidia_pci_gpus: int = 0, declared_gpus: int = 0
) -> list[Finding]:
    """What the host answers before any role changed it (the preflight role); no engine needed.

    ``facts.l2_free_bytes`` None: the L2 disk is not mounted yet; ``facts.gpu_memory_csv`` None: no working
    nvidia-smi yet (then ``nvidia_pci_gpus`` and ``declared_gpus`` decide). The engine fields are not read.
    """
    return with_force(
        settings,
        check_ram(settings, facts.meminfo)
        + check_host_shm(settings, facts.host_shm_bytes, facts.host_shm_free)
        + check_l2_if_mounted(settings, facts.l2_free_bytes)
        + check_gpus_before_driver(settings, facts.gpu_memory_csv, nvidia_pci_gpus, declared_gpus)
        + check_port(settings, facts),
    )


def refusals(findings: list[Finding]) -> list[Finding]:
    return [finding for finding in findings if finding.level == "refuse"]


def raise_if_refused(findings: list[Finding]) -> None:
    """PreflightError for the first refusal (the message counts the others)."""
    refused = refusals(findings)
    if refused:
        first = refused[0]
        more = f" (+{len(refused) - 1} more refusal(s))" if len(refused) > 1 else ""
        raise PreflightError(first.field, first.value, f"{first.check}: {first.message}{more}", first.fix)
