"""What every provisioning role shares: host-wide data, settings lookup, the target OS.

``gpus`` is declared here, once: the GPU roles (nvidia_driver, nvidia_container_toolkit)
skip a host that declares no GPUs, and the serving role may read it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from pyinfra.api.host import Host
from pyinfra.facts.server import LinuxDistribution

from rigkit.errors import ConfigError
from rigkit.facts.batch import prepared_fact
from rigkit.variables import Variable, resolve


def _non_negative(value: int) -> None:
    if value < 0:
        raise ValueError("must be 0 or more")


GPUS = Variable("gpus", 0, "number of NVIDIA GPUs in the host; 0 skips the GPU roles (the lab)",
                int, _non_negative)

COMMON_VARIABLES: list[Variable] = [GPUS]


_MISSING = object()


def host_settings(variables: Iterable[Variable], host: Host) -> dict[str, Any]:
    """The declared variables resolved from the host's data (inventory, group_data), with defaults."""
    variables = list(variables)
    data = {}
    for variable in variables:
        value = host.data.get(variable.name, _MISSING)
        if value is not _MISSING:
            data[variable.name] = value
    return resolve(variables, data)


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


def target_os(host: Host, field: str) -> TargetOS:
    """The host's OS from /etc/os-release; ConfigError unless it is one rigkit supports."""
    meta = prepared_fact(host, LinuxDistribution)["release_meta"]
    os_id = str(meta.get("ID", "")).lower()
    version = str(meta.get("VERSION_ID", "")).strip('"')
    codename = str(meta.get("VERSION_CODENAME", "") or meta.get("UBUNTU_CODENAME", ""))
    if (os_id, version) not in SUPPORTED_OS:
        supported = ", ".join(f"{i} {v}" for i, v in sorted(SUPPORTED_OS))
        raise ConfigError(field, f"{os_id} {version}".strip() or "unknown OS",
                          "this role installs only on a supported OS",
                          f"run it on {supported}, or leave the host out of this role")
    return TargetOS(os_id, version, codename)


