"""One rig judged from its answer to the status script: health (the engine, the stack's container, the API, the
L2 tier), drift (rigkit.status.drift), the last ledger entry, driver/CUDA, leftover shared memory, its state."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from rigkit.facts.docker import DockerEngine
from rigkit.facts.serving import engine_parts
from rigkit.kv_store import parse_store_probe, store_node
from rigkit.l2_state import read_l2
from rigkit.serving.commands import ready_url, rendering_for
from rigkit.serving.ledger import Ledger
from rigkit.settings.hostdata import ADAPTER_REQUEST_TIMEOUT_S, Settings
from rigkit.settings.model_source import ModelSource
from rigkit.status.drift import (
    Drift,
    container_drift,
    files_drift,
    image_drift,
    model_check,
    model_drift,
    rendering_drift,
)
from rigkit.status.gpu import FAIL, WARN, GpuLimits, judge_gpus
from rigkit.status.probe import (
    decoded_file,
    parse_api,
    parse_containers,
    parse_nvidia,
    parse_sections,
    parse_shm,
    parse_stale_shm,
)

OK, DRIFT, UNHEALTHY, UNREACHABLE = "ok", "drift", "unhealthy", "unreachable"


@dataclass
class RigStatus:
    """One rig's answer, judged. Holds no secret: values are shown through rigkit.status.drift's _shown."""

    rig: str
    reachable: bool = True
    error: str = ""  # why the rig could not be asked
    image: Optional[str] = None  # what the stack's container runs
    declared_image: Optional[str] = None
    drift: list[Drift] = field(default_factory=list)
    health: dict[str, str] = field(default_factory=dict)  # engine, container, api: "ok" or the problem
    unhealthy: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    ledger: Optional[dict[str, Any]] = None  # the last entry: kind, smoke, deployed_at, image, note
    driver: Optional[str] = None
    cuda: Optional[str] = None
    gpu: Optional[dict[str, Any]] = None  # rigkit.status.gpu.GpuReport: each GPU, the kernel log's Xids, findings
    l2: Optional[dict[str, Any]] = None
    shm_leftovers: list[dict[str, Any]] = field(default_factory=list)
    model: Optional[dict[str, Any]] = None  # the pinned model_source and its staged copy (model_report); None: none

    @property
    def state(self) -> str:
        if not self.reachable:
            return UNREACHABLE
        if self.unhealthy:
            return UNHEALTHY
        return DRIFT if self.drift else OK

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state, **asdict(self)}


# whether the rig's staged copy of the pinned model matches it (rigkit/files/model_store.py check)
STAGED_MATCHES, NOT_STAGED, STAGED_DAMAGED, STAGED_UNREADABLE = "matches", "not staged", "damaged", "unreadable"


def model_report(source: ModelSource, section: Optional[str]) -> dict[str, Any]:
    """The pinned model (model_source: kind, name, revision) and whether the rig's staged copy matches it."""
    answer = model_check(section)
    damaged = [item["path"] for item in (answer or {}).get("damaged", [])]
    if answer is None:
        staged = STAGED_UNREADABLE
    elif not answer.get("staged"):
        staged = NOT_STAGED
    else:
        staged = STAGED_DAMAGED if damaged else STAGED_MATCHES
    return {
        "source": source.spec,
        "kind": source.kind,
        "name": source.name,
        "revision": source.revision,
        "staged": staged,
        "damaged": damaged,
    }


def last_release(ledger_text: Optional[str]) -> Optional[dict[str, Any]]:
    """The ledger's newest entry (kind, smoke verdict, time, image, note), None without one."""
    try:
        current = Ledger.from_json(ledger_text).current
    except ValueError as exc:
        return {"error": f"ledger unreadable: {exc}"}
    if current is None:
        return None
    return {
        "kind": current.kind,
        "smoke": current.smoke,
        "deployed_at": current.deployed_at,
        "image": current.image,
        "rendering": current.rendering,
        "note": current.note,
    }


