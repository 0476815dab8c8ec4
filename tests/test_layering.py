"""Layering: the rigkit package never imports roles/ (roles use rigkit, not the other way round), and the
files uploaded to the rig (rigkit/files) import the standard library only: the rig has no rigkit."""

import ast
import re
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


# --- the floors: each rigkit package or top-level module stands on one, and imports only from its own or lower ----------

# Lowest first; the same list, one line a floor, is docs/concepts.md's "Where things live".
FLOORS = [
    (
        "ground: errors, paths, systemd unit text, the rig-side files, readers of nvidia-smi and /metrics, the prompts",
        {"errors", "paths", "systemd", "distro", "nvidia_smi", "files", "metrics", "prompts"},
    ),
    (
        "the transport to a rig: SSH tunnels, the image registry, the serving API's client and its TTFT probe",
        {"remote"},
    ),
    ("the settings registry: every setting, its kind and every check of it", {"settings"}),
    (
        "a rig's subjects, each from its settings to its files and commands",
        {"disk", "firewall", "kv_store", "kv_share", "router", "listeners"},
    ),
    ("reading a rig: pyinfra facts, the survey, the preflights", {"facts", "survey", "preflight"}),
    (
        "the stack: compose and its release, its Kubernetes export, the model's store, pyinfra operations",
        {"serving", "export", "model", "operations"},
    ),
    ("the fleet: inventory, deploy over every rig, model staging", {"fleet"}),
    ("proof and watch: cache validation, the L2 report, monitoring", {"validation", "l2_state", "monitoring"}),
    ("over the fleet: rollouts and status", {"rollout", "status"}),
    ("commands: the CLI, its commands and the lab", {"commands", "lab", "cli"}),
]
FLOOR = {unit: level for level, (_, units) in enumerate(FLOORS) for unit in units}
# Imports inside a function, each with the reason it is not at the top of its module.
LOCAL_IMPORTS = {
    ("rigkit/lab/cli.py", "rigkit.lab.serving_image"): "optional: a lab without the serving image's build inputs "
    "still comes up (the tests that need the image fail alone)",
    ("rigkit/remote/registry.py", "rigkit.remote.http_session"): "requests loads only when a registry is asked: "
    "every deploy parses image references through this module (~35 ms of its start)",
    ("rigkit/serving/smoke.py", "rigkit.remote.http_session"): "requests loads only when a smoke check runs: every "
    "deploy imports the smoke for its release, and a no-op runs none (~30 ms of its start)",
}


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


def units() -> set[str]:
    """rigkit's packages and top-level modules."""
    return {path.stem if path.is_file() else path.name for path in RIGKIT.iterdir()} - {"__init__", "__pycache__"}


def unit_imports() -> dict[tuple[str, str], str]:
    """(importer, imported) -> one example, for every import between two units (imports in functions too)."""
    found = {}
    for path in sorted(RIGKIT.rglob("*.py")):
        own = subject(module_name(path))
        for imported, _ in rigkit_imports(path):
            if imported != "rigkit" and subject(imported) != own:
                found.setdefault((own, subject(imported)), f"{path.relative_to(RIGKIT.parent)} imports {imported}")
    return found


def test_every_package_stands_on_one_floor():
    assert units() - {"rigkit"} == set(FLOOR), "place each package or top-level module on one floor of FLOORS"
    assert sum(len(floor) for _, floor in FLOORS) == len(FLOOR)


def test_no_floor_imports_one_above_it():
    offenders = [example for (own, imported), example in unit_imports().items() if FLOOR[imported] > FLOOR[own]]
    assert offenders == []


def test_no_two_packages_import_each_other():
    edges = unit_imports()
    pairs = [f"{edges[a, b]} | {edges[b, a]}" for a, b in sorted(edges) if a < b and (b, a) in edges]
    assert pairs == []


def test_the_floors_are_written_down_once_in_the_concepts():
    text = (RIGKIT.parent / "docs" / "concepts.md").read_text()
    listed = [line for line in text.splitlines() if re.match(r"\d+\. `", line)]
    expected = [
        f"{number}. {', '.join(f'`{unit}`' for unit in sorted(units))} — {what}"
        for number, (what, units) in enumerate(FLOORS, 1)
    ]
    assert listed == expected


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
