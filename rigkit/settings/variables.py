"""Declared variables: every setting a user may put in host or group data.

Each role and the serving knob registry declare their settings with ``Variable``;
docs tables, data validation (unknown names get the closest valid name) and defaults
are all derived from those declarations, so a setting exists in exactly one place.

Values come from Python group data (typed as written: a trailing comma makes a tuple), from
inventories, and from pyinfra's ``--data k=v`` (which turns ``true``/``false`` into booleans, digits
into ints and any other JSON into its value: ``NaN`` into a float nan, ``{...}`` into a dict).
``Variable.coerce`` turns each into the declared type or refuses it naming the field.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from rigkit.errors import ConfigError, escape_non_ascii

# Longest text any string setting may hold. Names, paths, tokens and adapter JSON need far less; the bound
# keeps every value far below Linux's limit on one environment string (MAX_ARG_STRLEN, 128 KiB, even at 4
# bytes a character), over which the serving container cannot start.
MAX_TEXT_LENGTH = 4096

# How close an unknown name must be to a known one to be suggested (difflib ratio): one or two typos in a
# name score 0.8 or more; unrelated names sharing a few letters (validate_sessions, nvidia_ctk_version) 0.6.
SUGGESTION_CUTOFF = 0.75

# A number as text (ASCII digits only: int() and float() also take other scripts' digits and underscores).
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
_NUMBER_TEXT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
# What every printed or recorded place shows instead of a secret's value.
REDACTED = "<secret>"

_BOOLEAN_TEXT = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


class CredentialInValue(ValueError):
    """A check's refusal of a value holding a credential: the refusal then shows the value redacted."""


class Refusal(ValueError):
    """A check's refusal with its own fix: Variable.coerce shows it instead of the check's general ``fix`` (a check
    refusing for several reasons has one right fix per reason)."""

    def __init__(self, problem: str, fix: str):
        super().__init__(problem)
        self.fix = fix


class JsonObject(str):
    """Type of a setting holding a JSON object, kept as its text: given as text (kept exactly as written)
    or as a dict (what pyinfra's ``--data k='{...}'`` gives), which is written as compact JSON."""


class IntegerList(tuple):
    """Type of a setting holding integers: given as text ("2048,8192,32768"; blank for none), one integer, or a
    list; kept sorted, each once (a set of sizes: the order written means nothing)."""


TYPE_NAMES = {
    str: "text",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "a list",
    dict: "a mapping",
    JsonObject: "a JSON object",
    IntegerList: "integers separated by commas",
}


def _what(value: Any) -> str:
    """How a refusal names a value's Python type, with the usual reason for the surprising ones."""
    kind = type(value).__name__
    if isinstance(value, tuple):
        return "a tuple (a trailing comma in Python group data makes one)"
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def _finite(number: float) -> float:
    if not math.isfinite(number):
        raise ValueError(f"not a finite number ({number!r}): every gate compares against it")
    return number


def _number_text(text: str) -> float:
    """A number written as text; nan and inf are read (then refused as not finite, with that reason)."""
    text = text.strip()
    if _INTEGER_TEXT.fullmatch(text):
        return int(text)
    if _NUMBER_TEXT.fullmatch(text) or text.lower().lstrip("+-") in ("nan", "inf", "infinity"):
        return float(text)
    raise ValueError("not a number")


def _to_int(value: Any) -> int:
    if isinstance(value, str):
        value = _number_text(value)
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not _finite(value).is_integer():
            raise ValueError("a fraction: an integer setting is never rounded")
        return int(value)
    raise ValueError(f"expected an integer, got {_what(value)}")


