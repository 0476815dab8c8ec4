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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal, Optional

from rigkit.errors import PreflightError, RigkitError
from rigkit.nvidia_smi import GpuMemoryReading, parse_gpu_memory
from rigkit.remote.registry import registry_failure
from rigkit.settings.hostdata import Settings
from rigkit.settings.knobs import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
from rigkit.settings.sizing import GB, GIB
from rigkit.survey import RigState

L2_FREE_WARN_GB = 50  # below this the L2 tier holds only a few long sessions
# ... unless the declared budget is that small on purpose (the lab's 0.5 GB on a 2 GB disk): then free space under
# this many budgets is the warning (a disk that also holds other files can push the store past its floor)
L2_FREE_BUDGETS_WARN = 2
# vLLM's engine message queue lives in /dev/shm (160 MiB measured on the CPU build; it died at 64 MiB free)
ENGINE_SHM_MIN_MB = 256

Level = Literal["ok", "warn", "refuse"]


@dataclass(frozen=True)
class HostFacts:
    """What the gates read of a rig (built from the rig survey: ``from_state``)."""

    meminfo: dict[str, int]  # /proc/meminfo in bytes (rigkit.facts MemInfo)
    l2_free_bytes: Optional[int] = None  # free bytes where l2_path lives (rigkit.facts DiskFree)
    gpu_memory_csv: Optional[str] = None  # nvidia_smi.GPU_MEMORY_QUERY output; None: no nvidia-smi
    has_engine: bool = True  # `docker` answers
    compose_command: Optional[str] = None  # rigkit.facts ComposeCommand
    image_present: bool = False  # the pinned image is already on the rig
    registry_reachable: Optional[bool] = None  # None: not probed
    host_shm_bytes: Optional[int] = None  # size of the rig's /dev/shm (rigkit.facts ShmSize); None: unknown
    # free bytes of the rig's /dev/shm and the vLLM CPU-tier segments in it (rigkit.facts ShmFree); None: unknown
    host_shm_free: Optional[dict] = None
    image_probe_error: Optional[str] = None  # the registry's answer when it does not serve the image (ManifestProbe)
    port_listeners: Optional[list[dict]] = None  # rigkit.facts PortListeners on serving_port; None: not probed
    # the same for the stack's other ports (lmcache_port, lmcache_http_port), by knob; a knob absent: not probed
    stack_port_listeners: Optional[dict[str, list[dict]]] = None
    stack_container_ids: tuple[str, ...] = ()  # ids (any prefix) of rigkit's own stack containers on the rig

    @classmethod
    def from_state(cls, state: RigState, **overrides: Any) -> "HostFacts":
        """The gates' view of the rig survey; ``overrides`` for what a gate reads differently (a GPU
        memory table only where nvidia-smi answers, the L2 free space only once the disk is mounted)."""
        facts = dict(
            meminfo=state.meminfo,
            host_shm_bytes=state.shm_bytes,
            host_shm_free=state.shm_free,
            l2_free_bytes=state.l2_free_bytes,
            gpu_memory_csv="\n".join(state.gpu_memory) if state.nvidia_smi_cli else None,
            has_engine=state.docker_cli is not None,
            compose_command=state.compose_command,
            image_present=state.image_present,
            port_listeners=state.port_listeners,
            stack_port_listeners=state.stack_port_listeners,
            stack_container_ids=state.running_stack_ids,
        )
        return cls(**{**facts, **overrides})


@dataclass(frozen=True)
class Finding:
    level: Level
    check: str
    field: str
    value: Any
    message: str
    fix: str = ""
    forceable: bool = False

    def __str__(self) -> str:
        fix = f" Fix: {self.fix}" if self.fix and self.level != "ok" else ""
        return f"[{self.level}] {self.check}: {self.message}.{fix}"

    @classmethod
    def refused_by(cls, check: str, error: RigkitError) -> "Finding":
        """A refusal another module raised (e.g. l2_disk's device decision), as one finding among the others."""
        return cls("refuse", check, error.field, error.value, error.problem, error.fix)


def _gb(value_bytes: float) -> float:
    return round(value_bytes / GB, 1)


def _gib(value_bytes: float) -> float:
    return round(value_bytes / GIB, 1)


