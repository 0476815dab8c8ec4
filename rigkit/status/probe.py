"""What `rigkit status` asks a rig, and its answer parsed: one shell script printing sections (the engine, the
stack's containers, the stack's files and release hash, the ledger, nvidia-smi and the GPUs' health, the kernel
log's Xids, the L2 tier, /dev/shm, the API on the rig's loopback), each cut out and read back by a pure function."""

from __future__ import annotations

import base64
import binascii
import fnmatch
import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Optional

from rigkit.facts import split_exit
from rigkit.facts.serving import ServingEngine
from rigkit.kv_store import store_probe_command
from rigkit.l2_state import l2_probe_for
from rigkit.model.stage import STORE_SCRIPT
from rigkit.nvidia_smi import SUMMARY_COMMAND, parse_cuda_version, parse_driver_version
from rigkit.serving.commands import RELEASE_HASH_FILE, ready_url, rendering_for, stack_files, stale_shm_command
from rigkit.serving.ledger import LEDGER_PATH
from rigkit.serving.render import STACK_NAME
from rigkit.settings.hostdata import Settings
from rigkit.settings.knobs import KNOBS_BY_NAME
from rigkit.status.gpu import kernel_log_command, query_command

SECTION_MARK = "@@rigkit-status "
# the API probe's own wait, well inside the whole script's (rigkit.status.fleet.SCRIPT_TIMEOUT_S)
API_TIMEOUT_S = 5

# /dev/shm entries the stack's processes create (the stack runs with `ipc: host`, so they land in the rig's
# own /dev/shm): vLLM's OffloadingConnector CPU tier (rigkit.settings.profiles: SharedMmapRegion), Python's
# multiprocessing segments each vLLM stop leaves behind (docs/limits.md: two psm_* of 160 and 240 MB), LMCache's
# (its name is not verified on a GPU rig yet). Left while no container of the stack runs, they hold RAM.
STACK_SHM_PATTERNS = ("vllm_offload_*.mmap", "psm_*", "lmcache*")

# The API probe, run by the rig's python3 (standard library only): status and served names of /v1/models.
API_PROBE = """
import json, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])) as response:
        body = json.load(response)
        print("status=%d" % response.status)
        print("models=" + json.dumps([model.get("id") for model in body.get("data", [])]))
except Exception as exc:
    print("error=%s: %s" % (type(exc).__name__, " ".join(str(exc).split())))
"""


def _file_section(path: str) -> str:
    """A file's exact bytes as one base64 line (its hash must be computed on exactly them), or 'absent'."""
    quoted = shlex.quote(path)
    return f"if [ -f {quoted} ]; then base64 -w0 {quoted}; echo; else echo absent; fi"


def model_probe(stack: Settings) -> str:
    """The staged model's check (size and mtime of every file against its verified stamp; the store script is
    on every rig that was ever staged onto)."""
    source = stack.model_source
    check = " ".join(
        shlex.quote(part)
        for part in ("python3", STORE_SCRIPT, "check", stack.knobs["model_store_path"], source.slug, source.revision)
    )
    return f"if [ -f {shlex.quote(STORE_SCRIPT)} ]; then {check}; else echo '{{\"staged\": false}}'; fi"


def status_script(stack: Optional[Settings]) -> str:
    """The one shell script a rig runs: sections, each under a ``SECTION_MARK name`` line."""
    compose_path, env_path = stack_files()
    sections = {
        # the engine and the stack's containers read as the survey reads them (its API on the local socket, else
        # the docker CLI): rigkit.facts.serving.ServingEngine, no image to look for
        "engine": ServingEngine().command(image=None, stack=STACK_NAME),
        "release-hash": _file_section(RELEASE_HASH_FILE),
        "compose": _file_section(compose_path),
        "env": _file_section(env_path),
        "ledger": _file_section(LEDGER_PATH),
        "nvidia": f'if command -v nvidia-smi >/dev/null 2>&1; then {SUMMARY_COMMAND} 2>&1; echo "exit=$?"; '
        "else echo none; fi",
        # per-GPU health and the kernel log's Xids (rigkit.status.gpu); both print nothing useful without nvidia-smi
        "gpu": query_command(),
        "kernel-log": kernel_log_command(),
        "shm": "find /dev/shm -mindepth 1 -maxdepth 1 -printf '%s %f\\n' 2>/dev/null",
        # files of stopped engines (STALE_SHM_GLOBS) no process maps: also while the stack runs (rigkit.serving.commands)
        "shm-stale": stale_shm_command(),
    }
    if stack is not None:
        if stack.l2_active:
            sections["l2"] = l2_probe_for(stack)
        if stack.knobs.get("l2_kv_store_address"):
            # LMCache's L2 is the fleet's Valkey store: asked from the rig, as its LMCache reaches it
            sections["kv-store"] = store_probe_command(
                stack.knobs["l2_adapter_json"], env_path, KNOBS_BY_NAME["kv_store_password"].env
            )
        if stack.model_source is not None:
            sections["model"] = model_probe(stack)
        url = ready_url(rendering_for(stack))
        sections["api"] = (
            f"if command -v python3 >/dev/null 2>&1; then python3 -c {shlex.quote(API_PROBE)} "
            f"{shlex.quote(url)} {API_TIMEOUT_S}; else echo 'error=python3 is not on the rig'; fi"
        )
    return "\n".join(f"echo {shlex.quote(SECTION_MARK + name)}\n{command}" for name, command in sections.items()) + "\n"


