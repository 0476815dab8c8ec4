"""Where rigkit keeps things (one definition per path), and what a host path a user sets may be."""

import os
import unicodedata
from pathlib import Path
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parent.parent
# The deploy files at the repository's root: every rig's deploy, and the rollback to the previous release.
DEFAULT_DEPLOY = "deploy.py"
ROLLBACK_DEPLOY = "rollback.py"
TEMPLATES_DIR = REPO_ROOT / "templates"
PROFILES_FILE = REPO_ROOT / "profiles.yaml"
FILES_DIR = Path(__file__).resolve().parent / "files"  # uploaded to the rig as they are

# Lab state (containers, keys, loop images) and the build cache that outlives `lab down`.
LAB_DIR = Path(os.environ.get("RIGKIT_LAB_DIR", "/var/lib/rigkit-lab"))
LAB_STATE_FILE = LAB_DIR / "state.json"
CACHE_DIR = Path(os.environ.get("RIGKIT_CACHE_DIR", "/var/cache/rigkit"))
# On the controller: one record per inventory of the rollout `rigkit deploy --canary/--batch` runs
# (rigkit.rollout.record).
ROLLOUTS_DIR = Path(os.environ.get("RIGKIT_ROLLOUTS_DIR", REPO_ROOT / "rollouts"))

# On a rig: the compose project (compose.yml + .env) and rigkit's own state (ledger, helper scripts).
RIG_STACK_DIR = "/etc/rigkit/stack"
RIG_STATE_DIR = "/var/lib/rigkit"
# Each verified release's compose.yml + .env, by release hash: what a rollback restores exactly.
RIG_RELEASES_DIR = f"{RIG_STATE_DIR}/releases"
RIG_LIB_DIR = "/usr/local/lib/rigkit"
# The labels of the stack's containers (rigkit.serving.render writes them on the compose service).
LABEL_PREFIX = "org.rigkit"
STACK_LABEL = f"{LABEL_PREFIX}.stack"  # finds the stack's containers (rigkit.facts.serving.StackContainers)
STACK_NAME = "serving"  # the STACK_LABEL value


# Host paths a user sets (l2_path, the L2 mount point, ...) are bind-mounted read-write into the container,
# mounted over, chowned and chmodded by rigkit. Trees that belong to the system or the container engine:
# no such path may be at or under them.
SYSTEM_TREES = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var/lib/docker",
    "/var/lib/containerd",
    RIG_RELEASES_DIR,
)
# Directories that hold other things: a path may be inside them, never one of them.
SYSTEM_DIRECTORIES = (
    "/",
    "/home",
    "/media",
    "/mnt",
    "/opt",
    "/root",
    "/srv",
    "/tmp",
    "/var",
    "/var/cache",
    "/var/lib",
    "/var/log",
    "/var/spool",
    "/var/tmp",
    RIG_STATE_DIR,
)
# Longest file name (one path component) Linux filesystems take, in bytes (NAME_MAX).
NAME_MAX_BYTES = 255


def _path_text_problem(path: str) -> Optional[str]:
    """Characters no host path setting may hold, whichever file it is written to."""
    for char in path:
        if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs"):
            return f"contains the control or format character {ascii(char)}"
        if char.isspace() and char != " ":
            return f"contains the whitespace character {ascii(char)} (only a plain space is allowed)"
    if "$" in path:
        # compose interpolates $ in the bind source, systemd in ExecStart, a shell inside double quotes.
        return "contains '$', which compose and systemd would expand"
    return None


def _parts_problem(parts: list[str]) -> Optional[str]:
    if any(part in ("", ".", "..") for part in parts):
        return "must be normalised: no empty, '.' or '..' parts, no leading, doubled or trailing '/'"
    if any(part != part.strip(" ") for part in parts):
        return "has a part that starts or ends with a space (invisible in every listing)"
    if any(len(part.encode()) > NAME_MAX_BYTES for part in parts):
        return f"has a part longer than {NAME_MAX_BYTES} bytes, which no Linux filesystem stores"
    return None


def relative_path_problem(path: str) -> Optional[str]:
    """Why ``path`` is not a clean relative path (inside another directory), or None."""
    if path.startswith("/"):
        return "must be relative (it is joined to another directory); an absolute path would escape it"
    return _path_text_problem(path) or _parts_problem(path.split("/"))


def absolute_path_problem(path: str) -> Optional[str]:
    """Why ``path`` is not an absolute, normalised path of visible characters, or None."""
    if not path.startswith("/"):
        return "must be an absolute host path"
    if path != "/":
        return _path_text_problem(path) or _parts_problem(path[1:].split("/"))
    return None


def host_path_problem(path: str) -> Optional[str]:
    """Why ``path`` must not be a host path setting, or None: absolute, normalised, never a system directory."""
    problem = absolute_path_problem(path)
    if problem:
        return problem
    for tree in SYSTEM_TREES:
        if path == tree or path.startswith(tree + "/"):
            return f"is {'inside ' if path != tree else ''}the system directory {tree}"
    if path in SYSTEM_DIRECTORIES:
        return f"is the system directory {path} itself: name a directory inside it"
    return None


def bind_source_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be a host directory bind-mounted into the container (l2_path, model_store_path, a shared
    model), or None: a host path (host_path_problem) without ':', which compose's volume syntax splits on."""
    problem = host_path_problem(path)
    if problem:
        return problem
    if ":" in path:
        return "must not contain ':' (compose volume syntax)"
    return None


def device_path_problem(path: str) -> Optional[str]:
    """Why ``path`` is not a block device path under /dev (e.g. /dev/disk/by-id/nvme-...), or None."""
    if not path.startswith("/dev/"):
        return "must be a device path under /dev/, preferably /dev/disk/by-id/..."
    return _path_text_problem(path) or _parts_problem(path[1:].split("/"))
