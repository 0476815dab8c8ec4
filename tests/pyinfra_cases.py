"""The case runner of the role and operation tests: facts in, commands out.

One JSON file per case, one folder per role (``tests/roles/<role>/``, which runs the role's
deploy) or per operation (``tests/operations/<subject>.<name>/``, as pyinfra keeps
``tests/operations/apt.packages/``, which runs
``rigkit.operations.<subject>.<name>`` with the case's ``kwargs``: a function argument is given as
{"returns": value}, a function that returns value whatever it is passed; an operation's ``settings``
is the stack's Settings built from the case's ``data``); ``tests/roles/pipeline/`` runs the
case's ``roles`` in order on one host, as deploy.py does. Adding a case is adding a file.

A case holds:
- ``data``: host data (inventory/group_data values); ``os``: "ubuntu-22.04" | "ubuntu-24.04" |
  "debian-12" (sets the distribution fact); ``kwargs``: arguments of the role's deploy function
  (serving: ``kind``, ``image_override``, ``restore_rendering`` as rollback.py passes them);
- ``facts``: fact values by name (``deb.DebPackages``, ``rigkit.facts.nvidia.NvidiaModuleVersion``), or by
  ``name:argument`` for a fact read with an argument (``rigkit.facts.disk.BlockDeviceProbe:/dev/loop7``);
  a FactBatch (several facts in one round trip) is answered fact by fact from the same values;
  ``files``: file contents by path (text, or {"from": repository path}), from which the file facts
  (File, Sha1File, FileContents, ExactFileText) derive; ``modes``: octal modes as ints (600) of listed
  files and directories (default 644 / 755);
  ``dirs``: directories that exist besides the standard ones and those holding a listed file;
  ``diff``: true runs as ``--diff`` does (pyinfra prints file diffs);
  a fact a case does not give takes the fact's own default (what pyinfra returns for "absent");
  ``facts_executing``: fact values (same keys) that replace ``facts`` once operations run, as a host
  looks after an earlier operation changed it (an engine the docker role installed);
- ``stage``: "prepare" (default; what ``--dry`` shows: ``_if`` conditions resolve from whether the
  operations they name would change) or "execute" (the host is assumed to look like the facts at
  execution time: checks that only run while executing are exercised);
- expected: ``commands`` (strings; an upload is {"upload": path, "content": text}, or
  {"upload": path, "from": repository path} for a repository file uploaded as is; a Python step
  such as the reboot's wait-and-reconnect is "<python: name>"), ``notes`` (substrings of noop
  and notice lines), ``noops`` (every ``host.noop`` description, exactly and in order), ``python_args``
  (by function name: substrings of that Python step's string arguments, e.g. the findings a
  "Preflight refused" step raises when it runs), ``hidden`` (strings no printed line may contain: a
  secret), ``error`` (substring of
  the refusal), and/or ``prepare_round_trips`` (how many fact reads, a FactBatch counting once, the
  deploy makes before any operation runs: the SSH round trips a no-op re-deploy spends preparing) and
  ``execute_round_trips`` (the same, while the operations run: on a rig already right, the one batch of
  rigkit.facts.surveyed; the case runner runs no command, so an operation's change does not end that picture).

The hosts are fakes by necessity: there is no GPU driver, CUDA repository or NVMe here. The lab
tests (tests/lab/test_roles_lab.py) run the docker and l2_disk roles against real rigs.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import logging
from datetime import datetime
from inspect import getcallargs
from pathlib import Path
from typing import Any

from pyinfra import logger
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.api.deploy import add_deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import add_op
from pyinfra.api.state import StateStage
from pyinfra.connectors.util import CommandOutput
from pyinfra.context import ctx_host, ctx_state

from rigkit.errors import RigkitError
from rigkit.facts.batch import FactBatch
from rigkit.facts.docker import DockerEngine, DockerImagePresent, DockerLocalImages
from rigkit.facts.server import ExactFileText
from rigkit.facts.serving import ServingEngine, StackContainers
from rigkit.serving.ledger import Release
from rigkit.settings.hostdata import RigSettings, rig_settings
from roles import Run, deploy_rig

REPO_ROOT = Path(__file__).resolve().parents[1]

OS_RELEASES = {
    "ubuntu-22.04": {"ID": "ubuntu", "VERSION_ID": "22.04", "VERSION_CODENAME": "jammy"},
    "ubuntu-24.04": {"ID": "ubuntu", "VERSION_ID": "24.04", "VERSION_CODENAME": "noble"},
    "debian-12": {"ID": "debian", "VERSION_ID": "12", "VERSION_CODENAME": "bookworm"},
    "debian-13": {"ID": "debian", "VERSION_ID": "13", "VERSION_CODENAME": "trixie"},
}


# rigkit's facts that read a file's text: answered from the case's files.
TEXT_FILE_FACTS = (ExactFileText,)


class FakeFacts:
    """Answers host.get_fact from a case: explicit facts, facts derived from files, else defaults."""

    def __init__(self, case: dict):
        self.facts: dict[str, Any] = dict(case.get("facts", {}))
        self.facts_executing: dict[str, Any] = {**self.facts, **case.get("facts_executing", {})}
        self.files: dict[str, str] = {path: _file_text(value) for path, value in case.get("files", {}).items()}
        self.dirs: set[str] = STANDARD_DIRS | set(case.get("dirs", []))
        self.modes: dict[str, int] = case.get("modes", {})
        if "os" in case:
            self.facts.setdefault(
                "server.LinuxDistribution",
                {"name": None, "major": None, "minor": None, "release_meta": OS_RELEASES[case["os"]]},
            )
        self.asked: list[str] = []
        self.asked_executing: list[str] = []
        self.round_trips = {"prepare": 0, "execute": 0}
        self.state: State | None = None

    def __call__(self, cls, *args, **kwargs):
        self.round_trips["execute" if self.state.is_executing else "prepare"] += 1
        if cls is FactBatch:  # each fact of the batch as the case gives it, in one round trip
            return {spec: self._answer(spec.fact, **dict(spec.kwargs)) for spec in kwargs["facts"]}
        return self._answer(cls, *args, **kwargs)

    def _answer(self, cls, *args, **kwargs):
        fact = cls()
        call_kwargs = getcallargs(fact.command, *args, **kwargs) if (args or kwargs) else {}
        call_kwargs.pop("self", None)
        name = cls.name
        # an argument names the fact's key: a path, an image, a port (PortListeners:8080)
        keys = [
            f"{name}:{value}"
            for value in call_kwargs.values()
            if isinstance(value, (str, int)) and not isinstance(value, bool)
        ] + [name]
        self.asked.append(keys[0])
        if self.state.is_executing:
            self.asked_executing.append(keys[0])
        facts = self.facts_executing if self.state.is_executing else self.facts
        for key in keys:
            if key in facts:
                return facts[key]
        if cls is ServingEngine:
            return self._serving_engine(**call_kwargs)
        path = call_kwargs.get("path")
        derived = self._from_files(cls, fact, name, path)
        if derived is not _NOT_DERIVED:
            return derived
        return fact.default()

    def _serving_engine(self, image, stack):
        """ServingEngine as the four facts it reads in one process, each as the case gives it (or its default):
        a case names DockerEngine, DockerImagePresent... as the rig's docker CLI would answer them."""
        present = self._answer(DockerImagePresent, image=image) if image else False
        return {
            "engine": self._answer(DockerEngine),
            "local_images": self._answer(DockerLocalImages) or [],
            "image_present": bool(present),
            "stack_containers": self._answer(StackContainers, stack=stack) or [],
        }

    def _from_files(self, cls, fact, name: str, path):
        if (
            path is None
            or name not in ("files.File", "files.Sha1File", "files.FileContents", "files.Directory")
            and cls not in TEXT_FILE_FACTS
        ):
            return _NOT_DERIVED
        text = self.files.get(path)
        if cls in TEXT_FILE_FACTS:
            return None if text is None else text
        if name == "files.Directory":
            if text is not None:
                return False
            return self._directory(path)
        if text is None:
            return None
        if name == "files.Sha1File":
            return hashlib.sha1(text.encode()).hexdigest()
        if name == "files.FileContents":
            return text.splitlines() or None  # pyinfra gives an empty file's no output the default, None
        return {
            "user": "root",
            "group": "root",
            "mode": self.modes.get(path, 644),
            "size": len(text),
            "mtime": datetime(2026, 1, 1),
        }

    def _directory(self, path: str):
        inside = path.rstrip("/") + "/"
        if path in self.dirs or any(other.startswith(inside) for other in self.files):
            return {"user": "root", "group": "root", "mode": self.modes.get(path, 755)}
        return None


