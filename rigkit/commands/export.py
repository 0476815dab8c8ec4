"""`rigkit export`: one inventory group's serving stack for Kubernetes, derived from what its rigs get over SSH.

    rigkit export inventory/dual_3090_qwen36.py --group dual_3090_qwen36 --target kubernetes
    rigkit export inventory/lab.py --group lab --target production-stack --data serving_port=8000 \\
        --accept serving_profile --accept l2_budget_gb -o values.yaml

Targets: ``kubernetes`` (per rig a Deployment of one pod and its L2 claim, one Service over the group: the
model-server manifest llm-d's guides and any cluster take; rigkit.export.kubernetes) and ``production-stack`` (values
for vLLM production-stack's Helm chart; rigkit.export.production_stack). Each rig's stack is validated as a deploy
validates it, then rendered as on the rig: the image by digest, the model's pinned revision on a read-only volume with
the hub off, the tier sizes and paths, the hash seed, the env passthrough and the engine's flags.

What the target cannot express is refused, one setting at a time (field, value, why, fix); a gap that leaves a
working pod can be accepted by name with --accept, and the output's header lists what was accepted. Exit status: 0
written, 2 refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from rigkit.errors import ConfigError
from rigkit.export import kubernetes, production_stack
from rigkit.export.gaps import refuse_gaps
from rigkit.export.group import group_stack
from rigkit.fleet.inventory import load_inventory, rigs_among, targeted
from rigkit.fleet.pyinfra_args import check_data_pairs
from rigkit.kv_share import check_inventory

TARGETS = {"kubernetes": kubernetes, "production-stack": production_stack}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inventory", help="pyinfra inventory file, e.g. inventory/dual_3090_qwen36.py")
    parser.add_argument("--group", required=True, help="the inventory group to export (its rigs, in order)")
    parser.add_argument("--target", required=True, choices=sorted(TARGETS))
    parser.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override host data as pyinfra's --data does (e.g. serving_port=8000)",
    )
    parser.add_argument(
        "--accept",
        action="append",
        default=[],
        metavar="SETTING",
        help="accept a gap the target cannot express, by the setting the refusal names",
    )
    parser.add_argument("-o", "--output", type=Path, default=None, help="write here (default: standard output)")


class _NoAliases(yaml.SafeDumper):
    """Every object written out in full: a reader (or kubectl diff) sees each label where it stands."""

    def ignore_aliases(self, data) -> bool:
        return True


def export_text(group, target: str, accepted) -> str:
    """The target's YAML for ``group``, headed by what was accepted; ConfigError for a gap not accepted."""
    module = TARGETS[target]
    taken = refuse_gaps(module.gaps(group), accepted)
    header = [f"# rigkit export --target {target}: group {group.group} ({', '.join(group.stacks)})"]
    header += [f"# {gap.accepted_line}" for gap in taken]
    if target == "kubernetes":
        body = yaml.dump_all(kubernetes.manifest(group), Dumper=_NoAliases, sort_keys=False, width=float("inf"))
    else:
        header.append(f"# for the chart {production_stack.CHART}")
        body = yaml.dump(production_stack.values(group), Dumper=_NoAliases, sort_keys=False, width=float("inf"))
    return "\n".join(header) + "\n" + body


def group_hosts(inventory: str, group: str, data) -> dict[str, dict]:
    """host -> data of the group's rigs, --data applied; no connection data is checked: no host is reached."""
    check_data_pairs(data)
    hosts = load_inventory(inventory, data_args=data)
    check_inventory((name, host["groups"], host["data"]) for name, host in hosts.items())
    return {name: dict(hosts[name]["data"]) for name in rigs_among(hosts, targeted(hosts, [group]))}


def run(args: argparse.Namespace) -> int:
    try:
        text = export_text(
            group_stack(args.group, group_hosts(args.inventory, args.group, args.data)), args.target, args.accept
        )
    except ConfigError as exc:
        print(f"rigkit export: refused: {exc}", file=sys.stderr)
        return 2
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text)
        print(f"-> {args.output}", file=sys.stderr)
    return 0
