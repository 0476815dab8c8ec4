"""What a package defines, by subject: the names the case folders of tests/operations and tests/facts carry."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Callable


def defined_by_subject(package: ModuleType, wanted: Callable[[object], bool]) -> set[str]:
    """Each value defined (not imported) in a module of ``package`` that ``wanted`` accepts, as
    "<module>.<name>" (e.g. "disk.fstab_entry")."""
    found = set()
    for module_info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{module_info.name}")
        for name, value in vars(module).items():
            if getattr(value, "__module__", None) == module.__name__ and wanted(value):
                found.add(f"{module_info.name}.{name}")
    return found
