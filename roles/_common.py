"""What every provisioning role shares: host-wide data, settings lookup, the target OS.

``gpus`` is declared here, once: the GPU roles (nvidia_driver, nvidia_container_toolkit)
skip a host that declares no GPUs, and the serving role may read it too.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Iterable

from pyinfra import logger
from pyinfra.api.host import Host
from pyinfra.context import ContextObject
from pyinfra.facts.server import LinuxDistribution

from rigkit.errors import ConfigError
from rigkit.variables import Variable, resolve
from roles.host_facts import FactBatch, FactSpec


def _non_negative(value: int) -> None:
    if value < 0:
        raise ValueError("must be 0 or more")


GPUS = Variable("gpus", 0, "number of NVIDIA GPUs in the host; 0 skips the GPU roles (the lab)",
                int, _non_negative)

COMMON_VARIABLES: list[Variable] = [GPUS]

# Where third-party apt signing keys go (referenced by `signed-by=` in each source list).
APT_KEYRINGS_DIR = "/etc/apt/keyrings"


_MISSING = object()

# Facts read while the deploy is prepared, per host: {FactSpec: value}. pyinfra 3 reads a fact anew on every
# get_fact; no operation runs before execution starts, so what the roles read until then cannot change.
_PREPARED: "weakref.WeakKeyDictionary[Host, dict[FactSpec, Any]]" = weakref.WeakKeyDictionary()


def _preparing(host: Host) -> bool:
    return not host.state.is_executing


def _facts_known(host: Host) -> dict[FactSpec, Any]:
    # the roles' ``host`` is pyinfra's context proxy (one object for every host): key by the host it points at
    real = host._get_module() if isinstance(host, ContextObject) else host
    return _PREPARED.setdefault(real, {})


def facts_now(host: Host, specs: Iterable[FactSpec]) -> dict[FactSpec, Any]:
    """Each fact as ``host.get_fact`` reads it now (never from memory), several in one round trip."""
    specs = tuple(dict.fromkeys(specs))
    values = dict(host.get_fact(FactBatch, facts=specs) or {}) if len(specs) > 1 else {}
    for spec in specs:
        if spec not in values:  # a batch that failed as a whole: read each on its own
            values[spec] = host.get_fact(spec.fact, **dict(spec.kwargs))
    return values


def prepare_facts(host: Host, specs: Iterable[FactSpec]) -> None:
    """Read, in one round trip, facts the roles read while the deploy is prepared (see prepared_fact).

    Read-only commands only: one read ahead that a role then does not need costs just its command on the
    rig. Facts already read this run are skipped; while executing this does nothing.
    """
    if not _preparing(host):
        return
    known = _facts_known(host)
    known.update(facts_now(host, [spec for spec in specs if spec not in known]))


def prepared_fact(host: Host, fact: type, **kwargs: Any) -> Any:
    """``host.get_fact(fact, **kwargs)``, read at most once per host while the deploy is prepared.

    For facts the roles read before any operation ran (their preflights and plans). While executing
    (an operation's own facts, a deploy added during execution) every call reads the host anew: an
    earlier operation may have changed it (e.g. installed the engine).
    """
    if not _preparing(host):
        return host.get_fact(fact, **kwargs)
    known = _facts_known(host)
    spec = FactSpec.of(fact, **kwargs)
    if spec not in known:
        known[spec] = host.get_fact(fact, **kwargs)
    return known[spec]


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


def upstream_version(apt_version: str) -> str:
    """'1:580.95.05-0ubuntu1' -> '580.95.05': the part a tool like nvidia-smi reports."""
    without_epoch = apt_version.split(":", 1)[-1]
    return without_epoch.split("-", 1)[0]


def pinned(packages: Iterable[str], version: str | None) -> list[str]:
    """apt package specs, each pinned to ``version`` (``name=version``) when one is given."""
    return [f"{name}={version}" if version else name for name in packages]


def say(host: Host, message: str) -> None:
    """A line in the deploy output for this host, shown without -v (skips, notices)."""
    logger.info(f"{host.print_prefix}{message}")
