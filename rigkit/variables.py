"""Declared variables: every setting a user may put in host or group data.

Each role and the serving knob registry declare their settings with ``Variable``;
docs tables, data validation (unknown names get the closest valid name) and defaults
are all derived from those declarations, so a setting exists in exactly one place.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from rigkit.errors import ConfigError


@dataclass(frozen=True)
class Variable:
    name: str
    default: Any
    doc: str
    type: type = str
    # Optional extra check: raise ValueError(message-with-fix) on a bad value.
    check: Optional[Callable[[Any], None]] = field(default=None, compare=False)
    # Environment variable name inside the serving container, for serving knobs.
    env: Optional[str] = None

    def coerce(self, value: Any) -> Any:
        """Return the value converted to this variable's type, or raise ConfigError."""
        if value is None:
            return None
        try:
            if self.type is bool and isinstance(value, str):
                lowered = value.strip().lower()
                if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError(f"not a boolean: {value!r}")
                converted = lowered in ("1", "true", "yes", "on")
            elif self.type is bool:
                if not isinstance(value, (bool, int)):
                    raise ValueError(f"not a boolean: {value!r}")
                converted = bool(value)
            elif self.type in (int, float) and isinstance(value, bool):
                raise ValueError(f"expected a number, got a boolean {value!r}")
            elif self.type in (list, dict):
                if not isinstance(value, self.type):
                    raise ValueError(f"expected a {self.type.__name__}, got {type(value).__name__}")
                converted = value
            else:
                converted = self.type(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(self.name, value, f"expected {self.type.__name__} ({exc})",
                              f"set {self.name} to a {self.type.__name__}; {self.doc}") from None
        if self.check is not None:
            try:
                self.check(converted)
            except ValueError as exc:
                raise ConfigError(self.name, value, str(exc), f"{self.doc}") from None
        return converted


def closest_name(name: str, candidates: Iterable[str]) -> Optional[str]:
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.5)
    return matches[0] if matches else None


def refuse_unknown(names: Iterable[str], known: Iterable[str], where: str) -> None:
    """Raise ConfigError for the first name not in ``known``, suggesting the closest valid one."""
    known = list(known)
    for name in names:
        if name not in known:
            suggestion = closest_name(name, known)
            fix = f"did you mean {suggestion!r}?" if suggestion else f"valid names: {', '.join(sorted(known))}"
            raise ConfigError(name, None, f"unknown setting in {where}", fix)


def resolve(variables: Iterable[Variable], data: dict) -> dict:
    """Defaults overlaid with ``data`` (only declared names are read), each value coerced and checked."""
    return {v.name: v.coerce(data[v.name]) if v.name in data else v.default for v in variables}


def docs_table(variables: Iterable[Variable]) -> str:
    """A Markdown table of the variables, for the README."""
    rows = ["| name | default | meaning |", "|---|---|---|"]
    for v in variables:
        default = "" if v.default is None else f"`{v.default!r}`"
        rows.append(f"| `{v.name}` | {default} | {v.doc} |")
    return "\n".join(rows)
