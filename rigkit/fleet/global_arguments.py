"""pyinfra's global arguments and their types, read once per process.

pyinfra 3.10 pops an operation's global arguments (``_sudo``, ``_env``...) with ``pop_global_arguments``, which
asks ``all_global_arguments()`` for their names and types, and that evaluates ``typing.get_type_hints`` of the
``AllArguments`` TypedDict anew at every operation and every fact read (pyinfra/api/arguments.py): on 4 lab rigs a
no-op's ~300 calls cost ~0.1 s of the controller's CPU under the profiler. The hints are those of one class
defined once at import: the list is the same at every call. tests/fleet/test_global_arguments.py holds it equal to
pyinfra's own.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

# pyinfra's own, kept before install() replaces it
_pyinfra_all_global_arguments = importlib.import_module("pyinfra.api.arguments").all_global_arguments


@lru_cache(maxsize=1)
def _global_arguments() -> tuple[tuple[str, type], ...]:
    return tuple(_pyinfra_all_global_arguments())


def all_global_arguments() -> list[tuple[str, type]]:
    """pyinfra's ``all_global_arguments()``, its type hints evaluated once (a new list each call, as pyinfra's)."""
    return list(_global_arguments())


def install() -> None:
    """pyinfra reads its global arguments from ``all_global_arguments`` above in this process (a deploy file calls
    this); both modules that call it by the name they imported."""
    for module in ("pyinfra.api.arguments", "pyinfra.api.facts"):
        importlib.import_module(module).all_global_arguments = all_global_arguments
