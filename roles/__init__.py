"""rigkit's pyinfra roles, one packaged deploy per concern.

Each role module ``roles/<name>.py`` exposes a ``@deploy`` function of the same name and
``VARIABLES`` (every setting it reads from host/group data, with its default).
"""

from __future__ import annotations

import importlib
from typing import Callable, Optional

# Module names in deploy order. rig_lock comes first: one deploy at a time per rig, facts read under the lock.
# preflight comes next: what the bare host refuses fails the rig before any role changes it.
PIPELINE = ["rig_lock", "preflight", "nvidia_driver", "docker", "nvidia_container_toolkit", "l2_disk", "serving"]


def load(name: str) -> Optional[Callable[[], None]]:
    """The deploy function of role ``name``, or None when that role module does not exist yet."""
    try:
        module = importlib.import_module(f"roles.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"roles.{name}":
            return None
        raise
    return getattr(module, name)
