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
from rigkit.settings.defaults import KV_SHARE_VARIABLES, ROUTER_GROUP, kv_share_store_path
from rigkit.settings.knobs import KNOBS_BY_NAME
from rigkit.settings.variables import resolve

SHARE_KNOBS = [KNOBS_BY_NAME[name] for name in ("kv_share", "kv_share_janitor", "kv_hash_seed")]
NFS_FSTYPES = ("nfs", "nfs4")


def nfs_export(source: str) -> Optional[tuple[str, str]]:
    """(server, export path) of an NFS source as nfs(5) writes it, ``SERVER:/PATH``, an IPv6 server in brackets
    (``[fd00::1]:/export``); None for anything else."""
    if source.startswith("["):
        address, bracket, rest = source[1:].partition("]")
        if not (bracket and address and rest.startswith(":")):
            return None
        server, export = f"[{address}]", rest[1:]
    else:
        server, _, export = source.partition(":")
    return (server, export) if server and export.startswith("/") else None


def check_share_settings(section: Mapping[str, Any]) -> None:
    """An NFS source names its server and export (``server:/export``): anything else no mount can take."""
    source, fstype = section["kv_share_source"], section["kv_share_fstype"]
    if source is None or fstype not in NFS_FSTYPES:
        return
    if nfs_export(source) is None:
        raise ConfigError(
            "kv_share_source",
            source,
            f"is not an NFS export (kv_share_fstype {fstype})",
            "write it as SERVER:/EXPORT, e.g. nas:/export/rigkit-kv ([fd00::1]:/export for an IPv6 server)",
        )


def store_identity(source: str) -> str:
    """The one spelling of an export (its store's identity): the server's name case-folded, the export path
    normalised (nas:/export//kv/ and NAS:/export/kv are one store, with one janitor and one hash seed)."""
    export = nfs_export(source)
    if export is None:  # a directory already shared (kv_share_fstype none)
        return posixpath.normpath(source)
    path = posixpath.normpath(export[1])
    return f"{export[0].lower()}:{'/' if path == '//' else path}"


def shareable_profiles(profiles: Mapping[str, Any]) -> list[str]:
    return sorted(name for name, profile in profiles.items() if profile.connector and profile.connector.shareable)


def shared_l2_path(
    profile: Any, knobs: Mapping[str, Any], section: Mapping[str, Any], profiles: Mapping[str, Any]
) -> Optional[str]:
    """Where the connector store lives with ``kv_share`` on (None when off); ConfigError when the profile has
    no shared-capable tier, no source is declared, or an explicit l2_path lies off the shared mount."""
    if not knobs["kv_share"]:
        return None  # kv_share_janitor alone says nothing: it names the janitor of a store once one is shared
    if not (profile.connector and profile.connector.shareable):
        raise ConfigError(
            "kv_share",
            True,
            f"profile {profile.name} has no tier that can live on a shared mount",
            f"use a profile with one ({', '.join(shareable_profiles(profiles))}), or set kv_share: false",
        )
    if section["kv_share_source"] is None:
        raise ConfigError(
            "kv_share_source",
            None,
            "kv_share is on but no shared mount is declared",
            "set kv_share_source (e.g. nas:/export/rigkit-kv) and kv_share_mount_point in group data",
        )
    mount_point = section["kv_share_mount_point"]
    path = knobs["l2_path"] or kv_share_store_path(section)
    if posixpath.commonpath([path, mount_point]) != mount_point or path == mount_point:
        raise ConfigError(
            "l2_path",
            path,
            f"is not a directory inside the shared mount {mount_point} (kv_share)",
            "leave l2_path unset (the store then is kv_share_mount_point/kv_share_store_dir)",
        )
    return path


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
