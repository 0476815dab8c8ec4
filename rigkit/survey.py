"""One survey of a rig, read in one SSH round trip while the deploy is prepared, as a typed RigState.

Every gate and every plan made before an operation runs takes this picture (the preflight role, the
serving preflight, l2_disk's device check, the docker role's engine check, the target OS); operations
read pyinfra's facts anew while they execute. The survey's facts run side by side on the rig in one
command (rigkit.facts.batch). What only a refusal path needs (lsblk for a missing device, the registry
probe for an absent image) is read by that path alone.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

from pyinfra.api.host import Host
from pyinfra.facts.server import LinuxDistribution, Which

from rigkit.facts.batch import FactBatch, FactSpec, each_missing_alone, facts_now
from rigkit.facts.disk import BlockDeviceProbe, DiskFree, MountedFilesystem
from rigkit.facts.docker import ComposeCommand
from rigkit.facts.firewall import FirewallTrace, NetworkNamespace, SshConnection, trace_kwargs
from rigkit.facts.model import StagedModel
from rigkit.facts.nvidia import NvidiaGpuMemory, NvidiaPciGpus, NvidiaSmiGpus
from rigkit.facts.server import MemInfo, PortListeners, ShmFree, ShmSize
from rigkit.facts.serving import serving_engine
from rigkit.firewall import API_FIREWALL
from rigkit.settings.hostdata import RigSettings
from rigkit.settings.model_source import store_stamp


@dataclass(frozen=True)
class RigState:
    """What the rig looked like when the deploy was prepared. A field the survey did not read (nothing
    declared needs it: no L2 device, no GPU profile) holds its fact's "absent" value."""

    os_release: dict[str, str]  # /etc/os-release (ID, VERSION_ID, VERSION_CODENAME...)
    meminfo: dict[str, int]  # /proc/meminfo in bytes
    shm_bytes: Optional[int]  # size of the rig's /dev/shm
    shm_free: Optional[dict]  # its free bytes and the vLLM CPU-tier segments in it (rigkit.facts.server.ShmFree)
    port_listeners: list[dict]  # who listens on serving_port (rigkit.facts.server.PortListeners)
    stack_port_listeners: dict[str, list[dict]]  # who listens on each port of the stack, by its knob
    docker_cli: Optional[str]  # path of the docker CLI, None without one
    engine: Optional[dict]  # `docker info`: {"server_version", "error"}; None without a docker CLI
    compose_command: Optional[str]  # "docker compose" or "docker-compose", None without compose
    image_present: bool  # the pinned image is in the rig's image store
    stack_containers: list[dict]  # rigkit's stack containers, running or not
    local_images: list[str]  # tagged images in the store, newest first
    l2_device: Optional[dict]  # blkid probe of l2_device; None when it is not a block device (or none declared)
    l2_mount: Optional[dict]  # what is mounted at l2_mount_point
    l2_free_bytes: Optional[int]  # free bytes on the filesystem holding l2_path
    kv_share_mount: Optional[dict]  # what is mounted at kv_share_mount_point (read when the store is shared)
    nvidia_smi_cli: Optional[str]  # path of nvidia-smi, None without one
    nvidia_smi: Optional[dict]  # nvidia-smi's GPUs or its error (rigkit.facts.nvidia.NvidiaSmiGpus)
    gpu_memory: list[str]  # nvidia-smi's per-GPU memory lines
    pci_gpus: int  # NVIDIA GPUs on the PCI bus, driver or not
    api_firewall_trace: list[str]  # what of rigkit's API firewall the rig holds: "ruleset", "unit", "table"
    ssh_connection: Optional[str]  # $SSH_CONNECTION of the deploy's session (api_firewall, to allow the controller)
    net_namespace: Optional[str]  # the rig's network namespace (a lab rig with api_firewall: the lab's guard)
    staged_model: Optional[dict]  # the verified stamp of the stack's model_source on the rig (rigkit.facts.model)

    @property
    def running_stack_ids(self) -> tuple[str, ...]:
        """Ids of rigkit's own running stack containers."""
        return tuple(container["id"] for container in self.stack_containers if container["running"])


# survey_specs' key for the fact behind engine, local_images, image_present and stack_containers (and their
# values without a docker CLI)
SERVING_ENGINE = "serving_engine"
NO_ENGINE = {"engine": None, "local_images": [], "image_present": False, "stack_containers": []}


