"""What a target cannot express, one setting at a time: refused, or carried out only when the user accepts it.

A gap names the setting, its value, what the target does instead and the fix. ``acceptable`` gaps leave a pod that
runs (without something rigkit does on a rig); the user accepts each by name (``rigkit export --accept SETTING``)
and the output says what was accepted. The others cannot be accepted: the pod would not be the stack the card
proved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from rigkit.errors import ConfigError


@dataclass(frozen=True)
class Gap:
    setting: str
    value: object
    problem: str  # what the target does instead
    fix: str
    acceptable: bool = True

    def error(self) -> ConfigError:
        fix = self.fix + (f"; or accept it: --accept {self.setting}" if self.acceptable else "")
        return ConfigError(self.setting, self.value, self.problem, fix)

    @property
    def accepted_line(self) -> str:
        return f"accepted {self.setting}={self.value!r}: {self.problem}"


def refuse_gaps(gaps: Iterable[Gap], accepted: Iterable[str]) -> list[Gap]:
    """The accepted gaps; ConfigError for the first one not accepted (or not acceptable), and for an --accept that
    names no gap of this export (it would hide a later one)."""
    gaps, accepted = list(gaps), set(accepted)
    for gap in gaps:
        if not gap.acceptable or gap.setting not in accepted:
            raise gap.error()
    unused = sorted(accepted - {gap.setting for gap in gaps})
    if unused:
        raise ConfigError(
            "--accept",
            unused[0],
            "names no setting this export cannot express",
            f"remove --accept {unused[0]}",
        )
    return gaps


def all_refusals(gaps: Iterable[Gap]) -> list[ConfigError]:
    """Every gap as its refusal (for a report listing them all at once)."""
    return [gap.error() for gap in gaps]
