"""`rigkit stage INVENTORY`: stage every targeted rig's pinned model (model_source) before a release, and
`rigkit stage INVENTORY --check`: which rigs hold it verified and undamaged (every file re-hashed with --deep).

`rigkit deploy` stages first (``stage_inventory``), so the release never starts on a rig without its
model. Every rig's settings are validated before any rig is touched; the hub token (hf_token, from the
controller's RIGKIT_HF_TOKEN) is used here, on the controller, only.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from rigkit.errors import ConfigError, RigkitError
from rigkit.fleet.inventory import check_connection_data, load_inventory, rigs_among, targeted
from rigkit.model.hub import default_cache_dir, fetch_to_controller
from rigkit.model.stage import FleetStager, RigStore, StageReport, verify_shared
from rigkit.settings.hostdata import DEFAULT_L2_MOUNT, Settings, settings_for_host
from rigkit.settings.model_source import HUB, SHARED, ModelSource, read_directory_manifest


def staged_settings(hosts: Mapping[str, Mapping], names: Sequence[str]) -> dict[str, Settings]:
    """Each targeted rig declaring a model_source -> its validated settings (ConfigError before any host)."""
    found = {}
    for name in rigs_among(hosts, list(names)):
        data = hosts[name]["data"]
        if not data.get("serving_profile"):
            continue
        settings = settings_for_host(data)
        if settings.model_source is not None:
            check_connection_data(name, data)
            found[name] = settings
    return found


def store_mounts(hosts: Mapping[str, Mapping], stores: Mapping[str, str]) -> dict[str, str]:
    """rig -> its L2 disk's mount point, for each rig whose model store is under it (the default): the disk must be
    mounted before anything is staged there."""
    found = {}
    for name, store in stores.items():
        data = hosts[name]["data"]
        mount = (data.get("l2_mount_point") or DEFAULT_L2_MOUNT).rstrip("/")
        if data.get("l2_device") and (store.rstrip("/") + "/").startswith(mount + "/"):
            found[name] = mount
    return found


def rigs_awaiting_store_mount(hosts: Mapping[str, Mapping], names: Sequence[str]) -> list[str]:
    """The targeted rigs whose model store is under their L2 disk's mount point while nothing is mounted there yet (a
    fresh rig): staging would be refused (rigkit.model.stage.check_store_mounted) until the l2_disk role ran."""
    settings = staged_settings(hosts, names)
    stores = {name: rig.knobs["model_store_path"] for name, rig in settings.items()}
    awaiting = []
    for name, mount in store_mounts(hosts, stores).items():
        store = RigStore(name, hosts[name]["data"], stores[name], settings[name].model_source)
        try:
            if store.call("state").get("store_mount") != mount:
                awaiting.append(name)
        finally:
            store.close()
    return awaiting


def local_copy(
    source: ModelSource,
    token: Optional[str],
    progress: Callable[[str], None],
    cache_dir: Optional[Path] = None,
    endpoint: Optional[str] = None,
) -> tuple[Path, dict]:
    """The revision's files on the controller, verified, and their manifest."""
    if source.kind == HUB:
        copy = fetch_to_controller(
            source, cache_dir or default_cache_dir(), endpoint=endpoint, token=token, progress=progress
        )
        return copy.root, copy.files
    return Path(source.name), read_directory_manifest(source)


