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


SUPPORTED_OS = {("ubuntu", "22.04"), ("ubuntu", "24.04"), ("debian", "12")}


def target_os(meta: dict[str, str], field: str) -> TargetOS:
    """The OS of /etc/os-release (``meta``: RigState.os_release); ConfigError unless rigkit supports it."""
    os_id = str(meta.get("ID", "")).lower()
    version = str(meta.get("VERSION_ID", "")).strip('"')
    codename = str(meta.get("VERSION_CODENAME", "") or meta.get("UBUNTU_CODENAME", ""))
    if (os_id, version) not in SUPPORTED_OS:
        supported = ", ".join(f"{i} {v}" for i, v in sorted(SUPPORTED_OS))
        raise ConfigError(field, f"{os_id} {version}".strip() or "unknown OS",
                          "this role installs only on a supported OS",
                          f"run it on {supported}, or leave the host out of this role")
    return TargetOS(os_id, version, codename)