def parse_sections(text: str) -> dict[str, str]:
    """Section name -> its output (lines end at "\\n" only, as the shell wrote them)."""
    sections: dict[str, list[str]] = {}
    current: Optional[list[str]] = None
    for line in text.split("\n"):
        if line.startswith(SECTION_MARK):
            current = sections.setdefault(line[len(SECTION_MARK) :].strip(), [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).strip("\n") for name, lines in sections.items()}


def decoded_file(section: Optional[str]) -> Optional[str]:
    """A _file_section's text: None when absent (or the section is missing or unreadable)."""
    if section is None or section.strip() == "absent":
        return None
    try:
        return base64.b64decode(section.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


@dataclass
class Container:
    """The stack's container as docker inspect shows it (its env stays in memory: it may hold a secret)."""

    name: str
    image: str
    running: bool
    status: str
    health: Optional[str]  # healthy | unhealthy | starting; None without a healthcheck
    restarts: int
    env: dict[str, str] = field(repr=False)
    labels: dict[str, str] = field(default_factory=dict)


def parse_containers(inspect_json: str) -> Optional[list[Container]]:
    """The stack's containers from their inspect JSON (the engine section's last part); None when it is not JSON."""
    try:
        inspected = json.loads(inspect_json or "null")
    except ValueError:
        return None
    if not isinstance(inspected, list):
        return None
    found = []
    for item in inspected:
        config, state = item.get("Config") or {}, item.get("State") or {}
        env = dict(line.split("=", 1) for line in config.get("Env") or [] if "=" in line)
        found.append(
            Container(
                name=item.get("Name", "").lstrip("/"),
                image=config.get("Image", ""),
                running=bool(state.get("Running")),
                status=state.get("Status", "unknown"),
                health=(state.get("Health") or {}).get("Status"),
                restarts=int(item.get("RestartCount") or 0),
                env=env,
                labels=config.get("Labels") or {},
            )
        )
    return found


def parse_api(section: Optional[str]) -> dict[str, Any]:
    """{"status": int|None, "models": [...], "error": str|None} from the API probe's lines."""
    values = dict(line.split("=", 1) for line in (section or "").split("\n") if "=" in line)
    try:
        models = json.loads(values.get("models", "[]"))
    except ValueError:
        models = []
    status = values.get("status", "")
    error = values.get("error") or (None if status else "the probe printed nothing")
    return {"status": int(status) if status.isdigit() else None, "models": models, "error": error}


def parse_nvidia(section: Optional[str]) -> dict[str, Optional[str]]:
    """{"driver", "cuda"}: versions from nvidia-smi's header, "none" without nvidia-smi, None when it failed."""
    text = (section or "").strip()
    if text == "none":
        return {"driver": "none", "cuda": "none", "error": None}
    lines, status = split_exit(text.split("\n"))
    output = "\n".join(lines)
    driver = parse_driver_version(output) if status == 0 else None
    error = None if driver else " ".join(output.split())[-200:] or f"exit {status}"
    return {"driver": driver, "cuda": parse_cuda_version(output) if driver else None, "error": error}


def parse_stale_shm(section: Optional[str]) -> list[tuple[str, int]]:
    """(name, bytes) of stopped engines' files no process maps (stale_shm_command's `BYTES PATH` lines)."""
    found = []
    for line in (section or "").split("\n"):
        size, _, path = line.partition(" ")
        if path and size.isdigit():
            found.append((path.rsplit("/", 1)[-1], int(size)))
    return found


def parse_shm(section: Optional[str]) -> list[tuple[str, int]]:
    """(name, bytes) of the /dev/shm entries that match the stack's patterns."""
    found = []
    for line in (section or "").split("\n"):
        size, _, name = line.partition(" ")
        if name and size.isdigit() and any(fnmatch.fnmatch(name, p) for p in STACK_SHM_PATTERNS):
            found.append((name, int(size)))
    return found
