"""Shared test setup. Lab fixtures (real engine, registry, SSH rigs) live in tests/lab/conftest.py."""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

FIXTURES_DIR = REPO_ROOT / "tests" / "fixtures"
SHARED_NVIDIA_SMI = REPO_ROOT / "tests" / "fixtures" / "nvidia-smi"
