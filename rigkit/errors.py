"""Errors that name the field, the value and the fix.

They are pyinfra errors: pyinfra prints one as a single clean line (no traceback) when it stops a run.
"""

from pyinfra.api.exceptions import PyinfraError


class RigkitError(PyinfraError):
    """A refusal a user can act on: what is wrong (field, value) and how to fix it."""

    def __init__(self, field: str, value, problem: str, fix: str):
        self.field = field
        self.value = value
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}={value!r}: {problem}. Fix: {fix}")


class ConfigError(RigkitError):
    """Bad input, detected before any host is touched."""


class PreflightError(RigkitError):
    """A host fact refuses the deploy (RAM, shm, disk, GPU memory, engine)."""
