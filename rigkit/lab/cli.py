"""`rigkit lab up | status | down`: the local fleet of real rigs that rigkit deploys to.

up     engine (no bridge) -> registry 127.0.0.1:5000 -> rig image -> N rigs -> serving image (two releases)
       (the last --netns-rigs of the N, when first made, in their own network namespace: rigkit.lab.netns);
       --router: vllm-router on 127.0.0.1:8310 in front of the rigs that serve (rigkit.lab.router_server)
status rigs, ports, SSH health, digests, engine and registry health
down   removes every container, mount, loop device, process and file the lab made; keeps the cache
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Optional, Sequence

from rigkit.errors import PreflightError, RigkitError
from rigkit.lab import engine, registry_server, rig_image, rigs, router_server
from rigkit.lab.lab_weights import lab_model_source
from rigkit.lab.proc import Progress, print_progress, remove_tree
from rigkit.lab.state import LabState, read_state_or_none, write_state
from rigkit.paths import CACHE_DIR, LAB_DIR, LAB_STATE_FILE

DEFAULT_RIGS = 2
DEFAULT_NETNS_RIGS = 0  # the demo runs on host-network rigs; the lab tests ask for one netns rig
MANIFEST_ACCEPT = ", ".join(
    (
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
    )
)


def _require_root(action: str) -> None:
    if os.geteuid() != 0:
        raise PreflightError(
            "user",
            os.geteuid(),
            f"not root; `lab {action}` runs an engine, loop devices and privileged rigs",
            f"sudo .venv/bin/rigkit lab {action}",
        )


def _ensure_serving_image(registry: str, progress: Progress) -> dict | None:
    try:
        from rigkit.lab.serving_image import ensure_serving_image
    except ImportError as exc:
        progress(f"serving image: skipped, rigkit.lab.serving_image is not available ({exc})")
        return None
    return ensure_serving_image(registry, progress)


def ensure_serving(state: LabState, progress: Progress = print_progress) -> None:
    """The serving image's releases and the lab's pinned model in ``state`` (written): what every lab deploy needs."""
    record = _ensure_serving_image(state.registry, progress)
    if record is None:
        return
    state.serving_image = record
    state.model_source = lab_model_source(progress)
    progress(f"lab model: {state.model_source}")
    write_state(state)


def lab_up(
    rig_count: int = DEFAULT_RIGS,
    progress: Progress = print_progress,
    serving_image: bool = True,
    netns_rigs: int = DEFAULT_NETNS_RIGS,
    distros: Optional[Sequence[str]] = None,
    router: bool = False,
) -> LabState:
    """Bring the lab up (idempotent: a second call reuses what runs and recreates what is missing).

    ``distros``: rig N's Debian suite is ``distros[N-1]`` (bookworm beyond the list); None keeps each
    existing rig's (a rig is recreated only when asked for another distribution)."""
    _require_root("up")
    started = time.monotonic()
    LAB_DIR.mkdir(parents=True, exist_ok=True)
    previous = read_state_or_none()
    if distros is None:
        distros = rigs.distros_of(previous.rigs) if previous else ()
    engine_record = engine.ensure_engine(progress)
    registry_pid = registry_server.ensure_registry(progress)
    images = {suite: rig_image.ensure_rig_image(progress, suite) for suite in {rig_image.SUITE, *distros}}
    if "trixie" in images:
        rig_image.ensure_compose_v2_copy(images["trixie"], "trixie", progress)
    lab_rigs = rigs.ensure_rigs(
        rig_count, images, progress, netns_count=netns_rigs, registry=registry_server.REGISTRY, distros=distros
    )
    image = images[rig_image.SUITE]
    state = LabState(
        registry=registry_server.REGISTRY,
        ssh_key=str(rigs.LAB_KEY),
        known_hosts=str(rigs.KNOWN_HOSTS),
        rigs=lab_rigs,
        rig_image=image,
        serving_image=previous.serving_image if previous else None,
        model_source=previous.model_source if previous else None,
        engine=engine_record,
        registry_pid=registry_pid,
        router=previous.router if previous and router_server.router_pid() else None,
    )
    write_state(state)
    if serving_image:
        ensure_serving(state, progress)
    if router:
        state.router = router_server.ensure_router(lab_rigs, progress)
        write_state(state)
    progress(f"lab up: {len(lab_rigs)} rigs in {time.monotonic() - started:.1f} s; state in {LAB_STATE_FILE}")
    return state


