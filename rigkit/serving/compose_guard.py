"""The env-passthrough guard: variables a compose entrypoint reads at run time but never declares.

In a compose file, ``$${VAR}``, ``$${VAR:-x}`` and ``$$VAR`` survive compose's own interpolation and
are read by the in-container shell. Unless ``environment:`` (or an ``env_file:``) declares VAR, a
value set on the host never reaches the container and the entrypoint silently runs its default:
the real rig shipped that way with LMCACHE_L1_GB, LMCACHE_L2, LMCACHE_L2_ADAPTER and
LMCACHE_CHUNK_SIZE. ``rigkit check-compose FILE...`` lists them per service and exits 1.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, Iterable

import yaml

from rigkit.settings import strict_yaml

# `$$` then a name, optionally braced: what the container's shell expands.
RUNTIME_READ = re.compile(r"\$\$\{?([A-Za-z_][A-Za-z0-9_]*)")
# Shell-local names the script sets itself (NAME=..., NAME=(...), for NAME in, read NAME).
SHELL_ASSIGNMENT = re.compile(r"(?:^|[\s;&|(!])(?:local\s+|export\s+|declare\s+(?:-\w+\s+)*)?([A-Za-z_][A-Za-z0-9_]*)=")
LOOP_OR_READ = re.compile(r"\b(?:for|read(?:\s+-\w+)*)\s+([A-Za-z_][A-Za-z0-9_]*)")
# Set by the container runtime or the shell, never by compose.
RUNTIME_PROVIDED = frozenset(
    {
        "HOME",
        "PATH",
        "HOSTNAME",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "TERM",
        "USER",
        "SHELL",
        "RANDOM",
        "LINENO",
        "SECONDS",
        "BASH_SOURCE",
        "IFS",
    }
)
FIX = "declare each under the service's environment: as NAME=${NAME:-} (and set it in .env)"


def _texts(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [str(item) for item in value]
    return [str(value)]


def _first_local_assignment(script: str, name: str) -> int | None:
    """Offset of the first assignment to ``name`` that does not itself read ``name`` (else None)."""
    for match in SHELL_ASSIGNMENT.finditer(script):
        if match.group(1) != name:
            continue
        value = re.split(r"[\s;&|]", script[match.end() :], maxsplit=1)[0]
        if not any(read == name for read in RUNTIME_READ.findall(value)):
            return match.start(1)
    for match in LOOP_OR_READ.finditer(script):
        if match.group(1) == name:
            return match.start(1)
    return None


def runtime_reads(script: str) -> set[str]:
    """Names the in-container shell reads from its environment.

    A name the script assigns before its first read (``args=(...)``, ``for x in``) is a shell local;
    ``X=$${X:-30}`` still reads X from the environment first.
    """
    first_read: dict[str, int] = {}
    for match in RUNTIME_READ.finditer(script):
        first_read.setdefault(match.group(1), match.start())
    reads = set()
    for name, offset in first_read.items():
        assigned = _first_local_assignment(script, name)
        if name not in RUNTIME_PROVIDED and (assigned is None or assigned > offset):
            reads.add(name)
    return reads


def declared_environment(service: dict, base_dir: Path | None = None) -> set[str]:
    """Names the service's environment: (list or mapping) and readable env_file(s) declare."""
    environment = service.get("environment") or {}
    if isinstance(environment, dict):
        names = set(environment)
    else:
        names = {str(item).split("=", 1)[0] for item in environment}
    env_files = service.get("env_file") or []
    for entry in [env_files] if isinstance(env_files, (str, dict)) else env_files:
        path = entry.get("path") if isinstance(entry, dict) else entry
        candidate = Path(path) if base_dir is None else base_dir / path
        if candidate.is_file():
            for line in candidate.read_text().split("\n"):  # compose ends .env lines at "\n" only
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    names.add(line.split("=", 1)[0].removeprefix("export ").strip())
    return names


def undeclared_variables(compose_text: str, base_dir: Path | None = None) -> dict[str, list[str]]:
    """service -> sorted names its entrypoint/command reads at run time without declaring them."""
    document = strict_yaml.load(compose_text)
    if not isinstance(document, dict):
        raise ValueError(
            f"not a compose file: its top level is {type(document).__name__}, not a mapping "
            "(an .env file? give the compose.yml beside it)"
        )
    services = document.get("services")
    if not services:
        raise ValueError("declares no services: nothing to check (not a compose file, or an empty one)")
    if not isinstance(services, dict):
        raise ValueError("services: must be a mapping")
    missing: dict[str, list[str]] = {}
    for name, service in services.items():
        service = service or {}
        script = "\n".join(_texts(service.get("entrypoint")) + _texts(service.get("command")))
        undeclared = runtime_reads(script) - declared_environment(service, base_dir)
        if undeclared:
            missing[name] = sorted(undeclared)
    return missing


def check_files(paths: Iterable[str], out=None) -> int:
    """Print per file and service what is undeclared; 0 = clean, 1 = undeclared reads, 2 = unreadable."""
    out = out or sys.stdout
    status = 0
    for raw in paths:
        path = Path(raw)
        try:
            missing = undeclared_variables(path.read_text(), path.parent)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            print(f"{path}: cannot check ({exc})", file=out)
            status = max(status, 2)
            continue
        if not missing:
            print(f"{path}: ok, every variable the entrypoints read is declared", file=out)
            continue
        status = max(status, 1)
        for service, names in missing.items():
            print(f"{path}: service {service} reads undeclared: {', '.join(names)}", file=out)
        print(f"  fix: {FIX}", file=out)
    return status


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="compose file(s) to check")


def run(args: argparse.Namespace) -> int:
    return check_files(args.files)
