"""Layering: the rigkit package never imports roles/ (roles use rigkit, not the other way round), and the
files uploaded to the rig (rigkit/files) import the standard library only: the rig has no rigkit."""

import ast
import sys
from pathlib import Path

RIGKIT = Path(__file__).resolve().parents[1] / "rigkit"


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every module a file imports (relative imports count as rigkit's)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("rigkit" if node.level else node.module.split(".")[0])
    return names


def test_rigkit_never_imports_roles():
    offenders = [str(path.relative_to(RIGKIT.parent)) for path in sorted(RIGKIT.rglob("*.py"))
                 if "roles" in imported_modules(path)]
    assert offenders == []


def test_files_uploaded_to_the_rig_import_the_standard_library_only():
    uploaded = [path for path in sorted((RIGKIT / "files").glob("*.py")) if path.name != "__init__.py"]
    assert {path.name for path in uploaded} >= {"l2_janitor.py", "wait_ready.py"}
    # the router's launcher runs in the router's own venv (rigkit.router.ROUTER_PYTHON), next to vllm-router
    runs_in_a_venv = {"router_launch.py": {"vllm_router"}}
    for path in uploaded:
        allowed = set(sys.stdlib_module_names) | {"__future__"} | runs_in_a_venv.get(path.name, set())
        assert imported_modules(path) - allowed == set(), path.name
