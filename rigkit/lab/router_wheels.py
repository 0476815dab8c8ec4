"""The lab gateway's wheelhouse: vllm-router (router_version) and its dependencies for bookworm's Python,
downloaded once into CACHE_DIR/router-wheels/<key of its inputs> and served on loopback while a router deploy
installs it (router_pip_find_links), so the lab's gateway never needs the package index."""

from __future__ import annotations

import re
from pathlib import Path

from rigkit.lab.proc import Progress, print_progress
from rigkit.lab.serving_image import IMAGE_PYTHON_VERSION, WHEEL_PLATFORM, ensure_wheelhouse, input_hash
from rigkit.paths import CACHE_DIR
from rigkit.router import ROUTER_PACKAGE

ROUTER_WHEELS_ROOT = CACHE_DIR / "router-wheels"


def router_requirement(version: str) -> str:
    return f"{ROUTER_PACKAGE}=={version}"


def ensure_router_wheels(version: str, progress: Progress = print_progress) -> Path:
    requirement = router_requirement(version)
    target = ROUTER_WHEELS_ROOT / input_hash("router-wheels", [requirement], IMAGE_PYTHON_VERSION, WHEEL_PLATFORM)
    return ensure_wheelhouse(
        target,
        [requirement],
        progress,
        "~30 MB",
        f"pip must reach the package index for {requirement} (check `pip config list`)",
        re.compile(r"^Saved .*vllm_router"),
    )
