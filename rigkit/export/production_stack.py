"""One group as values for vLLM production-stack's Helm chart (vllm-stack 0.1.12, helm/ at commit a6c01db0;
its values.schema.json is kept in tests/fixtures/export/production-stack-0.1.12).

The chart renders the engine container itself (helm/templates/deployment-vllm-multi.yaml):
- image: "{{ repository }}:{{ tag }}", so a digest comes out whole from repository "REPO@sha256" and tag "<64 hex>";
- command: `vllm serve MODEL --host 0.0.0.0 --port <containerPort>`, then the vllmConfig fields it knows
  (--[no-]enable-prefix-caching always, --max-model-len, --tensor-parallel-size, --gpu_memory_utilization, ...),
  then vllmConfig.extraArgs one word each, then lmcacheConfig's --kv-transfer-config (LMCacheConnectorV1, in-process);
  `/opt/venv/bin/vllm` only when repository is exactly "lmcache/vllm-openai", which a digest reference never is;
- env: PYTHONHASHSEED "123" first, then modelSpec.env (a later entry of the same name is what the container gets).
Every rig flag is placed where the chart renders it from (RIG_FLAG_FIELDS, else extraArgs), so the command differs
from the rig's only in --host (the pod's network) and where a gap was accepted; tests/export hold it flag by flag.
"""

from __future__ import annotations

import posixpath
from typing import Any, Callable, Optional

from rigkit.errors import ConfigError
from rigkit.export.engine import flag_pairs, launch_argv
from rigkit.export.gaps import Gap
from rigkit.export.group import GroupStack, common_gaps, object_name
from rigkit.export.kubernetes import l2_claim, model_mount, pod_env, resources
from rigkit.serving.render import L2_CONTAINER_PATH
from rigkit.settings.hostdata import Settings
from rigkit.settings.knobs import KNOBS_BY_NAME

CHART = "vllm-stack 0.1.12 (vllm-project/production-stack helm/, commit a6c01db0)"
# vllm serve's own launcher words in a profile: `vllm serve "${RIGKIT_MODEL}"`
VLLM_SERVE = ["vllm", "serve"]
# the image's PATH when the chart's plain `vllm` must find another program first (see launcher_path)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# the chart's special case for this repository (deployment-vllm-multi.yaml: `/opt/venv/bin/vllm`), lost with a digest
LMCACHE_IMAGE_REPOSITORY = "lmcache/vllm-openai"
LMCACHE_IMAGE_BIN = "/opt/venv/bin"
# rig flag -> (vllmConfig field, type): the chart renders these from the field, so they must not be in extraArgs too
RIG_FLAG_FIELDS: dict[str, tuple[str, Callable]] = {
    "--tensor-parallel-size": ("tensorParallelSize", int),
    "--max-model-len": ("maxModelLen", int),
    "--gpu-memory-utilization": ("gpuMemoryUtilization", float),
    "--max-num-seqs": ("maxNumSeqs", int),
    "--dtype": ("dtype", str),
}
# rigkit's router policy (vllm-router) -> the chart router's routingLogic nearest to it
ROUTING_LOGIC = {
    "cache_aware": "prefixaware",  # both send a request where its prefix was served before
    "round_robin": "roundrobin",
    "kv_aware": "kvaware",  # both ask LMCache's controller where the KV is
}
LMCACHE_MP = "LMCacheMPConnector"
# LMCache in-process (the chart's lmcacheConfig) reads its disk tier's path from this variable (LMCache's config.py)
LMCACHE_LOCAL_DISK_ENV = "LMCACHE_LOCAL_DISK"


def image_fields(image: str) -> dict[str, str]:
    """repository and tag that the chart's "{{ repository }}:{{ tag }}" renders back into ``image`` (REPO@sha256:HEX)."""
    repository, digest = image.split("@", 1)
    algorithm, hex_digest = digest.split(":", 1)
    return {"repository": f"{repository}@{algorithm}", "tag": hex_digest}


def lmcache_in_process(stack: Settings) -> bool:
    connector = stack.profile.connector
    return connector is not None and connector.kv_transfer_config.get("kv_connector") == LMCACHE_MP


def launcher_gap(stack: Settings) -> Optional[Gap]:
    """The chart runs `vllm serve` itself: a profile with another launcher, or a prelude, cannot be said to it."""
    profile = stack.profile
    if lmcache_in_process(stack):
        return Gap(
            "serving_profile",
            profile.name,
            "the chart's engine container runs `vllm serve` alone, so LMCache's multiprocess server (the profile's "
            "prelude) cannot run beside it; accepted, the chart's in-process LMCache (LMCacheConnectorV1, "
            "lmcacheConfig) holds the tiers instead: another connector than the one the rig's card proved",
            "export to kubernetes (the pod runs the rig's own entrypoint), or pick a profile without a prelude",
        )
    if profile.connector and profile.connector.prelude.strip():
        return Gap(
            "serving_profile",
            profile.name,
            "the chart's engine container runs `vllm serve` alone: the profile's prelude cannot run",
            "export to kubernetes",
            acceptable=False,
        )
    if launch_argv(stack)[:2] != VLLM_SERVE:
        return Gap(
            "serving_profile",
            profile.name,
            f"the chart starts `vllm serve MODEL`, not the profile's launcher ({profile.launcher}); accepted, the "
            "pod's PATH puts the launcher's directory first, so its `vllm` runs the same server",
            "export to kubernetes (the pod runs the rig's own entrypoint)",
        )
    return None