def check_ram(settings: Settings, meminfo: dict[str, int]) -> list[Finding]:
    """The memory knobs count GiB (rigkit.settings.sizing): MemAvailable is compared in bytes, printed in GiB."""
    knobs = settings.knobs
    available_bytes = meminfo.get("MemAvailable", 0)
    available = _gib(available_bytes)
    l1, reserve = settings.l1_gib, knobs["ram_reserve_gb"]
    needed = l1 + reserve
    findings = []
    if available_bytes < needed * GIB:
        problem = (
            f"MemAvailable {available:g} GiB < L1 {l1} + reserve {reserve} = {needed} GiB "
            "(an oversized cache once OOM'd the host; force does not override this)"
        )
        most = available_bytes // GIB
        if l1:
            # l1_size_gb takes 1 GiB at least: "at most 0" would be a fix the settings refuse
            fix = (
                f"set l1_size_gb to at most {most - reserve} (GiB) or free memory"
                if most - reserve >= 1
                else f"free memory on the rig or lower ram_reserve_gb: {most} GiB leaves no GiB for L1 beside it"
            )
            findings.append(Finding("refuse", "ram", "l1_size_gb", l1, problem, fix))
        else:  # no L1 in this profile: the reserve alone is over what the rig has free
            findings.append(
                Finding(
                    "refuse",
                    "ram",
                    "ram_reserve_gb",
                    reserve,
                    problem,
                    f"free memory on the rig or set ram_reserve_gb to at most {most} (GiB)",
                )
            )
    else:
        findings.append(
            Finding("ok", "ram", "l1_size_gb", l1, f"MemAvailable {available:g} GiB >= L1 + reserve {needed} GiB")
        )
    total = _gb(meminfo.get("MemTotal", 0))
    minimum = settings.profile.resources.min_ram_gb
    if total < minimum:
        findings.append(
            Finding(
                "refuse",
                "ram",
                "serving_profile",
                settings.profile.name,
                f"MemTotal {total:g} GB < {minimum} GB that profile {settings.profile.name} needs",
                "pick a smaller profile or a bigger rig",
                forceable=True,
            )
        )
    return findings


def check_host_shm(settings: Settings, shm_bytes: Optional[int], shm_free: Optional[dict] = None) -> list[Finding]:
    """The stack runs with `ipc: host`, so its /dev/shm is the rig's own: compose's shm_size does not apply. Its size
    first, then what is FREE: stale CPU-tier segments of stopped engines fill it while its size stays the same."""
    if shm_bytes is None:
        return [
            Finding(
                "warn",
                "host-shm",
                "/dev/shm",
                None,
                "size of the rig's /dev/shm unknown",
                "check `df -h /dev/shm` on the rig",
            )
        ]
    size_mb, l1 = shm_bytes // 2**20, settings.l1_gib
    if size_mb < ENGINE_SHM_MIN_MB:
        return [
            Finding(
                "refuse",
                "host-shm",
                "/dev/shm",
                f"{size_mb} MiB",
                f"the rig's /dev/shm is {size_mb} MiB < {ENGINE_SHM_MIN_MB} MiB the engine needs "
                "(ipc: host shares it with the container)",
                f"remount /dev/shm larger on the rig (mount -o remount,size={max(l1, 1)}G /dev/shm)",
            )
        ]
    connector = settings.profile.connector
    in_shm = bool(connector and connector.l1_in_shm)
    needed_mb = l1 * 1024 * in_shm + ENGINE_SHM_MIN_MB
    if in_shm and size_mb < needed_mb:
        return [
            Finding(
                "refuse",
                "host-shm",
                "/dev/shm",
                f"{size_mb} MiB",
                f"the rig's /dev/shm is {size_mb} MiB < L1 {l1} GiB + {ENGINE_SHM_MIN_MB} MiB for the engine: "
                f"profile {settings.profile.name} keeps its CPU tier in /dev/shm and fills it at start "
                "(ipc: host shares it with the container)",
                f"remount /dev/shm with size >= {math.ceil(needed_mb / 1024)}G on the rig "
                f"(mount -o remount,size={math.ceil(needed_mb / 1024)}G /dev/shm) or lower l1_size_gb",
            )
        ]
    if shm_free is not None:
        free_mb, offload_mb = shm_free["free_bytes"] // 2**20, shm_free["offload_bytes"] // 2**20
        if free_mb + offload_mb < needed_mb:
            what = (
                f"L1 {l1} GiB + {ENGINE_SHM_MIN_MB} MiB for the engine"
                if in_shm
                else f"{ENGINE_SHM_MIN_MB} MiB the engine needs"
            )
            return [
                Finding(
                    "refuse",
                    "host-shm",
                    "/dev/shm",
                    f"{free_mb} MiB free",
                    f"the rig's /dev/shm has {free_mb} MiB free (+{offload_mb} MiB of vLLM CPU-tier segments "
                    f"the restart frees) < {what}: something else fills it",
                    "list it (ls -la /dev/shm on the rig) and remove what no running process uses"
                    + (", or lower l1_size_gb" if in_shm else ""),
                )
            ]
    if size_mb < l1 * 1024:
        return [
            Finding(
                "warn",
                "host-shm",
                "/dev/shm",
                f"{size_mb} MiB",
                f"the rig's /dev/shm {size_mb} MiB < L1 {l1} GiB (ipc: host shares it with the container)",
                f"remount /dev/shm with size >= {l1}G",
            )
        ]
    free = "" if shm_free is None else f", {shm_free['free_bytes'] // 2**20} MiB free"
    return [Finding("ok", "host-shm", "/dev/shm", f"{size_mb} MiB", f"rig /dev/shm large enough{free}")]


