"""apt: pinned packages, holds, a .deb from a URL, signed source lines."""

from __future__ import annotations

from typing import Iterable

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt, files

from rigkit.facts.apt import AptHeldPackages

# Where third-party apt signing keys go (referenced by `signed-by=` in each source list).
APT_KEYRINGS_DIR = "/etc/apt/keyrings"


def upstream_version(apt_version: str) -> str:
    """'1:580.95.05-0ubuntu1' -> '580.95.05': the part a tool like nvidia-smi reports."""
    without_epoch = apt_version.split(":", 1)[-1]
    return without_epoch.split("-", 1)[0]


def pinned(packages: Iterable[str], version: str | None) -> list[str]:
    """apt package specs, each pinned to ``version`` (``name=version``) when one is given."""
    return [f"{name}={version}" if version else name for name in packages]


def _spec_name(spec: str) -> str:
    return spec.split("=", 1)[0]


def packages_are(names: list[str], state: str) -> str:
    """'package a is <state>' or 'packages a, b are <state>', as pyinfra words its noop lines."""
    if len(names) == 1:
        return f"package {names[0]} is {state}"
    return f"packages {', '.join(names)} are {state}"


@operation()
def packages_installed(packages: list[str], no_recommends: bool = False):
    """
    Install apt packages (``name`` or ``name=version``); a held package may move when its pin does.

    + packages: package specs; a version pins the package to exactly that version
    + no_recommends: leave out what they only recommend (Debian's prometheus recommends a node exporter, which
      would listen on every address of the monitoring host)

    ``apt-get update`` runs only when something is about to be installed, so a host that
    already has the pinned packages runs nothing. Pins may move down as well as up.
    """
    installed = host.get_fact(DebPackages)
    missing = []
    for spec in packages:
        name, _, version = spec.partition("=")
        have = installed.get(name) or []
        if not have or (version and version not in have):
            missing.append(spec)
    if not missing:
        host.noop(packages_are(packages, "installed"))
        return
    yield StringCommand("apt-get", "update")
    yield from apt.packages._inner(
        packages=packages,
        no_recommends=no_recommends,
        allow_downgrades=True,
        extra_install_args="--allow-change-held-packages",
    )


@operation()
def packages_held(packages: list[str]):
    """
    ``apt-mark hold`` the packages, so an unattended upgrade cannot move them.

    + packages: package names or specs (a ``=version`` suffix is ignored)
    """
    held = host.get_fact(AptHeldPackages)
    names = [_spec_name(spec) for spec in packages]
    to_hold = [name for name in names if name not in held]
    if not to_hold:
        host.noop(packages_are(names, "held"))
        return
    yield StringCommand("apt-mark", "hold", *(QuoteString(name) for name in to_hold))


@operation()
def deb_from_url(package: str, url: str):
    """
    Install a .deb downloaded from ``url`` unless ``package`` is already installed.

    + package: the package the .deb provides (e.g. cuda-keyring)
    + url: where the .deb is
    """
    if package in host.get_fact(DebPackages):
        host.noop(f"package {package} is installed")
        return
    local = f"/tmp/rigkit-{package}.deb"
    yield from files.download._inner(src=url, dest=local)
    yield StringCommand("dpkg", "-i", QuoteString(local))
    yield StringCommand("rm", "-f", QuoteString(local))


def apt_source_line(url: str, suite: str, components: str, keyring: str, arch: str) -> str:
    """One deb822-free source line, signed by its own keyring."""
    parts = ["deb", f"[arch={arch} signed-by={keyring}]", url, suite]
    if components:
        parts.append(components)
    return " ".join(parts) + "\n"
