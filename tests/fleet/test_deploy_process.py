"""What a deploy file sets in pyinfra's process (rigkit.fleet.deploy_process)."""

import ast
import gc
import subprocess
import sys

from rigkit.fleet import deploy_process, global_arguments, operation_order
from rigkit.paths import REPO_ROOT
from roles import PIPELINE


def test_a_deploy_process_freezes_what_it_imported_and_installs_both(monkeypatch):
    installed = []
    monkeypatch.setattr(operation_order, "install", lambda: installed.append("operation_order"))
    monkeypatch.setattr(global_arguments, "install", lambda: installed.append("global_arguments"))
    try:
        deploy_process.install()
        assert gc.get_freeze_count() > 10_000  # pyinfra, pydantic and rigkit, imported by this test session
    finally:
        gc.unfreeze()
    assert installed == ["operation_order", "global_arguments"]


# What a release needs and a no-op does not: loaded when a smoke check or a metrics read runs.
RELEASE_ONLY = ("requests", "urllib3", "prometheus_client")


def test_a_rigs_deploy_imports_no_http_client_or_metrics_parser():
    """deploy.py's own imports and every role of a rig's pipeline, in a fresh interpreter (as pyinfra runs them):
    none of them loads requests or prometheus_client (~45 ms of every run's start, a no-op uses neither)."""
    tree = ast.parse((REPO_ROOT / "deploy.py").read_text())
    modules = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
    modules += [f"roles.{name}" for name in PIPELINE]
    script = f"import sys\nfor name in {modules!r}:\n    __import__(name)\nprint(sorted(set(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "roles.serving" in loaded
    assert [name for name in RELEASE_ONLY if f"'{name}'" in loaded] == []