def check_l2(settings: Settings, free_bytes: Optional[int]) -> list[Finding]:
    if not settings.l2_active:
        return [Finding("ok", "l2", "l2_enabled", False, "no L2 disk tier: skipped")]
    path, budget = settings.knobs["l2_path"], settings.knobs["l2_budget_gb"]
    if free_bytes is None:
        return [
            Finding(
                "warn",
                "l2",
                "l2_path",
                path,
                f"free space under {path} unknown",
                "check that the L2 disk is mounted (the L2 disk role)",
            )
        ]
    free = _gb(free_bytes)
    if free < budget:
        return [
            Finding(
                "refuse",
                "l2",
                "l2_budget_gb",
                budget,
                f"{path} has {free:g} GB free < L2 budget {budget:g} GB",
                f"free space on {path} or set l2_budget_gb to at most {free:g}",
                forceable=True,
            )
        ]
    warn_below = min(L2_FREE_WARN_GB, L2_FREE_BUDGETS_WARN * budget)
    if free < warn_below:
        return [
            Finding(
                "warn",
                "l2",
                "l2_path",
                path,
                f"{path} has only {free:g} GB free (< {warn_below:g} GB: "
                f"{L2_FREE_WARN_GB} GB, or {L2_FREE_BUDGETS_WARN} x l2_budget_gb when that is less)",
                "use a larger disk for the L2 tier",
            )
        ]
    return [Finding("ok", "l2", "l2_path", path, f"{path} has {free:g} GB free >= budget {budget:g} GB")]


def check_l2_if_mounted(settings: Settings, free_bytes: Optional[int]) -> list[Finding]:
    """Before the l2_disk role: ``free_bytes`` None means the L2 disk is not mounted yet (serving checks it later)."""
    if free_bytes is None and settings.l2_active:
        return [
            Finding(
                "ok",
                "l2",
                "l2_path",
                settings.knobs["l2_path"],
                "L2 disk not mounted yet: its free space is checked once the l2_disk role mounted it",
            )
        ]
    return check_l2(settings, free_bytes)


def _tensor_parallel_refusal(settings: Settings, available: int, where: str) -> Optional[Finding]:
    """A refusal (never forceable) when tensor parallelism needs more GPUs than the stack gets: one per rank."""
    tensor_parallel = settings.knobs["tensor_parallel_size"]
    if tensor_parallel <= available:
        return None
    return Finding(
        "refuse",
        "gpu",
        "tensor_parallel_size",
        tensor_parallel,
        f"needs {tensor_parallel} GPUs, one per rank, but {where} {available}",
        f"set tensor_parallel_size to at most {available}, or give the stack more GPUs",
    )


def _absent_gpus_refusal(settings: Settings, absent: list[int], what_the_rig_has: str) -> list[Finding]:
    """gpu_mask selects GPUs the rig lacks: refused, whatever force says."""
    if not absent:
        return []
    return [
        Finding(
            "refuse",
            "gpu",
            "gpu_mask",
            settings.knobs["gpu_mask"],
            f"GPU(s) {absent} not on this rig ({what_the_rig_has})",
            "fix gpu_mask for this host",
        )
    ]


