"""Facts about apt beyond pyinfra's deb facts."""

from __future__ import annotations

from pyinfra.api import FactBase


class AptHeldPackages(FactBase):
    """Names of the packages `apt-mark hold` protects from upgrades."""

    default = set

    def requires_command(self, *args, **kwargs) -> str:
        return "apt-mark"

    def command(self) -> str:
        return "apt-mark showhold"

    def process(self, output: list[str]) -> set[str]:
        return {line.strip() for line in output if line.strip()}
