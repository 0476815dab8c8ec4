"""The distributions rigkit's roles install for."""

from __future__ import annotations

from dataclasses import dataclass

from rigkit.errors import ConfigError


@dataclass(frozen=True)
class TargetOS:
    """The distribution a role installs for: "ubuntu" or "debian", its version and codename."""

    id: str
    version: str
    codename: str

    @property
    def label(self) -> str:
        return f"{self.id} {self.version}"


SUPPORTED_OS = frozenset({("ubuntu", "22.04"), ("ubuntu", "24.04"), ("debian", "12")})
# Debian 13 (trixie): docker.io 26.1 with compose v2 and the CLI split into docker-cli. The docker role
# installs there; the NVIDIA roles have not been run on it (no GPU rig on Debian 13 yet).
DOCKER_SUPPORTED_OS = SUPPORTED_OS | {("debian", "13")}


def target_os(meta: dict[str, str], field: str, supported: frozenset = SUPPORTED_OS) -> TargetOS:
    """The OS of /etc/os-release (``meta``: RigState.os_release); ConfigError unless the role supports it."""
    os_id = str(meta.get("ID", "")).lower()
    version = str(meta.get("VERSION_ID", "")).strip('"')
    codename = str(meta.get("VERSION_CODENAME", "") or meta.get("UBUNTU_CODENAME", ""))
    if (os_id, version) not in supported:
        names = ", ".join(f"{i} {v}" for i, v in sorted(supported))
        raise ConfigError(
            field,
            f"{os_id} {version}".strip() or "unknown OS",
            "this role installs only on a supported OS",
            f"run it on {names}, or leave the host out of this role",
        )
    return TargetOS(os_id, version, codename)
