"""The unit tests' real binaries (nft, redis-server, redis-cli), unpacked from Debian's packages with
``dpkg-deb -x`` into CACHE_DIR/test-tools/<key of its inputs>, never installed: installing nftables or
redis-server on the controller would enable their services for its next boot (nftables.service flushes the
ruleset, a redis server would run). bin/setup builds the tree (``python -m rigkit.lab.unpacked_tools``);
tests/test_firewall.py and tests/test_kv_store.py find its wrappers with ``unpacked_tool`` after their
$RIGKIT_TEST_* variables and PATH."""

from __future__ import annotations

import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from rigkit.lab.proc import LabStepError, Progress, run
from rigkit.lab.serving_image import input_hash
from rigkit.paths import CACHE_DIR

TEST_TOOLS_ROOT = CACHE_DIR / "test-tools"
# The tools' packages and the libraries they link that a Debian 12 controller lacks (the build's ldd check
# names any other missing one).
TOOL_PACKAGES = ("nftables", "libnftables1", "libnftnl11", "redis-server", "redis-tools", "libjemalloc2", "liblzf1")
# wrapper name -> the program inside the unpacked tree
TOOLS = {"nft": "usr/sbin/nft", "redis-server": "usr/bin/redis-server", "redis-cli": "usr/bin/redis-cli"}
# Where apt keeps the .debs it fetched: reused when they hold the candidate version.
APT_ARCHIVES = Path("/var/cache/apt/archives")
WRAPPER = """#!/bin/sh
# {program} unpacked from its Debian package (dpkg-deb -x), not installed: for rigkit's unit tests
root=$(dirname "$(dirname "$(readlink -f "$0")")")/root
LD_LIBRARY_PATH={lib_path} exec "$root/{program}" "$@"
"""
COMPLETE_MARKER = ".complete"
APT_TIMEOUT_S = 300


def _os_release_codename() -> str:
    try:
        lines = Path("/etc/os-release").read_text().splitlines()
    except OSError:
        return "unknown"
    values = dict(line.split("=", 1) for line in lines if "=" in line)
    return values.get("VERSION_CODENAME", "unknown").strip('"')


def tools_key() -> str:
    """The tree's key: the packages, the wrappers and the machine's Debian release and CPU (no apt needed,
    so the tests compute it in an instant)."""
    return input_hash("test-tools", TOOL_PACKAGES, TOOLS, WRAPPER, _os_release_codename(), platform.machine())


def tools_dir() -> Path:
    return TEST_TOOLS_ROOT / tools_key()


def unpacked_tool(name: str) -> str | None:
    """The wrapper for NAME (a key of TOOLS) in a completed tree, or None when bin/setup has not built it."""
    directory = tools_dir()
    wrapper = directory / "bin" / name
    if (directory / COMPLETE_MARKER).exists() and wrapper.exists():
        return str(wrapper)
    return None


def _candidate_versions() -> dict[str, str]:
    """Each package's candidate version from apt's lists ({} for a package the lists do not hold)."""
    result = run(
        ["apt-cache", "show", "--no-all-versions", *TOOL_PACKAGES],
        "test tools: apt-cache show",
        "run apt-get update",
        check=False,
        timeout=APT_TIMEOUT_S,
    )
    versions, package = {}, None
    for line in result.stdout.splitlines():
        if line.startswith("Package: "):
            package = line.split(": ", 1)[1]
        elif line.startswith("Version: ") and package:
            versions[package] = line.split(": ", 1)[1]
    return versions


def _archived_deb(package: str, version: str, arch: str) -> Path | None:
    for candidate_arch in (arch, "all"):
        path = APT_ARCHIVES / f"{package}_{version.replace(':', '%3a')}_{candidate_arch}.deb"
        if path.is_file():
            return path
    return None