def assess(rig: str, stack: Optional[Settings], output: str, gpu_limits: Optional[GpuLimits] = None) -> RigStatus:
    """Judge one rig from its script's output and the stack today's data declares (None: none declared); its GPUs
    by ``gpu_limits`` (the rig's data: GpuLimits.from_sections; None: the declared defaults)."""
    sections = parse_sections(output)
    status = RigStatus(rig, declared_image=stack.image if stack else None)
    info, _, _, inspected = engine_parts((sections.get("engine") or "").split("\n"))
    engine = DockerEngine().process(info)
    status.health["engine"] = "ok" if engine["server_version"] else f"docker does not answer: {engine['error']}"
    # docker ps failing prints no id, so the fact's command answers "[]": without an engine, nothing is known
    containers = parse_containers("\n".join(inspected)) if engine["server_version"] else None
    running = [c for c in containers or [] if c.running]
    container = (running or containers or [None])[0]
    status.image = container.image if container else None
    if container is None:
        status.health["container"] = "no container of the stack" if containers is not None else "unknown"
    elif not container.running or container.status != "running":  # restarting, paused: not serving
        status.health["container"] = f"{container.name} {container.status}"
    elif container.health not in (None, "healthy"):
        status.health["container"] = f"{container.name} {container.health}"
    else:
        status.health["container"] = "ok"
    if container is not None and container.restarts:
        status.warnings.append(
            f"{container.name} restarted {container.restarts} times (its engine died and the "
            f"restart policy brought it back): docker logs {container.name}"
        )

    compose, env = decoded_file(sections.get("compose")), decoded_file(sections.get("env"))
    if stack is not None:
        today = rendering_for(stack)
        status.drift += image_drift(status.image, stack.image)
        status.drift += files_drift(compose, env, decoded_file(sections.get("release-hash")))
        status.drift += rendering_drift(compose, env, today)
        if container is not None:
            status.drift += container_drift(container, today)
        if stack.model_source is not None:
            status.drift += model_drift(sections.get("model"), stack.model_source.spec)
            status.model = model_report(stack.model_source, sections.get("model"))
        served = container.env.get("RIGKIT_SERVED_MODEL_NAME") if container else None
        served = served or today.knob("served_model_name")
        api = parse_api(sections.get("api"))
        if api["error"]:
            status.health["api"] = f"{ready_url(today)}: {api['error']}"
        elif served not in api["models"]:
            status.health["api"] = f"/v1/models lists {api['models']}, not {served!r}"
        else:
            status.health["api"] = "ok"
        if "l2" in sections:
            status.l2 = l2_report(stack, sections["l2"])
        if "kv-store" in sections:
            status.health["kv-store"] = kv_store_health(stack, sections["kv-store"])
    else:
        status.warnings.append("no serving_profile in today's data: drift not judged")
    status.unhealthy = [f"{what}: {text}" for what, text in status.health.items() if not text.startswith("ok")]
    if status.l2 and status.l2["level"] == "fail":
        status.unhealthy += status.l2["problems"]
    elif status.l2 and status.l2["level"] == "warn":
        status.warnings += status.l2["problems"]
    nvidia = parse_nvidia(sections.get("nvidia"))
    status.driver, status.cuda = nvidia["driver"], nvidia["cuda"]
    gpu = judge_gpus(
        sections.get("gpu"),
        sections.get("kernel-log"),
        gpu_limits if gpu_limits is not None else GpuLimits.defaults(stack),
        stack_running=bool(running),
    )
    status.gpu = gpu.as_dict()
    if nvidia["error"] and not gpu.query_error:
        status.warnings.append(f"nvidia-smi failed: {nvidia['error']}")
    status.unhealthy += [f"gpu: {finding.text}" for finding in gpu.findings if finding.level == FAIL]
    status.warnings += [f"gpu: {finding.text}" for finding in gpu.findings if finding.level == WARN]
    status.ledger = last_release(decoded_file(sections.get("ledger")))
    if running:  # the running engine's files are in use; a stopped engine's (STALE_SHM_GLOBS) are not
        status.shm_leftovers = [
            {"name": name, "bytes": size} for name, size in parse_stale_shm(sections.get("shm-stale"))
        ]
        if status.shm_leftovers:
            total = sum(item["bytes"] for item in status.shm_leftovers)
            status.warnings.append(
                f"{len(status.shm_leftovers)} files of stopped engines (CPU tiers, semaphores) left in /dev/shm "
                f"({total / 2**20:.0f} MiB) while the stack runs (no process maps them): the next "
                "restart removes them, or remove them now (rm /dev/shm/NAME)"
            )
    else:
        status.shm_leftovers = [{"name": name, "bytes": size} for name, size in parse_shm(sections.get("shm"))]
        if status.shm_leftovers:
            total = sum(item["bytes"] for item in status.shm_leftovers)
            status.warnings.append(
                f"{len(status.shm_leftovers)} shared-memory segments of the stack left in /dev/shm "
                f"({total / 2**20:.0f} MiB) while no container of it runs: remove them "
                "(rm /dev/shm/NAME) before the next start"
            )
    return status


def kv_store_health(stack: Settings, probe_output: str) -> str:
    """ "ok", or why the rig's LMCache cannot reach its L2 (the fleet's Valkey store), with what it costs and the fix."""
    why = parse_store_probe(probe_output)
    if why is None:
        return "ok"
    address, port = store_node(stack.knobs["l2_adapter_json"])
    return (
        f"the KV store {address}:{port} that LMCache uses as its L2 does not answer from this rig ({why}): each L2 "
        f"request gives up after {ADAPTER_REQUEST_TIMEOUT_S:g} s (request_timeout; what LMCache then serves is not "
        "measured: docs/limits.md); start it on the store host (systemctl start valkey-server, or `rigkit deploy` "
        "of the kv store host) and check the store firewall lets this rig in"
    )


def l2_report(stack: Settings, probe_output: str) -> dict[str, Any]:
    """The L2 tier judged as validation judges it, from the probe's output in the script."""
    report = read_l2(lambda command: probe_output, stack)
    return report.model_dump() if report is not None else None
