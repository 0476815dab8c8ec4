"""Operations rigkit's roles need beyond pyinfra's own, one module per subject (as pyinfra.operations).

Each reads facts, compares with the wanted state and yields only the commands that close the
difference, so a host that is already right gets none and a ``host.noop`` line saying why. The
``*_verified`` operations are checks: they yield nothing, run only while executing (during prepare or
``--dry`` the thing they check may not be installed yet) and fail the host with a message naming what
was expected, what was found and the fix.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api import OperationError
from pyinfra.api.host import Host

from rigkit.errors import PreflightError, RigkitError


def fail(field: str, value, problem: str, fix: str) -> OperationError:
    """An OperationError worded like every rigkit error: field, value, problem, fix."""
    return OperationError(str(RigkitError(field, value, problem, fix)))


def say(host: Host, message: str) -> None:
    """A line in the deploy output for this host, shown without -v (skips, notices)."""
    logger.info(f"{host.print_prefix}{message}")


# A refusal naming several findings: each carries its own fix.
REFUSAL_FIX = "see each refusal's fix above"


def refuse(field: str, value, problem: str, fix: str) -> None:
    """The Python step (``python.call``) that fails a rig with a refusal while the deploy runs."""
    raise PreflightError(field, value, problem, fix)
