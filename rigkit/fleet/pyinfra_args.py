"""Running pyinfra: its executable, a run with its output streamed, and the arguments rigkit deploy passes
through, read and rewritten as pyinfra 3 reads them: --limit patterns (one per --limit) and --data KEY=VALUE
pairs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Sequence

from rigkit.errors import ConfigError
from rigkit.paths import REPO_ROOT


def pyinfra_executable() -> str:
    """The pyinfra installed beside this Python (the project's venv), else the one on PATH."""
    candidate = Path(sys.executable).with_name("pyinfra")
    return str(candidate if candidate.exists() else "pyinfra")


def rigkit_executable() -> str:
    """The rigkit command installed beside this Python (the project's venv), else the one on PATH."""
    candidate = Path(sys.executable).with_name("rigkit")
    return str(candidate if candidate.exists() else "rigkit")


def limit_from(pyinfra_args: Sequence[str]) -> list[str]:
    patterns: list[str] = []
    for i, arg in enumerate(pyinfra_args):
        if arg == "--limit" and i + 1 < len(pyinfra_args):
            patterns += pyinfra_args[i + 1].split(",")
        elif arg.startswith("--limit="):
            patterns += arg.split("=", 1)[1].split(",")
    return [p for p in patterns if p]


def split_limits(pyinfra_args: Sequence[str]) -> list[str]:
    """`--limit a,b` as `--limit a --limit b`: pyinfra 3 takes one pattern per --limit, and a comma
    list silently matches no host (the run then deploys nothing and exits 0)."""
    out: list[str] = []
    args = list(pyinfra_args)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--limit" and i + 1 < len(args):
            value, i = args[i + 1], i + 2
        elif arg.startswith("--limit="):
            value, i = arg.split("=", 1)[1], i + 1
        else:
            out.append(arg)
            i += 1
            continue
        for pattern in (p for p in value.split(",") if p):
            out += ["--limit", pattern]
    return out


def without_limits(pyinfra_args: Sequence[str]) -> list[str]:
    """The operator's pyinfra arguments minus --limit (each stage passes its own rigs)."""
    args, out = split_limits(pyinfra_args), []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--limit":
            skip = True
        else:
            out.append(arg)
    return out


def data_pairs(pyinfra_args: Sequence[str]) -> list[str]:
    """The KEY=VALUE of every --data, as pyinfra reads them."""
    pairs = []
    for i, arg in enumerate(pyinfra_args):
        if arg == "--data" and i + 1 < len(pyinfra_args):
            pairs.append(pyinfra_args[i + 1])
        elif arg.startswith("--data="):
            pairs.append(arg.split("=", 1)[1])
    return pairs


def check_data_pairs(pairs: Sequence[str]) -> None:
    """ConfigError for a --data that is not KEY=VALUE (pyinfra would stop on it after connecting)."""
    for pair in pairs:
        key, equals, _ = pair.partition("=")
        if not equals or not key:
            raise ConfigError("--data", pair, "is not KEY=VALUE", "write --data name=value, as pyinfra takes it")


def is_dry_run(pyinfra_args: Sequence[str]) -> bool:
    """pyinfra's --dry among the arguments: it connects and says what would change, and changes nothing."""
    return "--dry" in pyinfra_args


def pyinfra_command(pyinfra_args: Sequence[str], inventory: str, deploy: str) -> list[str]:
    """pyinfra on ``deploy`` without its confirmation prompt (-y), except for a dry run: pyinfra 3 skips its
    change detection under -y, so a dry run would show nothing (with --dry it exits before the prompt)."""
    confirm = [] if is_dry_run(pyinfra_args) else ["-y"]
    return [pyinfra_executable(), *confirm, *pyinfra_args, inventory, deploy]


def run_pyinfra_streaming(argv: list[str]) -> tuple[int, str]:
    """Run pyinfra, echoing its output as it comes, and return (exit status, the whole output)."""
    process = subprocess.Popen(
        argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    captured = []
    assert process.stdout is not None
    for line in process.stdout:
        sys.stdout.write(line)
        captured.append(line)
    return process.wait(), "".join(captured)
