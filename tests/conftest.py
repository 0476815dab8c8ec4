"""Shared test setup. Lab fixtures (real engine, registry, SSH rigs) live in tests/lab/conftest.py."""

import os
import sys
from pathlib import Path

import pytest
from hypothesis import Phase, settings
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.context import ctx_host, ctx_state

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

FIXTURES_DIR = REPO_ROOT / "tests" / "fixtures"
SHARED_NVIDIA_SMI = REPO_ROOT / "tests" / "fixtures" / "nvidia-smi"

# bench/mutation.py sets this: a mutant needs one failing example, and shrinking it took minutes per mutant
MUTATION_PROFILE_ENV = "RIGKIT_HYPOTHESIS_PROFILE"
settings.register_profile("mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate], database=None)
settings.load_profile(os.environ.get(MUTATION_PROFILE_ENV, "default"))


@pytest.fixture()
def local_host():
    """This machine as a pyinfra host (the local connector), for facts that run a real shell."""
    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    connect_all(state)
    local = inventory.get_host("@local")
    with ctx_state.use(state), ctx_host.use(local):
        yield local
