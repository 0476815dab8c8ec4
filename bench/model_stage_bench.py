"""Staging a model onto 4 rigs: from the source to every rig, vs once from the source then rig to rig.

    flock /tmp/rigkit-lab.lock .venv/bin/python bench/model_stage_bench.py [--mb 300] [--rigs rig1,rig2]

The lab must be up with host-network rigs. The model is a controller directory of --mb MB (random bytes in
a few safetensors-sized files plus a config.json), pinned by its manifest. The 4 staging targets are the
given rigs' stores, two stores per rig when fewer than 4 rigs are given (each store is its own target
over its own SSH connection; a rig sending to its own second store still goes through ssh to itself). Each
mode starts from empty stores and runs rigkit.model.stage.FleetStager as `rigkit stage` does; printed side
by side: bytes read from the source, bytes sent in all, wall time. Met / not met: the source read once.
Wall time is printed, not judged: on one machine every transfer shares the same disk and CPUs.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent))

from rigkit.fleet.inventory import load_inventory  # noqa: E402
from rigkit.model.stage import FleetStager, RigStore  # noqa: E402
from rigkit.paths import REPO_ROOT  # noqa: E402
from rigkit.settings.model_source import manifest_size, read_directory_manifest, resolve_directory  # noqa: E402

TARGETS = 4
STORE_ROOT = "/var/tmp/rigkit-model-bench"
SOURCE_DIR = Path("/var/tmp/rigkit-model-bench-source")


def make_source(megabytes: int) -> Path:
    SOURCE_DIR.mkdir(parents=True, exist_ok=True)
    parts = 3
    for index in range(parts):
        path = SOURCE_DIR / f"model-{index + 1:05d}-of-{parts:05d}.safetensors"
        size = megabytes * 1_000_000 // parts
        if not path.exists() or path.stat().st_size != size:
            with open(path, "wb") as handle:
                left = size
                while left:
                    chunk = os.urandom(min(left, 8 << 20))
                    handle.write(chunk)
                    left -= len(chunk)
    (SOURCE_DIR / "config.json").write_text('{"model_type": "bench"}\n')
    return SOURCE_DIR


def targets(hosts: dict, rigs: list[str]) -> tuple[dict, dict]:
    """TARGETS staging targets: name -> host data, name -> store path."""
    data, stores = {}, {}
    for index in range(TARGETS):
        rig = rigs[index % len(rigs)]
        name = rig if index < len(rigs) else f"{rig}-store{index // len(rigs) + 1}"
        data[name] = hosts[rig]["data"]
        stores[name] = f"{STORE_ROOT}/{name}"
    return data, stores


def wipe(data: dict, stores: dict) -> None:
    for name, host in data.items():
        store = RigStore(name, host, stores[name], source)
        store.run(f"rm -rf {shlex.quote(stores[name])}")
        store.close()


def run_mode(rig_to_rig: bool, data: dict, stores: dict) -> tuple[float, int, int, list[str]]:
    wipe(data, stores)
    lines: list[str] = []

    def progress(line: str) -> None:
        lines.append(line)
        print(f"    {line}", flush=True)

    started = time.monotonic()
    report = FleetStager(
        source, root, files, data, stores, {name: 2 for name in data}, progress=progress, rig_to_rig=rig_to_rig
    ).stage()
    wall = time.monotonic() - started
    return wall, report.source_bytes, sum(o.sent_bytes for o in report.outcomes.values()), report.lines()


def main() -> int:
    global source, root, files
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=300, help="model size in MB")
    parser.add_argument("--rigs", default="rig1,rig2", help="host-network lab rigs to stage onto")
    args = parser.parse_args()
    print(f"--> making a {args.mb} MB model directory in {SOURCE_DIR}", flush=True)
    root = make_source(args.mb)
    source = resolve_directory(str(root))
    files = read_directory_manifest(source)
    size = manifest_size(files)
    hosts = load_inventory(str(REPO_ROOT / "inventory" / "lab.py"))
    data, stores = targets(hosts, args.rigs.split(","))
    print(f"--> targets: {', '.join(f'{name} ({stores[name]})' for name in data)}", flush=True)
    results = {}
    for label, rig_to_rig in (("source to every rig", False), ("once, then rig to rig", True)):
        print(f"--> {label}", flush=True)
        results[label] = run_mode(rig_to_rig, data, stores)
        for line in results[label][3]:
            print(f"    {line}")
    wipe(data, stores)
    print(f"\nstaging {size / 1e6:,.0f} MB onto {TARGETS} targets")
    print(f"{'mode':<24} {'read from source':>17} {'sent in all':>12} {'wall':>8}")
    for label, (wall, from_source, sent, _) in results.items():
        print(f"{label:<24} {from_source / 1e6:>14,.0f} MB {sent / 1e6:>9,.0f} MB {wall:>7.1f}s")
    once = results["once, then rig to rig"][1]
    every = results["source to every rig"][1]
    print(
        f"source read once per fleet (rig to rig: {once / 1e6:,.0f} MB = model size {size / 1e6:,.0f} MB): "
        f"{'met' if once == size else 'NOT MET'}"
    )
    print(
        f"source bytes cut {every / max(once, 1):.1f}x (target {TARGETS}x): "
        f"{'met' if every == TARGETS * once else 'NOT MET'}"
    )
    print("wall time: not judged (one machine: every transfer shares its disk and CPUs)")
    return 0 if once == size else 1


if __name__ == "__main__":
    sys.exit(main())