def _fetch_debs(into: Path) -> list[Path]:
    """Every package's .deb in INTO: copied from apt's archives when the candidate is there, else downloaded."""
    versions = _candidate_versions()
    if set(versions) != set(TOOL_PACKAGES):
        # a fresh machine's apt has no lists yet
        run(
            ["apt-get", "update", "-qq"],
            "test tools: apt-get update",
            "apt must reach Debian's package archive",
            timeout=APT_TIMEOUT_S,
        )
        versions = _candidate_versions()
    arch = run(["dpkg", "--print-architecture"], "test tools: dpkg", "run on Debian or Ubuntu").stdout.strip()
    to_download = []
    for package in TOOL_PACKAGES:
        archived = _archived_deb(package, versions.get(package, ""), arch) if package in versions else None
        if archived:
            shutil.copy2(archived, into)
        else:
            to_download.append(package)
    if to_download:
        # apt-get download fetches as the _apt user: it must be able to write INTO
        into.chmod(0o777)
        fix = f"apt must reach Debian's package archive and know {' '.join(to_download)}"
        result = subprocess.run(
            ["apt-get", "download", "-qq", *to_download],
            cwd=into,
            capture_output=True,
            text=True,
            timeout=APT_TIMEOUT_S,
        )
        if result.returncode != 0:
            tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-5:])
            raise LabStepError(
                "test tools: apt-get download", " ".join(to_download), f"exit {result.returncode}: {tail}", fix
            )
    return sorted(into.glob("*.deb"))


def _lib_dirs(root: Path) -> list[str]:
    """The tree's directories holding shared libraries, relative to ROOT."""
    return sorted({str(lib.parent.relative_to(root)) for lib in root.rglob("*.so*") if lib.is_file()})


def _write_wrappers(target: Path) -> None:
    root = target / "root"
    lib_path = ":".join(f'"$root/{lib_dir}"' for lib_dir in _lib_dirs(root))
    (target / "bin").mkdir()
    for name, program in TOOLS.items():
        if not (root / program).exists():
            raise LabStepError(
                "test tools: unpack",
                program,
                "not in the unpacked packages",
                f"add the package holding it to TOOL_PACKAGES in {__name__}",
            )
        wrapper = target / "bin" / name
        wrapper.write_text(WRAPPER.format(program=program, lib_path=lib_path))
        wrapper.chmod(0o755)


def _check_links(target: Path) -> None:
    """Every tool finds all its shared libraries (a library this machine lacks needs its package listed)."""
    root = target / "root"
    lib_path = ":".join(str(root / lib_dir) for lib_dir in _lib_dirs(root))
    for name, program in TOOLS.items():
        linked = subprocess.run(
            ["ldd", str(root / program)],
            capture_output=True,
            text=True,
            env={"LD_LIBRARY_PATH": lib_path, "PATH": "/usr/bin:/bin"},
        )
        missing = [line.split()[0] for line in linked.stdout.splitlines() if "not found" in line]
        if missing:
            raise LabStepError(
                "test tools: ldd",
                name,
                f"needs {', '.join(missing)}, not on this machine",
                f"add the package holding it to TOOL_PACKAGES in {__name__}",
            )


def ensure_unpacked_tools(progress: Progress) -> Path:
    """The unpacked tree with its wrappers in bin/, built once per key; a completed tree is left as it is."""
    target = tools_dir()
    if (target / COMPLETE_MARKER).exists():
        return target
    started = time.monotonic()
    progress(f"unpacking {', '.join(TOOLS)} from {len(TOOL_PACKAGES)} Debian packages (not installed) into {target}")
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "root").mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="rigkit-test-tools-") as debs:
        packages = _fetch_debs(Path(debs))
        for deb in packages:
            run(
                ["dpkg-deb", "-x", str(deb), str(partial / "root")],
                "test tools: dpkg-deb -x",
                f"{deb.name} must be a complete .deb",
                timeout=APT_TIMEOUT_S,
            )
        names = "\n".join(deb.name for deb in packages)
    _write_wrappers(partial)
    _check_links(partial)
    (partial / COMPLETE_MARKER).write_text(f"{names}\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    progress(f"test tools ready in {time.monotonic() - started:.0f} s: {target}/bin")
    return target


def main() -> int:
    try:
        ensure_unpacked_tools(lambda message: print(f"bin/setup: {message}", flush=True))
    except LabStepError as exc:
        print(f"bin/setup: {exc}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
