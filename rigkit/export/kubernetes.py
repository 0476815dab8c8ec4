"""One group as plain Kubernetes objects (the model-server manifest llm-d's guides and any cluster take): per rig a
Deployment of one pod and its L2 PersistentVolumeClaim, and one Service over the group's pods.

The pod runs the rig's own entrypoint script (rigkit.serving.render.entrypoint_script: the connector's prelude, then
the engine, every flag as on the rig) with the rig's container environment, so LMCache's multiprocess server runs
beside vLLM in the pod as in the rig's container. What changes, and why:
- the engine binds 0.0.0.0 (RIGKIT_BIND_ADDRESS): the pod's network replaces the rig's bind address and firewall;
- the weights: a read-only mount of the staged revision (subPath <slug>/<revision>) of the model claim, the hub off;
- the L2 tier: a claim per rig (one ReadWriteMany claim for a shared store, kv_share), mounted where the connector's
  config points (/kv-store);
- a stop: preStop sleeps while the endpoints controller takes the pod out of the Service, then SIGTERM lets vLLM
  finish; the readiness probe (/health) keeps a starting pod out. rigkit's router drain does this on rigs;
- a release: strategy Recreate, the old pod down before the new one up (its GPUs and its RWO claim), as
  rigkit's down/up.
Objects are checked against Kubernetes v1.30.0's schemas (tests/fixtures/export/kubernetes-v1.30.0).
"""

from __future__ import annotations

from typing import Any, Optional

from rigkit.export.engine import container_env
from rigkit.export.gaps import Gap
from rigkit.export.group import GroupStack, common_gaps, object_name
from rigkit.serving.render import L2_CONTAINER_PATH, entrypoint_script
from rigkit.settings.hostdata import Settings
from rigkit.settings.knobs import KNOBS, SECRET_ENV_NAMES
from rigkit.settings.model_source import MODEL_CONTAINER_PATH, store_revision_dir

KUBERNETES_VERSION = "v1.30.0"
BIND_ADDRESS_ENV = "RIGKIT_BIND_ADDRESS"
POD_BIND_ADDRESS = "0.0.0.0"
GROUP_LABEL = "rigkit.io/group"
RIG_LABEL = "rigkit.io/rig"
PROFILE_LABEL = "rigkit.io/profile"
MODEL_ANNOTATION = "rigkit.io/model-source"
HTTP_PORT_NAME = "http"
SECRET_NAME = "rigkit-secrets"  # the Secret holding each secret knob under its knob name (hf_token, ...)
MODEL_CLAIM = "rigkit-models"  # the claim the staged model store lives on: <slug>/<revision> as on a rig
# A stopping pod keeps serving while kube-proxy and the endpoints controller take it out of the Service (seconds);
# then vLLM gets SIGTERM and finishes its requests within the grace period.
PRE_STOP_SLEEP_S = 10
TERMINATION_GRACE_S = 120
# The first start loads the weights and compiles: the startup probe waits up to PERIOD x THRESHOLD (30 minutes)
STARTUP_PERIOD_S = 10
STARTUP_FAILURE_THRESHOLD = 180
READINESS_PERIOD_S = 5
# /dev/shm for the engine's workers and the CPU tier's shared region (compose gives the rig's: ipc: host)
SHM_VOLUME = "shm"


def secret_knob(env_name: str) -> str:
    return next(knob.name for knob in KNOBS if knob.env == env_name)


def pod_env(stack: Settings) -> list[dict[str, Any]]:
    """The rig's container env as a pod's: secrets from SECRET_NAME (never in the manifest), the bind address the
    pod network needs."""
    env = []
    for name, value in container_env(stack).items():
        if name in SECRET_ENV_NAMES and stack.knobs[secret_knob(name)] is not None:
            env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": SECRET_NAME, "key": secret_knob(name)}}})
        else:
            # an unset secret is the empty value .env gives it: a reference to a key nobody wrote would stop the pod
            env.append({"name": name, "value": POD_BIND_ADDRESS if name == BIND_ADDRESS_ENV else value})
    return env


def l2_claim(group: str, rig: str, stack: Settings) -> Optional[str]:
    if not stack.l2_active:
        return None
    return object_name(group, "kv-share") if stack.knobs["kv_share"] else object_name(rig, "l2")


