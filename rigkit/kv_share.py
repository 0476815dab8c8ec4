"""The shared KV tier: a connector store on a mount several rigs share, hashed with one seed fleet-wide.

A profile with a shared-capable tier (profiles.yaml ``shareable``) opts in with the ``kv_share`` knob: its
connector store (l2_path) becomes ``kv_share_mount_point/kv_share_store_dir``, which roles/kv_share.py mounts
from ``kv_share_source``. Rigs naming the same source share one store, so before any host is touched:
- they must hash with the same ``kv_hash_seed`` (PYTHONHASHSEED: vLLM's fs tier names its files from
  Python's hash(), so engines with different seeds never find each other's blocks);
- exactly one of them runs the L2 janitor on it (``kv_share_janitor``): the janitor evicts the store's least
  recently used entries whoever wrote them, so two would race on the same entries with their own budgets, and
  none would let the store fill the export (a full store kills the engines: the connectors never evict).
Pure decisions; the roles and entry points call them.
"""

from __future__ import annotations

import posixpath
from typing import Any, Iterable, Mapping, Optional

from rigkit.disk import fstab_line
from rigkit.errors import ConfigError
from rigkit.settings.defaults import KV_SHARE_VARIABLES, ROUTER_GROUP
from rigkit.settings.hostdata import nfs_export
from rigkit.settings.knobs import KNOBS_BY_NAME
from rigkit.settings.variables import resolve

SHARE_KNOBS = [KNOBS_BY_NAME[name] for name in ("kv_share", "kv_share_janitor", "kv_hash_seed")]


def store_identity(source: str) -> str:
    """The one spelling of an export (its store's identity): the server's name case-folded, the export path
    normalised (nas:/export//kv/ and NAS:/export/kv are one store, with one janitor and one hash seed)."""
    export = nfs_export(source)
    if export is None:  # a directory already shared (kv_share_fstype none)
        return posixpath.normpath(source)
    path = posixpath.normpath(export[1])
    return f"{export[0].lower()}:{'/' if path == '//' else path}"


def fstab_entry_line(section: Mapping[str, Any]) -> str:
    """The export's /etc/fstab line, every field quoted by fstab rules (no fsck pass for a network mount)."""
    return fstab_line(
        section["kv_share_source"],
        section["kv_share_mount_point"],
        section["kv_share_fstype"],
        section["kv_share_mount_options"],
        pass_number=0,
    )


# The fleet view: rigs sharing one store.


def store_member(data: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """A host's share of the fleet check ({source, seed, janitor}), None when it keeps its store to itself."""
    knobs = resolve(SHARE_KNOBS, dict(data))
    if not knobs["kv_share"]:
        return None
    section = resolve(KV_SHARE_VARIABLES, dict(data))
    source = section["kv_share_source"]
    return {
        "source": None if source is None else store_identity(source),
        "seed": knobs["kv_hash_seed"],
        "janitor": knobs["kv_share_janitor"],
    }


def check_shared_stores(hosts: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
    """ConfigError, before any host is touched, when rigs sharing a store declare different seeds or not
    exactly one janitor. ``hosts``: (name, host data) of every host of the inventory, not only those targeted:
    a rig left out of this run still reads and writes the same store."""
    stores: dict[str, dict[str, dict]] = {}
    for name, data in hosts:
        member = store_member(data)
        if member is not None and member["source"] is not None:
            stores.setdefault(member["source"], {})[name] = member
    for source, members in sorted(stores.items()):
        seeds = {name: member["seed"] for name, member in sorted(members.items())}
        if len(set(seeds.values())) > 1:
            first = next(iter(seeds))
            other = next(name for name, seed in seeds.items() if seed != seeds[first])
            raise ConfigError(
                f"{other}.kv_hash_seed",
                seeds[other],
                f"differs from {first}'s {seeds[first]} while both share the store {source}: engines "
                "with different hash seeds never find each other's blocks",
                "declare kv_hash_seed once for the fleet (group data), not per rig",
            )
        janitors = sorted(name for name, member in members.items() if member["janitor"])
        if len(janitors) != 1:
            problem = (
                f"{', '.join(janitors)} all run the L2 janitor on it: each evicts the others' entries to its own budget"
                if janitors
                else "no rig runs the L2 janitor on it: nothing keeps it under "
                "l2_budget_gb and a full store kills every engine on it"
            )
            raise ConfigError(
                "kv_share_janitor",
                ", ".join(janitors) or None,
                f"rigs {', '.join(sorted(members))} share the store {source}; {problem}",
                "set kv_share_janitor: true on exactly one rig of the store",
            )


def check_inventory(hosts: Iterable[tuple[str, Iterable[str], Mapping[str, Any]]]) -> None:
    """check_shared_stores over an inventory's (name, groups, data), its gateways (ROUTER_GROUP) left out:
    they serve no engine."""
    check_shared_stores((name, data) for name, groups, data in hosts if ROUTER_GROUP not in set(groups))