def lab_down(progress: Progress = print_progress, purge_cache: bool = False) -> None:
    """Remove what the lab made; keep CACHE_DIR (images, registry storage, wheels) unless purge_cache."""
    _require_root("down")
    router_server.stop_router(progress)
    engine_up = engine.engine_answers()
    if engine_up:
        rigs.release_all(progress)
    else:
        progress("docker engine: not answering; releasing mounts and loop devices only")
        rigs.release_all_without_engine(progress)
    registry_server.stop_registry(progress)
    lab_engine = engine.stop_engine(progress)
    if purge_cache and engine_up and not lab_engine:
        _remove_lab_images(progress)
    if LAB_DIR.exists():
        progress(f"files: removing {LAB_DIR}")
        remove_tree(LAB_DIR, "lab down: remove the lab's files")
    if purge_cache and CACHE_DIR.exists():
        progress(f"cache: removing {CACHE_DIR}")
        remove_tree(CACHE_DIR, "lab down: remove the cache")
    progress("lab down: done")


def _remove_lab_images(progress: Progress) -> None:
    result = subprocess.run(
        ["docker", "images", "-q", "--filter", f"label={rig_image.IMAGE_LABEL}"], capture_output=True, text=True
    )
    images = sorted(set(result.stdout.split()))
    if images:
        progress(f"cache: removing {len(images)} lab images from the engine")
        subprocess.run(["docker", "rmi", "-f", *images], capture_output=True)