_NOT_DERIVED = object()


def _file_text(value) -> str:
    """A case's file content: the text, or {"from": path} for a repository file the rig holds unchanged."""
    return (REPO_ROOT / value["from"]).read_text() if isinstance(value, dict) else value


# Directories every supported distribution has; a case adds others with "dirs".
STANDARD_DIRS = {"/etc", "/etc/apt", "/etc/apt/sources.list.d", "/etc/modprobe.d", "/tmp"}


# How pyinfra's host.noop prefixes a description ("[rig] noop: package nouveau is not loaded").
NOOP_MARKER = "noop: "


class NoteCatcher(logging.Handler):
    """Collects the info lines the roles print for the user (skips, notices)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.noops: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        self.lines.append(line)
        _, marker, description = line.partition(NOOP_MARKER)
        if marker:
            self.noops.append(description)

    def __enter__(self):
        logger.addHandler(self)
        self._level = logger.level
        logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc) -> None:
        logger.removeHandler(self)
        logger.setLevel(self._level)


def render(command) -> Any:
    if isinstance(command, StringCommand):
        return command.get_raw_value()
    if isinstance(command, FileUploadCommand):
        src = command.src
        if isinstance(src, str):  # a file of the repository, uploaded as is
            return {"upload": command.dest, "from": str(Path(src).resolve().relative_to(REPO_ROOT))}
        src.seek(0)
        return {"upload": command.dest, "content": src.read()}
    if isinstance(command, FunctionCommand):
        return f"<python: {command.function.__name__}>"
    return repr(command)


def resolve_if(condition) -> bool:
    """Whether an ``_if`` holds: the operations it names are complete by then (see _run)."""
    if condition is None:
        return True
    if isinstance(condition, list):
        return all(resolve_if(c) for c in condition)
    return bool(condition())


def run_case(case_dir: str, case: dict) -> dict:
    """Run the role (or operation) of ``case_dir`` against the case; return commands, notes, error."""
    inventory = Inventory((["rig"], {}), override_data=None)
    state = State(
        inventory, Config(DIFF=case.get("diff", False)), check_for_changes=False
    )  # as `pyinfra -y`: operations run only once
    state.print_noop_info = True  # noop lines are notes a case can expect (pyinfra logs them at debug otherwise)
    host = inventory.get_host("rig")
    host.data.__dict__["override_datas"].update(case.get("data", {}))
    facts = FakeFacts(case)
    facts.state = state
    host.get_fact = facts  # type: ignore[method-assign]
    host.connected = True
    notes = NoteCatcher()

    result: dict[str, Any] = {
        "commands": [],
        "notes": notes.lines,
        "noops": notes.noops,
        "error": None,
        "asked": facts.asked,
        "asked_executing": facts.asked_executing,
        "round_trips": facts.round_trips,
        "python_args": {},
    }
    with notes:
        _run(case_dir, case, state, host, result)
    return result


def _settings(case_dir: str, case: dict, kwargs: dict) -> RigSettings:
    """The rig's settings as the entry point builds them: deploy.py for the pipeline and the serving and
    preflight roles (a stack is required), on their own for the provisioning roles; rollback.py's for
    ``image_override``."""
    settings = rig_settings(
        case.get("data", {}),
        needs_stack=case_dir in ("pipeline", "serving", "preflight", "api_firewall", "node_exporter"),
    )
    image = kwargs.pop("image_override", None)
    return settings.for_image(image) if image else settings


def _returning(value):
    return lambda *args, **kwargs: value


def _operation_kwargs(op, case: dict) -> dict:
    """An operation case's ``kwargs`` as Python values: {"returns": value} is a function returning value;
    ``settings``, when the operation takes it, is built from the case's ``data``."""
    kwargs = {
        key: _returning(value["returns"]) if isinstance(value, dict) and set(value) == {"returns"} else value
        for key, value in case.get("kwargs", {}).items()
    }
    if "settings" in inspect.signature(op._inner).parameters:
        kwargs["settings"] = rig_settings(case.get("data", {})).stack
    return kwargs