def gaps(group: GroupStack) -> list[Gap]:
    found: dict[str, Gap] = {}
    for stack in group.stacks.values():
        for gap in [*common_gaps(stack), launcher_gap(stack)]:
            if gap is not None:
                found.setdefault(gap.setting, gap)
    if group.router_policy not in ROUTING_LOGIC:
        found["router_policy"] = Gap(
            "router_policy",
            group.router_policy,
            "the chart's router has no such routing logic (roundrobin, session, prefixaware, kvaware)",
            f"set router_policy to one of {', '.join(ROUTING_LOGIC)} for the export",
            acceptable=False,
        )
    return list(found.values())


def launcher_path(stack: Settings, argv: list[str]) -> Optional[str]:
    """PATH for the pod when the chart's plain `vllm` must be another directory's (None: the image's own)."""
    if argv[0].startswith("/"):
        return f"{posixpath.dirname(argv[0])}:{DEFAULT_PATH}"
    if stack.image.split("@", 1)[0] == LMCACHE_IMAGE_REPOSITORY:
        return f"{LMCACHE_IMAGE_BIN}:{DEFAULT_PATH}"
    return None


def split_launch(argv: list[str]) -> tuple[str, list[str]]:
    """(model, the flags after it) from the rig's argv: `vllm serve MODEL ...` or `... --model MODEL ...`."""
    if argv[:2] == VLLM_SERVE:
        return argv[2], argv[3:]
    at = argv.index("--model")
    return argv[at + 1], argv[at + 2 :]


def vllm_config(flags: list[str], in_process_lmcache: bool) -> tuple[dict[str, Any], int]:
    """(vllmConfig, the port) from the rig's engine flags; --host is the chart's (0.0.0.0)."""
    config: dict[str, Any] = {"enablePrefixCaching": False}
    extra: list[str] = []
    port = None
    for flag, value in flag_pairs(flags):
        if flag == "--host":
            continue
        if flag == "--port":
            port = int(value)  # type: ignore[arg-type]
        elif flag == "--enable-prefix-caching":
            config["enablePrefixCaching"] = True
        elif flag in RIG_FLAG_FIELDS:
            field, kind = RIG_FLAG_FIELDS[flag]
            config[field] = kind(value)
        elif flag == "--kv-transfer-config" and in_process_lmcache:
            continue  # the chart renders LMCacheConnectorV1's from lmcacheConfig
        else:
            extra += [flag] if value is True else [flag, str(value)]
    if port is None:
        raise ConfigError("serving_port", None, "the rig's command has no --port", "report it: rendering changed")
    config["extraArgs"] = extra
    return config, port


def model_spec(rig: str, stack: Settings, group: str) -> tuple[dict[str, Any], int]:
    argv = launch_argv(stack)
    in_process = lmcache_in_process(stack)
    model, flags = split_launch(argv)
    config, port = vllm_config(flags, in_process)
    env = [item for item in pod_env(stack) if not item["name"].startswith("RIGKIT_")]
    if in_process:  # the multiprocess server's own variables mean nothing to in-process LMCache
        server_env = {KNOBS_BY_NAME[name].env for name in stack.profile.connector.knobs if KNOBS_BY_NAME[name].env}
        env = [item for item in env if item["name"] not in server_env]
    path = launcher_path(stack, argv)
    if path:
        env.append({"name": "PATH", "value": path})
    spec: dict[str, Any] = {
        "name": object_name(rig).removeprefix("rigkit-"),
        **image_fields(stack.image),
        "modelURL": model,
        "replicaCount": 1,
        "resources": resources(stack),
        "shmSize": f"{stack.knobs['mem_limit_gb']}Gi",
        "vllmConfig": config,
    }
    volumes, mounts = [], []
    volume, mount = model_mount(stack)
    if volume is not None:
        volumes.append(volume)
        mounts.append(mount)
    claim = l2_claim(group, rig, stack)
    if claim is not None:
        volumes.append({"name": "l2", "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": "l2", "mountPath": L2_CONTAINER_PATH})
    if in_process:
        lmcache: dict[str, Any] = {"enabled": True, "cpuOffloadingBufferSize": stack.knobs["l1_size_gb"]}
        if stack.l2_active:
            # read by the template (LMCACHE_MAX_LOCAL_DISK_SIZE), not declared in values.schema.json
            lmcache["diskOffloadingBufferSize"] = stack.knobs["l2_budget_gb"]
            env.append({"name": LMCACHE_LOCAL_DISK_ENV, "value": f"file://{L2_CONTAINER_PATH}/"})
        env.append({"name": "LMCACHE_CHUNK_SIZE", "value": str(stack.knobs["chunk_size"])})
        spec["lmcacheConfig"] = lmcache
    if volumes:
        spec["extraVolumes"], spec["extraVolumeMounts"] = volumes, mounts
    spec["env"] = env
    return spec, port


def values(group: GroupStack) -> dict[str, Any]:
    specs, ports = [], set()
    for rig, stack in group.stacks.items():
        spec, port = model_spec(rig, stack, group.group)
        specs.append(spec)
        ports.add(port)
    if len(ports) > 1:
        raise ConfigError(
            "serving_port",
            sorted(ports),
            "differs between the group's rigs: the chart sets one containerPort for every engine",
            "export with one port (--data serving_port=8000): each pod has its own address",
        )
    port = ports.pop()
    health = {"httpGet": {"path": "/health", "port": port}}
    return {
        "servingEngineSpec": {
            "enableEngine": True,
            "containerPort": port,
            "strategy": {"type": "Recreate"},
            "startupProbe": {"initialDelaySeconds": 15, "periodSeconds": 10, "failureThreshold": 180, **health},
            "readinessProbe": {"initialDelaySeconds": 15, "periodSeconds": 5, "failureThreshold": 2, **health},
            "livenessProbe": {"initialDelaySeconds": 15, "periodSeconds": 10, "failureThreshold": 3, **health},
            "modelSpec": specs,
        },
        "routerSpec": {"routingLogic": ROUTING_LOGIC[group.router_policy]},
    }