def _manifest_present(reference: str) -> bool:
    registry, rest = reference.split("/", 1)
    name, digest = rest.split("@", 1)
    request = urllib.request.Request(
        f"http://{registry}/v2/{name}/manifests/{digest}", method="HEAD", headers={"Accept": MANIFEST_ACCEPT}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def lab_status() -> dict:
    """Health of everything in the state file, checked live."""
    state = read_state_or_none()
    engine_up = engine.engine_answers()
    status: dict = {
        "state_file": str(LAB_STATE_FILE) if state else None,
        "engine": {**engine.engine_state(), "answers": True} if engine_up else {"answers": False},
        "registry": {
            "address": registry_server.REGISTRY,
            "pid": registry_server.registry_pid(),
            "answers": registry_server.registry_answers(),
        },
        "rigs": [],
        "serving_image": None,
        "router": None,
    }
    if state is None:
        return status
    if state.router:
        status["router"] = {**state.router, "answers": router_server.answers(f"{state.router['url']}/health")}
    running = (
        set(subprocess.run(["docker", "ps", "--format", "{{.Names}}"], capture_output=True, text=True).stdout.split())
        if engine_up
        else set()
    )
    for rig in state.rigs:
        up = rig.container in running
        status["rigs"].append(
            {
                "name": rig.name,
                "container": rig.container,
                "running": up,
                "ssh": f"{rig.ssh_host}:{rig.ssh_port}",
                "ssh_ok": up and rigs.ssh_ready(rig),
                "netns": rig.netns,
                "host_address": rig.host_address,
                "rig_address": rig.rig_address,
                "serving_port": rig.serving_port,
                "nvme_path": rig.nvme_path,
                "loop_device": rig.loop_device,
            }
        )
    if state.serving_image:
        status["serving_image"] = {
            release: {"reference": reference, "in_registry": _manifest_present(reference)}
            for release, reference in state.serving_image.get("releases", {}).items()
        }
    return status


def _print_status(status: dict) -> bool:
    """Human summary; returns True if everything recorded is healthy."""
    healthy = True
    engine_status = status["engine"]
    if engine_status["answers"]:
        print(
            f"engine    ok   {engine_status['socket']} (pid {engine_status['pid'] or '-'}, "
            f"started by lab: {engine_status['started_by_lab']}, runc wrapper: {engine_status['runtime_wrapper']})"
        )
    else:
        print("engine    DOWN")
        healthy = False
    registry = status["registry"]
    print(f"registry  {'ok  ' if registry['answers'] else 'DOWN'} {registry['address']} (pid {registry['pid'] or '-'})")
    healthy &= registry["answers"]
    if status["state_file"] is None:
        print("no lab state: run `rigkit lab up`")
        return False
    for rig in status["rigs"]:
        ok = rig["running"] and rig["ssh_ok"]
        healthy &= ok
        network = f"  own netns (host end {rig['host_address']})" if rig.get("netns") else ""
        print(
            f"{rig['name']:<9} {'ok  ' if ok else 'DOWN'} ssh {rig['ssh']}  serving :{rig['serving_port']}  "
            f"nvme {rig['nvme_path']} -> {rig['loop_device']}  ({rig['container']}){network}"
        )
    router = status.get("router")
    if router:
        healthy &= router["answers"]
        print(
            f"router    {'ok  ' if router['answers'] else 'DOWN'} {router['url']} (pid {router.get('pid') or '-'}) "
            f"-> {', '.join(router['workers'])}"
            + (f"; left out: {'; '.join(router['left_out'])}" if router.get("left_out") else "")
        )
    if status["serving_image"] is None:
        print("serving   none recorded")
    else:
        for release, info in sorted(status["serving_image"].items()):
            healthy &= info["in_registry"]
            print(f"release {release} {'ok  ' if info['in_registry'] else 'MISSING'} {info['reference']}")
    return healthy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="lab_action", required=True)
    up = actions.add_parser("up", help="bring the lab up (idempotent)")
    up.add_argument("--rigs", type=int, default=DEFAULT_RIGS, help=f"number of rigs (default {DEFAULT_RIGS})")
    up.add_argument(
        "--netns-rigs",
        type=int,
        default=DEFAULT_NETNS_RIGS,
        help="how many of the last --rigs get their own network namespace when first made "
        f"(reached at 10.213.N.2:22; their API only through an SSH tunnel; default {DEFAULT_NETNS_RIGS})",
    )
    up.add_argument(
        "--distros",
        type=lambda text: [part.strip() for part in text.split(",") if part.strip()],
        default=None,
        help="each rig's Debian suite in order, e.g. bookworm,trixie "
        f"(one of {', '.join(rig_image.SUITES)}; bookworm beyond the list; "
        "default: existing rigs keep theirs)",
    )
    up.add_argument(
        "--no-serving-image",
        action="store_true",
        help="skip building/pushing the vLLM serving image (minutes when cold)",
    )
    up.add_argument(
        "--router",
        action="store_true",
        help="also run vllm-router on 127.0.0.1:8310 in front of the host-network rigs that serve "
        "(after a deploy); inventory/lab_router.py declares it for rigkit deploy",
    )
    status = actions.add_parser("status", help="rigs, ports, SSH health, digests, engine and registry health")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    down = actions.add_parser("down", help="remove everything the lab made (keeps the cache)")
    down.add_argument("--purge-cache", action="store_true", help=f"also remove {CACHE_DIR} (images, registry, wheels)")


def run(args: argparse.Namespace) -> int:
    try:
        if args.lab_action == "up":
            lab_up(
                args.rigs,
                serving_image=not args.no_serving_image,
                netns_rigs=args.netns_rigs,
                distros=args.distros or None,
                router=args.router,
            )
            return 0
        if args.lab_action == "down":
            lab_down(purge_cache=args.purge_cache)
            return 0
        status = lab_status()
        if args.json:
            print(json.dumps(status, indent=2))
            return 0 if status["state_file"] else 1
        return 0 if _print_status(status) else 1
    except RigkitError as exc:
        print(f"rigkit lab {args.lab_action}: {exc}", file=sys.stderr)
        return 1
