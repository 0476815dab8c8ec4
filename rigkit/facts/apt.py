"""Facts about apt beyond pyinfra's deb facts."""

from __future__ import annotations

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

# db:Status-Abbrev is three characters: the selection ("h": hold), the package's state, its error flag
HOLDS_FIELDS = ("db:Status-Abbrev", "Package", "Architecture")


def dpkg_query(fields: tuple[str, ...]) -> str:
    """dpkg-query printing ``fields`` of every package dpkg knows, a line each, separated by "|"."""
    return "dpkg-query -W -f '" + "|".join(f"${{{field}}}" for field in fields) + "\\n' '*'"


_HOLDS_QUERY = dpkg_query(HOLDS_FIELDS)


class AptHeldPackages(FactBase):
    """Names of the packages `apt-mark hold` protects from upgrades, as `apt-mark showhold` names them.

    Read from dpkg's database, where apt-mark keeps a hold (the package's selection), with dpkg-query (~5 ms of
    a rig's CPU) rather than apt-mark, which loads apt's whole cache first (~12-19 ms). apt names a package of an
    architecture other than the native one (dpkg's own) ``name:arch``, as here. The rig prints only the held
    packages and dpkg itself; a database dpkg-query cannot read fails the read, as apt-mark's would."""

    default = set

    def requires_command(self, *args, **kwargs) -> str:
        return "dpkg-query"

    def command(self) -> str:
        return f"packages=$({_HOLDS_QUERY}) || exit 1; printf '%s\\n' \"$packages\" | awk -F'|' '$1 ~ /^h/ || $2 == \"dpkg\"'"

    def process(self, output: list[str]) -> set[str]:
        native, held = None, []
        for line in output:
            parts = line.strip("\n").split("|")
            if len(parts) != 3:
                continue
            status, name, arch = parts
            if name == "dpkg" and status[1:2] == "i":
                native = arch
            if status.startswith("h"):
                held.append((name, arch))
        if native is None:
            raise FactProcessError(f"dpkg-query named no installed dpkg (its output: {output[:3]})")
        return {name if arch in (native, "all") else f"{name}:{arch}" for name, arch in held}