def check_gpus(settings: Settings, gpu_memory_csv: Optional[str]) -> list[Finding]:
    profile = settings.profile
    if not profile.needs_gpus:
        return [Finding("ok", "gpu", "serving_profile", profile.name, "profile needs no GPUs: skipped")]
    gpus: list[GpuMemoryReading] = parse_gpu_memory(gpu_memory_csv) if gpu_memory_csv else []
    if not gpus:
        return [
            Finding(
                "refuse",
                "gpu",
                "serving_profile",
                profile.name,
                f"profile {profile.name} needs {profile.resources.gpus} GPU(s) but the rig reports none",
                "install the NVIDIA driver (the driver role) or pick a CPU profile such as cpu-lab",
            )
        ]
    by_index = {gpu.index: gpu for gpu in gpus}
    selected = settings.gpu_ids or sorted(by_index)
    absent = [index for index in selected if index not in by_index]
    if absent:
        return _absent_gpus_refusal(settings, absent, f"it has {sorted(by_index)}")
    if len(selected) < profile.resources.gpus:
        return [
            Finding(
                "refuse",
                "gpu",
                "serving_profile",
                profile.name,
                f"{len(selected)} GPU(s) selected, profile needs {profile.resources.gpus}",
                "select more GPUs or pick another profile",
            )
        ]
    # a gpu_mask narrower than tensor_parallel_size never gets here: the settings refuse it (hostdata)
    too_wide = _tensor_parallel_refusal(settings, len(selected), "the rig has")
    if too_wide:
        return [too_wide]
    minimum = settings.knobs["gpu_free_fraction_min"]
    # vLLM itself refuses to start when a GPU has less free than gpu_memory_utilization of its memory
    # (vllm/v1/worker/utils.py request_memory, 0.26), its own default when unset: a bar no force can lower
    asked = settings.knobs["gpu_memory_utilization"]
    utilization = VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if asked is None else asked
    # at equality the bar is vLLM's too: below it the engine would not start, whatever force says
    engine_bar = utilization >= minimum
    field, minimum = ("gpu_memory_utilization", utilization) if engine_bar else ("gpu_free_fraction_min", minimum)
    unset_note = f" (gpu_memory_utilization unset: vLLM's default {utilization})" if asked is None else ""
    findings = []
    for index in selected:
        gpu = by_index[index]
        if gpu.free_fraction < minimum:
            fix = f"stop what holds GPU {index} (nvidia-smi shows it) or exclude it via gpu_mask"
            findings.append(
                Finding(
                    "refuse",
                    "gpu",
                    field,
                    minimum,
                    f"GPU {index} has {gpu.free_fraction:.1%} free ({gpu.free_mib} of {gpu.total_mib} MiB) "
                    f"< {minimum:.0%}" + (f" (vLLM would not start){unset_note}" if engine_bar else ""),
                    fix
                    + (
                        f", or {'set' if asked is None else 'lower'} gpu_memory_utilization to at most "
                        f"{math.floor(gpu.free_fraction * 100) / 100:.2f}"
                        if engine_bar
                        else ""
                    ),
                    forceable=not engine_bar,
                )
            )
        else:
            findings.append(Finding("ok", "gpu", "gpu_mask", index, f"GPU {index} {gpu.free_fraction:.1%} free"))
    return findings


