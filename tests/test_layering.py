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
    offenders = [
        str(path.relative_to(RIGKIT.parent))
        for path in sorted(RIGKIT.rglob("*.py"))
        if "roles" in imported_modules(path)
    ]
    assert offenders == []


def test_files_uploaded_to_the_rig_import_the_standard_library_only():
    uploaded = [path for path in sorted((RIGKIT / "files").glob("*.py")) if path.name != "__init__.py"]
    assert {path.name for path in uploaded} >= {"l2_janitor.py", "wait_ready.py"}
    # the router's launcher runs in the router's own venv (rigkit.router.ROUTER_PYTHON), next to vllm-router
    runs_in_a_venv = {"router_launch.py": {"vllm_router"}}
    for path in uploaded:
        allowed = set(sys.stdlib_module_names) | {"__future__"} | runs_in_a_venv.get(path.name, set())
        assert imported_modules(path) - allowed == set(), path.name


# --- the packages' order: commands on top, rollouts and status above what they use, ground below all ---------------

# Each layer may import its own and the layers below it, never one above. The middle layer's packages (settings,
# serving, remote, fleet, validation, model and the host subjects: disk, firewall, router, ...) still lean on each
# other at package level; among modules there is no circle (test_no_import_circles).
GROUND = {"errors", "systemd", "distro", "nvidia_smi", "files"}
UPPER = {"rollout", "status"}
TOP = {"commands", "lab", "cli"}
# Imports inside a function, each with the reason it is not at the top of its module.
LOCAL_IMPORTS = {
    ("rigkit/lab/cli.py", "rigkit.lab.serving_image"): "optional: a lab without the serving image's build inputs "
    "still comes up (the tests that need the image fail alone)",
    ("rigkit/remote/registry.py", "rigkit.remote.http_session"): "requests loads only when a registry is asked: "
    "every deploy parses image references through this module (~35 ms of its start)",
    ("rigkit/serving/smoke.py", "rigkit.remote.http_session"): "requests loads only when a smoke check runs: every "
    "deploy imports the smoke for its release, and a no-op runs none (~30 ms of its start)",
}


def layer(subject: str) -> int:
    return 0 if subject in GROUND else 3 if subject in TOP else 2 if subject in UPPER else 1


def subject(module: str) -> str:
    """rigkit.<subject>[.rest] -> subject (a package or a top-level module)."""
    return module.split(".")[1] if module.count(".") else module


def rigkit_imports(path: Path) -> list[tuple[str, bool]]:
    """(module imported, imported inside a function) for each rigkit import of a file."""
    tree = ast.parse(path.read_text(), str(path))
    in_functions = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for inner in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rigkit"):
            names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "rigkit" else [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("rigkit")]
        else:
            continue
        found += [(name, id(node) in in_functions) for name in names]
    return found


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(RIGKIT.parent).with_suffix("").parts).removesuffix(".__init__")


def test_no_layer_imports_one_above_it():
    offenders = []
    for path in sorted(RIGKIT.rglob("*.py")):
        own = subject(module_name(path))
        for imported, _ in rigkit_imports(path):
            if imported != "rigkit" and layer(subject(imported)) > layer(own):
                offenders.append(f"{path.relative_to(RIGKIT.parent)} imports {imported}")
    assert offenders == []


def test_no_import_circles():
    modules = {module_name(path): path for path in RIGKIT.rglob("*.py")}

    def owner(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {
        name: {owner(imported) for imported, _ in rigkit_imports(path)} - {name, "rigkit"}
        for name, path in modules.items()
    }
    circles, done = [], set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            circles.append(trail[trail.index(name) :] + [name])
            return
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, trail + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert circles == []


def test_project_imports_sit_at_the_top_of_their_module_or_say_why_not():
    local = {
        (str(path.relative_to(RIGKIT.parent)), imported)
        for path in sorted(RIGKIT.rglob("*.py"))
        for imported, inside in rigkit_imports(path)
        if inside
    }
    assert local == set(LOCAL_IMPORTS)