def stage_inventory(
    hosts: Mapping[str, Mapping],
    names: Sequence[str],
    progress: Callable[[str], None] = print,
    rig_to_rig: bool = True,
    endpoint: Optional[str] = None,
) -> list[StageReport]:
    """Stage the model of every targeted rig that declares one: one source read per model, then rig to rig."""
    by_source: dict[str, dict[str, Settings]] = defaultdict(dict)
    for name, settings in staged_settings(hosts, names).items():
        by_source[settings.model_source.spec][name] = settings
    reports = []
    for spec, rigs in by_source.items():
        first = next(iter(rigs.values()))
        source = first.model_source
        stores = {name: settings.knobs["model_store_path"] for name, settings in rigs.items()}
        if source.kind == SHARED:
            progress(f"--> model {spec}: verifying it in place on {len(rigs)} rig(s) (a shared mount: not copied)")
            report = verify_shared(
                source, {name: hosts[name]["data"] for name in rigs}, stores, progress, store_mounts(hosts, stores)
            )
            for line in report.lines():
                progress(f"    {line}")
            reports.append(report)
            continue
        progress(f"--> model {spec}: staging onto {len(rigs)} rig(s)")
        root, files = local_copy(source, first.knobs["hf_token"], progress, endpoint=endpoint)
        stager = FleetStager(
            source,
            root,
            files,
            {name: hosts[name]["data"] for name in rigs},
            stores,
            {name: settings.knobs["model_store_keep"] for name, settings in rigs.items()},
            progress=progress,
            rig_to_rig=rig_to_rig,
            store_mounts=store_mounts(hosts, stores),
        )
        report = stager.stage()
        for line in report.lines():
            progress(f"    {line}")
        progress(f"    read from the source: {report.source_bytes / 1e6:,.1f} MB (manifest {report.manifest[:12]})")
        reports.append(report)
    return reports


def check_inventory_models(hosts: Mapping[str, Mapping], names: Sequence[str], deep: bool = False) -> dict[str, dict]:
    """rig -> {"staged": bool, "damaged": [...], "model": spec}: the declared revision on each rig."""
    found = {}
    for name, settings in staged_settings(hosts, names).items():
        store = RigStore(name, hosts[name]["data"], settings.knobs["model_store_path"], settings.model_source)
        try:
            result = store.call("check", *(["deep"] if deep else []))
        finally:
            store.close()
        found[name] = {**result, "model": settings.model_source.spec}
    return found


# rigkit.cli refuses these options where they would be ignored: --deep re-hashes what --check reads; --json and
# --from-controller-only shape a staging run, which --check does not make.
OPTIONS_IN_PLACE = (
    ("--deep", "--check", True),
    ("--json", "--check", False),
    ("--from-controller-only", "--check", False),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inventory", help="pyinfra inventory file (e.g. inventory/lab.py)")
    parser.add_argument("--limit", action="append", default=[], help="hosts or groups (as pyinfra's --limit)")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE", help="as pyinfra's --data")
    parser.add_argument("--check", action="store_true", help="only report which rigs hold the model verified")
    parser.add_argument("--deep", action="store_true", help="with --check: re-hash every staged file")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print each model's report as JSON on stdout (bytes read from the source, each rig's action and "
        "bytes sent); progress goes to stderr",
    )
    parser.add_argument(
        "--from-controller-only",
        action="store_true",
        help="send from the controller to every rig (no rig to rig): the benchmark's baseline",
    )


def run(args: argparse.Namespace) -> int:
    try:
        hosts = load_inventory(args.inventory, data_args=args.data)
        names = targeted(hosts, args.limit)
        if not staged_settings(hosts, names):
            raise ConfigError(
                "model_source",
                None,
                f"no targeted rig of {args.inventory} declares one: there is nothing to stage or check",
                "set model_source on the rigs (`rigkit resolve-model` prints the pin), or --limit to rigs that set it",
            )
        if args.check:
            results = check_inventory_models(hosts, names, deep=args.deep)
            for name, result in results.items():
                state = (
                    "staged"
                    if result["staged"] and not result["damaged"]
                    else "DAMAGED"
                    if result["staged"]
                    else "not staged"
                )
                print(
                    f"{name}: {result['model']}: {state}"
                    + "".join(f"\n    {item['path']}: {item['why']}" for item in result["damaged"])
                )
            return 0 if all(r["staged"] and not r["damaged"] for r in results.values()) else 1
        if args.json:
            reports = stage_inventory(
                hosts,
                names,
                progress=lambda line: print(line, file=sys.stderr, flush=True),
                rig_to_rig=not args.from_controller_only,
            )
            print(json.dumps({"reports": [report.as_json() for report in reports]}, indent=1))
        else:
            stage_inventory(hosts, names, rig_to_rig=not args.from_controller_only)
    except ConfigError as exc:
        print(f"rigkit stage: refused before any rig was touched: {exc}", file=sys.stderr)
        return 2
    except RigkitError as exc:
        print(f"rigkit stage: {exc}", file=sys.stderr)
        return 1
    return 0