def check_gpus_before_driver(
    settings: Settings, gpu_memory_csv: Optional[str], nvidia_pci_gpus: int, declared_gpus: int
) -> list[Finding]:
    """Before the nvidia_driver role: where nvidia-smi answers, ``check_gpus``; without it (``gpu_memory_csv``
    None) the PCI bus must show the GPUs the profile needs and those gpu_mask selects, and ``gpus`` must let the
    driver role install."""
    profile = settings.profile
    if not profile.needs_gpus or gpu_memory_csv is not None:
        return check_gpus(settings, gpu_memory_csv)
    needed = profile.resources.gpus
    if nvidia_pci_gpus == 0:
        return [
            Finding(
                "refuse",
                "gpu",
                "serving_profile",
                profile.name,
                f"profile {profile.name} needs {needed} GPU(s) but the rig reports none "
                "(no nvidia-smi, no NVIDIA GPU on its PCI bus)",
                "pick a CPU profile such as cpu-lab, or a rig with GPUs",
            )
        ]
    if nvidia_pci_gpus < needed:
        return [
            Finding(
                "refuse",
                "gpu",
                "serving_profile",
                profile.name,
                f"profile {profile.name} needs {needed} GPU(s); the rig's PCI bus shows {nvidia_pci_gpus}",
                "pick a profile for fewer GPUs, or a rig with more",
            )
        ]
    # the driver numbers the bus's GPUs 0..n-1: a gpu_mask beyond them is refused now, not once the driver is in
    absent = [index for index in settings.gpu_ids if index >= nvidia_pci_gpus]
    if absent:
        return _absent_gpus_refusal(settings, absent, f"its PCI bus shows {nvidia_pci_gpus} NVIDIA GPU(s)")
    # every GPU the stack gets is on the bus now: tensor parallelism needs no more than the bus shows
    too_wide = _tensor_parallel_refusal(settings, nvidia_pci_gpus, "the rig's PCI bus shows")
    if too_wide:
        return [too_wide]
    if declared_gpus < needed:
        return [
            Finding(
                "refuse",
                "gpu",
                "gpus",
                declared_gpus,
                f"the rig has {nvidia_pci_gpus} NVIDIA GPU(s) and no driver yet, but gpus={declared_gpus} "
                f"makes the driver roles skip it (profile {profile.name} needs {needed})",
                f"set gpus: {nvidia_pci_gpus} for this host",
            )
        ]
    return [
        Finding(
            "ok",
            "gpu",
            "gpus",
            declared_gpus,
            f"{nvidia_pci_gpus} NVIDIA GPU(s) on the PCI bus, no driver yet: "
            "their memory is checked once the nvidia_driver role installed it",
        )
    ]


def check_engine(facts: HostFacts) -> list[Finding]:
    if not facts.has_engine:
        return [
            Finding(
                "refuse", "engine", "docker", None, "no Docker engine answers on the rig", "run the docker role first"
            )
        ]
    if facts.compose_command is None:
        return [
            Finding(
                "refuse",
                "engine",
                "compose",
                None,
                "neither `docker compose` nor `docker-compose`",
                "install the compose plugin (the docker role does)",
            )
        ]
    return [Finding("ok", "engine", "compose", facts.compose_command, f"docker and {facts.compose_command} present")]


def check_image(settings: Settings, facts: HostFacts) -> list[Finding]:
    if facts.image_present:
        return [Finding("ok", "image", "serving_image", settings.image, "image already on the rig")]
    if facts.image_probe_error:  # unreachable, hung, digest not served, auth...: each has its own words and fix
        failure = registry_failure(facts.image_probe_error, settings.image)
        return [
            Finding(
                "refuse",
                "image",
                "serving_image",
                settings.image,
                f"{failure.problem}; the image is not on the rig (docker: {facts.image_probe_error})",
                failure.fix,
            )
        ]
    if facts.registry_reachable is False:
        return [
            Finding(
                "refuse",
                "image",
                "serving_image",
                settings.image,
                "image not on the rig and its registry is unreachable",
                "bring the registry back or deploy a digest the rig keeps (rollback)",
            )
        ]
    return [Finding("ok", "image", "serving_image", settings.image, "image will be pulled by digest")]


def check_port(settings: Settings, facts: HostFacts) -> list[Finding]:
    """Every port the stack listens on must be free on the rig, or held by rigkit's own stack (which the
    release replaces)."""
    heard = {"serving_port": facts.port_listeners, **(facts.stack_port_listeners or {})}
    return [
        finding
        for knob, port in settings.listen_ports.items()
        if heard.get(knob) is not None
        for finding in _check_one_port(knob, port, heard[knob], facts.stack_container_ids)
    ]


def _check_one_port(knob: str, port: int, listeners: list[dict], stack_ids: tuple[str, ...]) -> list[Finding]:
    ours = [cid for cid in stack_ids if cid]
    foreign = [
        listener
        for listener in listeners
        if not any(full.startswith(cid) for full in listener.get("containers", []) for cid in ours)
    ]
    if not foreign:
        return [Finding("ok", "port", knob, port, f"port {port} free or held by rigkit's stack")]
    who = ", ".join(
        f"pid {who['pid']} ({who.get('command')})" if who.get("pid") else "a process outside the rig's view"
        for who in foreign
    )
    return [
        Finding(
            "refuse",
            "port",
            knob,
            port,
            f"TCP port {port} on the rig is already in use by {who}",
            f"stop what listens there (`ss -ltnp 'sport = :{port}'` on the rig) or set {knob} to a free port",
        )
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
