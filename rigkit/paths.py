"""Where rigkit keeps things: one definition per path."""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = REPO_ROOT / "templates"
PROFILES_FILE = REPO_ROOT / "profiles.yaml"

# Lab state (containers, keys, loop images) and the build cache that outlives `lab down`.
LAB_DIR = Path(os.environ.get("RIGKIT_LAB_DIR", "/var/lib/rigkit-lab"))
LAB_STATE_FILE = LAB_DIR / "state.json"
CACHE_DIR = Path(os.environ.get("RIGKIT_CACHE_DIR", "/var/cache/rigkit"))

# On a rig: the compose project (compose.yml + .env) and rigkit's own state (ledger, helper scripts).
RIG_STACK_DIR = "/etc/rigkit/stack"
RIG_STATE_DIR = "/var/lib/rigkit"
# Each verified release's compose.yml + .env, by release hash: what a rollback restores exactly.
RIG_RELEASES_DIR = f"{RIG_STATE_DIR}/releases"
RIG_LIB_DIR = "/usr/local/lib/rigkit"