def _to_float(value: Any) -> float:
    if isinstance(value, str):
        value = _number_text(value)
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    if isinstance(value, (int, float)):
        try:
            return _finite(float(value))
        except OverflowError:
            raise ValueError("too large for a number") from None
    raise ValueError(f"expected a number, got {_what(value)}")


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _BOOLEAN_TEXT:
        return _BOOLEAN_TEXT[value.strip().lower()]
    raise ValueError("not a boolean (true/false, yes/no, on/off or 1/0)")


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return str(value)
    # pyinfra's --data turns digits into an int (gpu_mask=0): the text it came from is the int's.
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, (bool, float)):
        raise ValueError(
            f"expected text, got {_what(value)} (on the command line write it as a JSON string: --data name='\"...\"')"
        )
    raise ValueError(f"expected text, got {_what(value)}")


def _reject_json_constant(name: str) -> None:
    raise ValueError(f"{name} is not a finite number and not JSON")


def _to_json_object(value: Any) -> str:
    if isinstance(value, dict):
        try:
            return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"cannot be written as JSON ({exc})") from None
    text = _to_text(value)
    try:
        parsed = json.loads(text, parse_constant=_reject_json_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})")
    if not isinstance(parsed, dict):
        raise ValueError(f"must be a JSON object ({{...}}), got {type(parsed).__name__}")
    return text


def _to_integer_list(value: Any) -> IntegerList:
    if isinstance(value, str):
        parts = [part.strip() for part in value.split(",")]
        if parts == [""]:
            return IntegerList()
        if "" in parts:
            raise ValueError("an empty item between commas")
        items = parts
    elif isinstance(value, int) and not isinstance(value, bool):
        items = [value]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise ValueError(f"expected integers separated by commas, got {_what(value)}")
    try:
        return IntegerList(sorted({_to_int(item) for item in items}))
    except ValueError as exc:
        raise ValueError(f"an item is not an integer ({exc})") from None


def _to_container(kind: type) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if not isinstance(value, kind):
            raise ValueError(f"expected {TYPE_NAMES[kind]}, got {_what(value)}")
        return value

    return convert


CONVERTERS: dict[type, Callable[[Any], Any]] = {
    str: _to_text,
    int: _to_int,
    float: _to_float,
    bool: _to_bool,
    JsonObject: _to_json_object,
    IntegerList: _to_integer_list,
    list: _to_container(list),
    dict: _to_container(dict),
}


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
    # Whether None is a legal value (derive it, or leave it unset: the doc says which); otherwise None is
    # refused. Not given: a None default declares None legal (role variables such as "None = newest").
    optional: Optional[bool] = None
    # "" is a legal value (the doc says what it means); otherwise blank text is refused.
    allow_empty: bool = False
    # A credential: never shown (refusals, diffs, status, cards, ledger, logs show REDACTED), kept off command
    # lines, read from the controller's environment (RIGKIT_<NAME>) when host data leaves it unset.
    secret: bool = False

    def shown(self, value: Any) -> Any:
        """``value`` as anything rigkit prints or records may show it."""
        return REDACTED if self.secret and value not in (None, "") else value

    def _fix(self, wanted: str) -> str:
        """What a refusal tells the user to write: the kind's own fix, else the type and an example."""
        fix = getattr(self.check, "fix", None)
        if fix:
            return fix
        example = "" if self.default in (None, "", [], {}) or self.secret else f", e.g. {self.default!r}"
        return f"set {self.name} to {wanted}{example}"

    @property
    def none_allowed(self) -> bool:
        return self.default is None if self.optional is None else self.optional

    def coerce(self, value: Any) -> Any:
        """Return the value converted to this variable's type, or raise ConfigError."""
        if value is None:
            if self.none_allowed:
                return None
            default = "" if self.default is None else f", or leave it out for the default {self.default!r}"
            raise ConfigError(
                self.name,
                None,
                "no value (None) given, and this setting is never derived",
                f"set {self.name} to {TYPE_NAMES.get(self.type, self.type.__name__)}{default}",
            )
        try:
            converted = CONVERTERS[self.type](value)
            if isinstance(converted, str):
                _check_text(converted, self.allow_empty)
        except ValueError as exc:
            raise ConfigError(
                self.name, self.shown(value), str(exc), self._fix(TYPE_NAMES.get(self.type, self.type.__name__))
            ) from None
        if self.check is not None:
            try:
                self.check(converted)
            except ValueError as exc:
                shown = REDACTED if isinstance(exc, CredentialInValue) else self.shown(value)
                fix = getattr(exc, "fix", None) or self._fix(TYPE_NAMES.get(self.type, self.type.__name__))
                raise ConfigError(self.name, shown, str(exc), fix) from None
        return converted