def _run(case_dir: str, case: dict, state: State, host, result: dict) -> None:
    try:
        if "." in case_dir:  # <subject>.<operation>, as pyinfra's tests/operations/apt.packages/
            subject, name = case_dir.split(".", 1)
            op = getattr(importlib.import_module(f"rigkit.operations.{subject}"), name)
            add_op(state, op, host=host, **_operation_kwargs(op, case))
        elif case_dir == "pipeline":
            add_deploy(state, deploy_rig, _settings(case_dir, case, {}), case["roles"], host=host)
        else:
            module = importlib.import_module(f"roles.{case_dir}")
            kwargs = dict(case.get("kwargs", {}))
            if "undoing" in kwargs:  # rollback.py's release being undone, a ledger entry
                kwargs["undoing"] = Release(**kwargs["undoing"])
            add_deploy(state, getattr(module, case_dir), _settings(case_dir, case, kwargs), Run(), host=host, **kwargs)
    except (RigkitError, OperationError) as exc:
        result["error"] = str(exc)
        return

    executing = case.get("stage", "prepare") == "execute"
    if executing:
        state.current_stage = StateStage.Execute
        state.is_executing = True
    with ctx_state.use(state), ctx_host.use(host):
        for op_hash in state.get_op_order():
            op_data = state.get_op_data_for_host(host, op_hash)
            meta = op_data.operation_meta
            # prepare (--dry): an operation counts as changed when it would yield commands, as pyinfra shows it
            if not executing and not resolve_if(op_data.global_arguments.get("_if")):
                meta.set_complete(True, [], CommandOutput([]))
                continue
            try:
                commands = list(op_data.command_generator())
            except (RigkitError, OperationError) as exc:
                result["error"] = str(exc)
                return
            meta.set_complete(True, commands, CommandOutput([]))
            result["commands"].extend(render(command) for command in commands)
            for command in commands:
                if isinstance(command, FunctionCommand):
                    result["python_args"][command.function.__name__] = " ".join(
                        value for value in list(command.args) + list(command.kwargs.values()) if isinstance(value, str)
                    )