def model_mount(stack: Settings) -> tuple[Optional[dict], Optional[dict]]:
    """(volume, mount) of the staged revision, read-only at the path the engine loads; (None, None) without one."""
    source = stack.model_source
    if source is None:
        return None, None
    volume = {"name": "model", "persistentVolumeClaim": {"claimName": MODEL_CLAIM, "readOnly": True}}
    mount = {
        "name": "model",
        "mountPath": MODEL_CONTAINER_PATH,
        "readOnly": True,
        "subPath": store_revision_dir("", source).lstrip("/"),
    }
    return volume, mount


def resources(stack: Settings) -> dict[str, Any]:
    """The rig's memory limit (compose mem_limit, GiB) as request and limit; a GPU per tensor-parallel rank."""
    amounts: dict[str, Any] = {"memory": f"{stack.knobs['mem_limit_gb']}Gi"}
    if stack.profile.needs_gpus:
        amounts["nvidia.com/gpu"] = stack.knobs["tensor_parallel_size"]
    return {"requests": dict(amounts), "limits": dict(amounts)}


def probe(path: str, period_s: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": HTTP_PORT_NAME},
        "periodSeconds": period_s,
        "failureThreshold": failures,
    }


def deployment(group: str, rig: str, stack: Settings) -> dict[str, Any]:
    labels = {GROUP_LABEL: object_name(group), RIG_LABEL: object_name(rig)}
    mounts = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{stack.knobs['mem_limit_gb']}Gi"}}
    ]
    model_volume, model_volume_mount = model_mount(stack)
    if model_volume is not None:
        volumes.append(model_volume)
        mounts.append(model_volume_mount)
    claim = l2_claim(group, rig, stack)
    if claim is not None:
        volumes.append({"name": "l2", "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": "l2", "mountPath": L2_CONTAINER_PATH})
    container = {
        "name": "serving",
        "image": stack.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/bash", "-c"],
        "args": [entrypoint_script(stack)],
        "env": pod_env(stack),
        "ports": [{"name": HTTP_PORT_NAME, "containerPort": stack.knobs["serving_port"], "protocol": "TCP"}],
        "startupProbe": probe("/health", STARTUP_PERIOD_S, STARTUP_FAILURE_THRESHOLD),
        "readinessProbe": probe("/health", READINESS_PERIOD_S, 2),
        "livenessProbe": probe("/health", 10, 3),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_SLEEP_S)]}}},
        "resources": resources(stack),
        "volumeMounts": mounts,
    }
    annotations = {"rigkit.io/knobs-hash": stack.knobs_hash}
    if stack.model_source:
        annotations[MODEL_ANNOTATION] = stack.model_source.spec
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": object_name(rig),
            "labels": {**labels, PROFILE_LABEL: stack.profile.name},
            "annotations": annotations,
        },
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {
                    "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def l2_claim_object(name: str, stack: Settings) -> dict[str, Any]:
    shared = bool(stack.knobs["kv_share"])
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": {PROFILE_LABEL: stack.profile.name}},
        "spec": {
            "accessModes": ["ReadWriteMany" if shared else "ReadWriteOnce"],
            "resources": {"requests": {"storage": f"{stack.knobs['l2_budget_gb']:g}G"}},
        },
    }


def service(group: GroupStack) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": object_name(group.group), "labels": {GROUP_LABEL: object_name(group.group)}},
        "spec": {
            "selector": {GROUP_LABEL: object_name(group.group)},
            "ports": [
                {
                    "name": HTTP_PORT_NAME,
                    "port": group.first.knobs["serving_port"],
                    "targetPort": HTTP_PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }


def gaps(group: GroupStack) -> list[Gap]:
    found: dict[str, Gap] = {}
    for stack in group.stacks.values():
        for gap in common_gaps(stack):
            found.setdefault(gap.setting, gap)
    return list(found.values())


def manifest(group: GroupStack) -> list[dict[str, Any]]:
    """The objects, in the order `kubectl apply` needs them: claims, Deployments, the Service."""
    claims: dict[str, dict] = {}
    for rig, stack in group.stacks.items():
        claim = l2_claim(group.group, rig, stack)
        if claim is not None:
            claims.setdefault(claim, l2_claim_object(claim, stack))
    deployments = [deployment(group.group, rig, stack) for rig, stack in group.stacks.items()]
    return [*claims.values(), *deployments, service(group)]
