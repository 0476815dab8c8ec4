"""Operations rigkit's roles need beyond pyinfra's own, one module per subject (as pyinfra.operations).

Each reads facts, compares with the wanted state and yields only the commands that close the
difference, so a host that is already right gets none and a ``host.noop`` line saying why. The
``*_verified`` operations are checks: they yield nothing, run only while executing (during prepare or
``--dry`` the thing they check may not be installed yet) and fail the host with a message naming what
was expected, what was found and the fix.

A refusal while the deploy runs fails its rig with one line, ``[rig] refused: field=value: problem. Fix:
fix``, and pyinfra's own ``Error: executed N commands``; no traceback. pyinfra 3 prints a traceback and
"Unexpected error in Python callback" for any exception a Python step raises
(pyinfra/api/operations.py, ``_run_host_op``), but a step that takes ``state`` and ``host`` is called
with them and its return value is the command's status: ``False`` fails the host quietly
(pyinfra/api/command.py, ``FunctionCommand.execute``). ``refuse`` and ``refusing_step`` are such steps.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

from pyinfra import logger
from pyinfra.api import OperationError
from pyinfra.api.host import Host
from pyinfra.context import ctx_config, ctx_host

from rigkit.errors import RigkitError

# How a refusal line starts in pyinfra's output, after the host's prefix (rigkit.fleet.outcome reads it back).
REFUSED_PREFIX = "refused: "

# A refusal naming several findings: each carries its own fix.
REFUSAL_FIX = "see each refusal's fix above"


def fail(field: str, value, problem: str, fix: str) -> OperationError:
    """An OperationError worded like every rigkit error: field, value, problem, fix."""
    return OperationError(str(RigkitError(field, value, problem, fix)))


def say(host: Host, message: str) -> None:
    """A line in the deploy output for this host, shown without -v (skips, notices)."""
    logger.info(f"{host.print_prefix}{message}")


def report_refusal(host: Host, error: RigkitError) -> None:
    """The one line a refused rig shows: field, value, problem and fix, in red."""
    host.log_styled(f"{REFUSED_PREFIX}{error}", fg="red", log_func=logger.error)


def refuse(state, host: Host, field: str, value, problem: str, fix: str) -> bool:
    """The Python step (``python.call``) that fails a rig with a refusal while the deploy runs."""
    report_refusal(host, RigkitError(field, value, problem, fix))
    return False


def refusing_step(function: Callable) -> Callable:
    """``function`` as a Python step whose RigkitError fails the rig with the refusal line (no traceback).

    Any other exception is a bug and keeps pyinfra's traceback. The step keeps ``function``'s name (the
    operation tests show a Python step by it) and runs with the host and config pyinfra would give it.
    """

    @functools.wraps(function)
    def step(state, host: Host, *args, **kwargs) -> bool:
        with ctx_config.use(state.config.copy()), ctx_host.use(host):
            try:
                function(*args, **kwargs)
            except RigkitError as error:
                report_refusal(host, error)
                return False
        return True

    return step


def refusal_of(findings: Sequence) -> dict:
    """``refuse``'s arguments for preflight findings (rigkit.preflight.Finding): one finding keeps its own
    field, value and fix; several are named together, each with its fix."""
    if len(findings) == 1:
        (only,) = findings
        return {"field": only.field, "value": only.value, "problem": f"{only.check}: {only.message}", "fix": only.fix}
    first = findings[0]
    return {
        "field": first.field,
        "value": first.value,
        "problem": "; ".join(str(f) for f in findings),
        "fix": REFUSAL_FIX,
    }