def case_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/*.json"))


def case_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def check_case(case_path: Path) -> None:
    """Run one case file and assert what it expects."""
    case = json.loads(case_path.read_text())
    result = run_case(case_path.parent.name, case)
    if "error" in case:
        assert result["error"] is not None, f"expected an error, got commands {result['commands']}"
        for part in _as_list(case["error"]):
            assert part in result["error"], f"{part!r} not in {result['error']!r}"
    else:
        assert result["error"] is None, result["error"]
    if "commands" in case:
        assert result["commands"] == case["commands"], f"facts asked: {result['asked']}"
    if "noops" in case:
        assert result["noops"] == case["noops"]
    for note in case.get("notes", []):
        assert any(note in line for line in result["notes"]), f"{note!r} not in notes {result['notes']}"
    for secret in case.get("hidden", []):
        assert not any(secret in line for line in result["notes"]), f"{secret!r} printed: {result['notes']}"
    for stage in ("prepare", "execute"):
        if f"{stage}_round_trips" in case:
            assert result["round_trips"][stage] == case[f"{stage}_round_trips"], f"facts asked: {result['asked']}"
    for function, parts in case.get("python_args", {}).items():
        assert function in result["python_args"], f"no Python step {function!r}: {result['commands']}"
        for part in _as_list(parts):
            assert part in result["python_args"][function], f"{part!r} not in {result['python_args'][function]!r}"


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]