def survey_specs(rig: RigSettings) -> dict[str, FactSpec]:
    """The fact behind each RigState field, as the rig's settings ask for it."""
    stack = rig.declared_stack
    specs = {
        "os_release": FactSpec.of(LinuxDistribution),
        "meminfo": FactSpec.of(MemInfo),
        "shm_bytes": FactSpec.of(ShmSize),
        "shm_free": FactSpec.of(ShmFree),
        "docker_cli": FactSpec.of(Which, command="docker"),
        SERVING_ENGINE: serving_engine(stack.image if stack else None),
        "compose_command": FactSpec.of(ComposeCommand),
        "api_firewall_trace": FactSpec.of(FirewallTrace, **trace_kwargs(API_FIREWALL)),
    }
    if stack is not None:
        specs["port_listeners"] = FactSpec.of(PortListeners, port=stack.knobs["serving_port"])
        for knob, port in stack.listen_ports.items():
            if knob != "serving_port":
                specs[f"{STACK_PORT_PREFIX}{knob}"] = FactSpec.of(PortListeners, port=port)
        if stack.model_source is not None:
            store = stack.knobs["model_store_path"]
            specs["staged_model"] = FactSpec.of(
                StagedModel, revision_dir=stack.model_dir, stamp=store_stamp(store, stack.model_source)
            )
        if stack.l2_active:
            specs["l2_free_bytes"] = FactSpec.of(DiskFree, path=stack.knobs["l2_path"])
    if stack is not None and stack.knobs["kv_share"]:
        specs["kv_share_mount"] = FactSpec.of(MountedFilesystem, mount_point=rig.kv_share["kv_share_mount_point"])
    if rig.l2_disk["l2_device"]:
        specs["l2_device"] = FactSpec.of(BlockDeviceProbe, device=rig.l2_disk["l2_device"])
        specs["l2_mount"] = FactSpec.of(MountedFilesystem, mount_point=rig.l2_disk["l2_mount_point"])
    firewall = rig.api_firewall
    if firewall["api_firewall"] and firewall["api_allow_controller"]:
        specs["ssh_connection"] = FactSpec.of(SshConnection)
    if firewall["api_firewall"] and rig.data.get("lab_rig"):
        specs["net_namespace"] = FactSpec.of(NetworkNamespace)
    if stack is not None and stack.profile.needs_gpus:
        specs.update(
            nvidia_smi_cli=FactSpec.of(Which, command="nvidia-smi"),
            nvidia_smi=FactSpec.of(NvidiaSmiGpus),
            gpu_memory=FactSpec.of(NvidiaGpuMemory),
            pci_gpus=FactSpec.of(NvidiaPciGpus),
        )
    return specs


# survey_specs' keys for the stack's other listening ports: "stack_port:<knob>"
STACK_PORT_PREFIX = "stack_port:"

# What a field holds when nothing declared asks the survey to read it.
NOT_READ: dict[str, Any] = {
    "shm_free": None,
    "port_listeners": [],
    "l2_device": None,
    "l2_mount": None,
    "l2_free_bytes": None,
    "kv_share_mount": None,
    "nvidia_smi_cli": None,
    "nvidia_smi": None,
    "gpu_memory": [],
    "pci_gpus": 0,
    "api_firewall_trace": [],
    "ssh_connection": None,
    "net_namespace": None,
    "staged_model": None,
}


def state_from(values: dict[str, Any]) -> RigState:
    """A RigState from each field's fact value (``survey_specs``' keys); unread fields get NOT_READ."""
    engine = values.get(SERVING_ENGINE) or NO_ENGINE
    merged = {**NOT_READ, **engine, **{k: v for k, v in values.items() if not k.startswith(STACK_PORT_PREFIX)}}
    merged["stack_port_listeners"] = {
        k[len(STACK_PORT_PREFIX) :]: list(v or []) for k, v in values.items() if k.startswith(STACK_PORT_PREFIX)
    }
    merged["os_release"] = (merged["os_release"] or {}).get("release_meta") or {}
    merged["image_present"] = bool(merged["docker_cli"] and merged["image_present"])
    merged["gpu_memory"] = list(merged["gpu_memory"] or [])
    merged["local_images"] = list(merged["local_images"] or [])
    merged["stack_containers"] = list(merged["stack_containers"] or [])
    merged["port_listeners"] = list(merged["port_listeners"] or [])
    merged["api_firewall_trace"] = list(merged["api_firewall_trace"] or [])
    return RigState(**{field.name: merged[field.name] for field in fields(RigState)})


def read_rig_state(host: Host, rig: RigSettings) -> RigState:
    """The survey, read now in one round trip (each fact alone only if the rig cannot run the batch)."""
    specs = survey_specs(rig)
    values = facts_now(host, specs.values())
    return state_from({field: values[spec] for field, spec in specs.items()})


class SurveyScript:
    """The survey as one shell script another command runs on the rig (roles.rig_lock runs it right after the
    lock is taken, in the lock's own SSH channel: no round trip of its own), and its output read back.

    The script prints the batch's output, then ``end_line``; ``state`` reads each fact the output lacks (a
    failed command, no output at all) on its own through pyinfra, as ``read_rig_state`` would."""

    def __init__(self, rig: RigSettings):
        self.rig = rig
        self.specs = survey_specs(rig)
        self.batch = FactBatch()
        self.script = self.batch.command(facts=tuple(dict.fromkeys(self.specs.values())))
        self.end_line = f"{self.batch._marker} end"

    def state(self, host: Host, output: list[str]) -> RigState:
        values = each_missing_alone(host, self.specs.values(), self.batch.process(output))
        return state_from({field: values[spec] for field, spec in self.specs.items()})
