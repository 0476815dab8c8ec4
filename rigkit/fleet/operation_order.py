"""Each operation's place in a pyinfra CLI run, read from the frames themselves.

pyinfra orders a run's operations by the line numbers of the deploy code's call stack
(pyinfra/api/util.py ``get_operation_order_from_stack``, pyinfra 3.10). It reads them with
``inspect.stack()``, which also loads every frame's source line: ~2.7 ms an operation at a deploy's
depth, ~12 % of a no-op deploy's controller time. ``operation_order`` returns the same list from
``f_code.co_filename`` and ``f_lineno`` (what ``inspect.getframeinfo`` reports for a frame);
tests/fleet/test_operation_order.py holds it equal to pyinfra's own on the same stack.
"""

from __future__ import annotations

import importlib
import sys

import pyinfra
from pyinfra.api.state import State
from pyinfra.api.util import PYINFRA_INSTALL_DIR


def operation_order(state: State) -> list[int]:
    """pyinfra's operation order for the caller's stack: its line numbers from the deploy file down, outside pyinfra."""
    frames = []
    frame = sys._getframe(1)  # pyinfra's own stack() includes its frame, which its filter drops
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()  # outermost first
    first = 0
    if state.current_deploy_filename:
        # the first frame of the deploy file; none: pyinfra's loop ends on its own frame, which it drops
        first = next(
            (i for i, frame in enumerate(frames) if frame.f_code.co_filename == state.current_deploy_filename),
            len(frames),
        )
    line_numbers = [state.current_op_file_number] if pyinfra.is_cli else []
    line_numbers += [
        frame.f_lineno for frame in frames[first:] if not frame.f_code.co_filename.startswith(PYINFRA_INSTALL_DIR)
    ]
    return line_numbers


def install() -> None:
    """pyinfra's operations take their order from ``operation_order`` in this process (a deploy file calls this)."""
    # the module (``pyinfra.api.operation`` as an attribute is the decorator): it calls the name it imported
    importlib.import_module("pyinfra.api.operation").get_operation_order_from_stack = operation_order
