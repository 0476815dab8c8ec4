"""One inventory group's rigs as the export sees them: each rig's validated stack, and the gaps every Kubernetes
target shares (rigkit.export.kubernetes and rigkit.export.production_stack add their own)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from rigkit.errors import ConfigError
from rigkit.export.gaps import Gap
from rigkit.settings.hostdata import Settings, rig_settings
from rigkit.settings.model_source import SHARED

# Kubernetes object names are DNS-1123 labels: lowercase alphanumerics and '-', at most 63 characters
_NOT_IN_A_NAME = re.compile(r"[^a-z0-9-]+")
NAME_PREFIX = "rigkit-"


def object_name(*parts: str) -> str:
    """A DNS-1123 label from ``parts`` (rigkit-<parts>), cut to 63 characters."""
    text = _NOT_IN_A_NAME.sub("-", "-".join(parts).lower()).strip("-")
    return (NAME_PREFIX + text)[:63].rstrip("-")


@dataclass(frozen=True)
class GroupStack:
    """The rigs of one group, in inventory order, each with its stack and role settings as an SSH deploy has them."""

    group: str
    stacks: Mapping[str, Settings]
    router_policy: str

    @property
    def first(self) -> Settings:
        return next(iter(self.stacks.values()))


def group_stack(group: str, hosts: Mapping[str, Mapping]) -> GroupStack:
    """ConfigError when the group has no rig, or its rigs serve different models (one Service fronts them all)."""
    if not hosts:
        raise ConfigError("--group", group, "has no rig in this inventory", "name a group the inventory puts rigs in")
    stacks, policies = {}, set()
    for name, data in hosts.items():
        rig = rig_settings(dict(data))
        stacks[name] = rig.stack
        policies.add(rig.router["router_policy"])
    names = {stack.knobs["served_model_name"] for stack in stacks.values()}
    if len(names) > 1:
        raise ConfigError(
            "served_model_name",
            sorted(names),
            f"differs between the rigs of group {group}: one Service would front different models",
            "export a group whose rigs serve one model",
        )
    return GroupStack(group, stacks, sorted(policies)[0])


def common_gaps(stack: Settings) -> list[Gap]:
    """What neither a plain Kubernetes Deployment nor production-stack's chart can do as an SSH rig does."""
    knobs = stack.knobs
    gaps = []
    if stack.gpu_ids:
        gaps.append(
            Gap(
                "gpu_mask",
                knobs["gpu_mask"],
                "Kubernetes' device plugin picks which GPUs a pod gets: no GPU index can be named",
                "clear it for the export (--data gpu_mask=) and pick the nodes with a node selector",
                acceptable=False,
            )
        )
    source = stack.model_source
    if source is None:
        gaps.append(
            Gap(
                "model_source",
                None,
                f"the model is not pinned: every pod downloads {knobs['model']!r} from the hub at start, whatever "
                "revision it holds then (no read-only volume, no HF_HUB_OFFLINE)",
                "pin it: model_source ORG/NAME@<commit> (`rigkit resolve-model`), and stage it into the model volume",
            )
        )
    elif source.kind == SHARED:
        gaps.append(
            Gap(
                "model_source",
                source.spec,
                "names a directory every rig shares; a pod mounts a volume, not a host directory",
                "pin the model by hub commit or controller manifest and stage it into the model volume",
                acceptable=False,
            )
        )
    if stack.runs_l2_janitor:
        gaps.append(
            Gap(
                "l2_budget_gb",
                knobs["l2_budget_gb"],
                "no L2 janitor in the pod: nothing evicts the connector's store, which never evicts itself, so it "
                "grows until the volume is full and the engine dies (on a rig the janitor keeps it under the budget)",
                "size the volume for the store's growth and watch its use, or keep this profile on rigs",
            )
        )
    if knobs["restart_policy"] != "always" and knobs["restart_policy"] != "unless-stopped":
        gaps.append(
            Gap(
                "restart_policy",
                knobs["restart_policy"],
                "a Deployment's pods restart a stopped container always (restartPolicy Always is the only one it "
                "takes): a stack that should stay down after a failure comes back",
                "accept the kubelet's restarts, or keep this stack on rigs",
            )
        )
    return gaps