def _check_text(text: str, allow_empty: bool) -> None:
    if not allow_empty and not text.strip():
        raise ValueError("empty: this setting needs a value")
    if len(text) > MAX_TEXT_LENGTH:
        raise ValueError(f"{len(text)} characters, more than the {MAX_TEXT_LENGTH} any setting may hold")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("holds a lone surrogate, which no UTF-8 file can carry") from None


def one_of(choices: Iterable[str]) -> Callable[[Any], None]:
    """A Variable check accepting only ``choices``."""
    choices = tuple(choices)

    def check(value: Any) -> None:
        if value not in choices:
            near = closest_name(value, choices) if isinstance(value, str) else None
            raise ValueError(f"must be one of {', '.join(choices)}" + (f" (did you mean {near!r}?)" if near else ""))

    check.fix = f"write one of {', '.join(choices)}"
    return check


def check_of(problem: Callable[[Any], Optional[str]], fix: str = "") -> Callable[[Any], None]:
    """A Variable check (raises ValueError with the reason) from a function saying why a value is bad, or None."""

    def check(value: Any) -> None:
        reason = problem(value)
        if reason:
            raise ValueError(reason)

    check.__doc__ = f"Variable check: refuses what {problem.__name__} finds."
    check.fix = fix
    return check


def closest_name(name: str, candidates: Iterable[str]) -> Optional[str]:
    """The candidate ``name`` most likely misspells, or None when none is a real near-miss."""
    by_folded = {candidate.casefold(): candidate for candidate in candidates}
    matches = difflib.get_close_matches(name.casefold(), list(by_folded), n=1, cutoff=SUGGESTION_CUTOFF)
    return by_folded[matches[0]] if matches else None


def _non_ascii_note(name: str) -> str:
    """What a refusal says about the non-ASCII characters of a name (homoglyphs look like the real name)."""
    odd = [char for char in dict.fromkeys(name) if not char.isascii()]
    if not odd:
        return ""
    described = ", ".join(f"{escape_non_ascii(char)} ({unicodedata.name(char, 'unnamed')})" for char in odd)
    return f" (it contains the non-ASCII {described})"


def refuse_unknown(names: Iterable[str], known: Iterable[str], where: str) -> None:
    """Raise ConfigError for the first name not in ``known``, suggesting the closest valid one."""
    known = list(known)
    for name in names:
        if name not in known:
            suggestion = closest_name(name, known)
            fix = f"did you mean {suggestion!r}?" if suggestion else f"valid names: {', '.join(sorted(known))}"
            raise ConfigError(name, None, f"unknown setting in {where}{_non_ascii_note(name)}", fix)


def resolve(variables: Iterable[Variable], data: dict) -> dict:
    """Defaults overlaid with ``data`` (only declared names are read), each value coerced and checked."""
    return {v.name: v.coerce(data[v.name]) if v.name in data else v.default for v in variables}


def docs_table(variables: Iterable[Variable]) -> str:
    """A Markdown table of the variables, for docs/settings.md."""
    rows = ["| name | default | meaning |", "|---|---|---|"]
    for v in variables:
        default = "" if v.default is None else f"`{v.default!r}`"
        secret = "**secret** (never shown; from the controller's environment): " if v.secret else ""
        rows.append(f"| `{v.name}` | {default} | {secret}{v.doc} |")
    return "\n".join(rows)
