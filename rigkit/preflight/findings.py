"""What every preflight gate reads and answers: the rig's facts (``HostFacts``) and a ``Finding``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

from rigkit.errors import RigkitError
from rigkit.settings.sizing import GB, GIB
from rigkit.survey import RigState

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
