"""Errors that name the field, the value and the fix.

They are pyinfra errors: pyinfra prints one as a single clean line (no traceback) when it stops a run.
"""

from pyinfra.api.exceptions import PyinfraError

# A value longer than this is shown cut, with its length: a 200,000-character value must not flood the log.
SHOWN_VALUE_CHARACTERS = 120


def escape_non_ascii(text: str) -> str:
    """``text`` with every non-ASCII character as a Python escape: a homoglyph (Cyrillic і in a name)
    then reads differently on screen from the name it imitates (``l1_s\\u0456ze_gb``)."""
    return text.encode("ascii", "backslashreplace").decode("ascii")


def shown_value(value) -> str:
    """``value`` as a message shows it: repr with non-ASCII escaped, long values cut."""
    text = ascii(value)
    if len(text) <= SHOWN_VALUE_CHARACTERS:
        return text
    length = f" ({len(value)} characters)" if isinstance(value, str) else ""
    return f"{text[:SHOWN_VALUE_CHARACTERS]}...{length}"


class RigkitError(PyinfraError):
    """A refusal a user can act on: what is wrong (field, value) and how to fix it."""

    def __init__(self, field: str, value, problem: str, fix: str):
        self.field = field
        self.value = value
        self.problem = problem
        self.fix = fix
        super().__init__(escape_non_ascii(f"{field}={shown_value(value)}: {problem}. Fix: {fix}"))


class ConfigError(RigkitError):
    """Bad input, detected before any host is touched."""


class PreflightError(RigkitError):
    """A host fact refuses the deploy (RAM, shm, disk, GPU memory, engine)."""
