"""`rigkit status`: what every rig of a fleet really runs, against what today's data declares.

    rigkit status inventory/lab.py                        # a table, details per rig under it
    rigkit status inventory/lab.py --limit rig2 --json    # the whole structure
    rigkit status inventory/lab.py --data served_model_name=x   # as a deploy with that --data would see it

Every rig is asked in parallel (threads), in one SSH round trip: one shell script (``status_script``)
prints sections (the engine, the stack's containers, the stack's files and release hash, the ledger,
nvidia-smi, the L2 tier, /dev/shm, the API on the rig's loopback) that pure functions parse and judge:

- drift: the running image against the declared one; the rig's compose.yml and .env against what today's
  data renders, per knob; the files against the release hash recorded when they were verified (an edit by
  hand); the container's environment against the declared knob values. Secrets are compared, never shown.
- health: the engine answers, the stack's container runs (and is healthy when it has a healthcheck),
  /v1/models answers on the rig's loopback with the served name; the L2 tier is not full and its janitor
  runs. Leftover shared-memory segments of the stack and an L2 store over its budget are warnings.

The exit status is 0 when every rig is reachable, healthy and without drift, 1 otherwise, 2 when the
inventory or its data is refused (before any rig is asked).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import fnmatch
import json
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import yaml

from rigkit.errors import ConfigError, RigkitError
from rigkit.facts import split_exit
from rigkit.facts.docker import DockerEngine
from rigkit.facts.stack import StackContainers
from rigkit.hostdata import Settings, rig_settings
from rigkit.knobs import ENGINE_FLAGS, SECRET_ENV_NAMES, knob_for_env, redacted
from rigkit.ledger import LEDGER_PATH, Ledger, Rendering, parse_dotenv, release_hash
from rigkit.nvidia_smi import SUMMARY_COMMAND, parse_cuda_version, parse_driver_version
from rigkit.render import KNOBS_HASH_LABEL, LABEL_PREFIX, SERVICE_NAME, STACK_NAME
from rigkit.stack import RELEASE_HASH_FILE, ready_url, rendering_for, stack_files

SECTION_MARK = "@@rigkit-status "
# One round trip per rig: the script's own time on a healthy rig is well under a second (the API probe
# waits at most API_TIMEOUT_S); a rig that does not finish in this time is reported unreachable.
SCRIPT_TIMEOUT_S = 60
API_TIMEOUT_S = 5
MAX_PARALLEL_RIGS = 16
TABLE_WIDTH = 100
LAST_COLUMN_MIN = 16
SHOWN_VALUE_CHARS = 60

# /dev/shm entries the stack's processes create (the stack runs with `ipc: host`, so they land in the rig's
# own /dev/shm): vLLM's OffloadingConnector CPU tier (rigkit.profiles: SharedMmapRegion), Python's
# multiprocessing segments each vLLM stop leaves behind (README: two psm_* of 160 and 240 MB), LMCache's
# (its name is not verified on a GPU rig yet). Left while no container of the stack runs, they hold RAM.
STACK_SHM_PATTERNS = ("vllm_offload_*.mmap", "psm_*", "lmcache*")

# compose.yml service keys (rigkit.render.compose_document) and the knob each carries.
COMPOSE_KEY_KNOBS = {"image": "serving_image", "restart": "restart_policy", "mem_limit": "mem_limit_gb",
                     "memswap_limit": "mem_limit_gb", "volumes": "l2_path", "deploy": "gpu_mask"}
FLAG_KNOBS = {flag: knob for knob, flag in ENGINE_FLAGS.items()} | {"--kv-transfer-config": "serving_profile"}

PROFILE_LABEL = f"{LABEL_PREFIX}.profile"

OK, DRIFT, UNHEALTHY, UNREACHABLE = "ok", "drift", "unhealthy", "unreachable"

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


# --- the script and its sections -------------------------------------------------------------------------

def _file_section(path: str) -> str:
    """A file's exact bytes as one base64 line (its hash must be computed on exactly them), or 'absent'."""
    quoted = shlex.quote(path)
    return f"if [ -f {quoted} ]; then base64 -w0 {quoted}; echo; else echo absent; fi"


def status_script(stack: Optional[Settings]) -> str:
    """The one shell script a rig runs: sections, each under a ``SECTION_MARK name`` line."""
    from rigkit.l2_state import l2_probe_for

    compose_path, env_path = stack_files()
    sections = {
        "engine": DockerEngine().command(),
        "containers": f"{{ {StackContainers().command(STACK_NAME)}; }} 2>/dev/null | base64 -w0; echo",
        "release-hash": _file_section(RELEASE_HASH_FILE),
        "compose": _file_section(compose_path),
        "env": _file_section(env_path),
        "ledger": _file_section(LEDGER_PATH),
        "nvidia": f"if command -v nvidia-smi >/dev/null 2>&1; then {SUMMARY_COMMAND} 2>&1; echo \"exit=$?\"; "
                  "else echo none; fi",
        "shm": "find /dev/shm -mindepth 1 -maxdepth 1 -printf '%s %f\\n' 2>/dev/null",
    }
    if stack is not None:
        if stack.l2_active:
            sections["l2"] = l2_probe_for(stack)
        url = ready_url(rendering_for(stack))
        sections["api"] = (f"if command -v python3 >/dev/null 2>&1; then python3 -c {shlex.quote(API_PROBE)} "
                           f"{shlex.quote(url)} {API_TIMEOUT_S}; else echo 'error=python3 is not on the rig'; fi")
    return "\n".join(f"echo {shlex.quote(SECTION_MARK + name)}\n{command}" for name, command in sections.items()) + "\n"


def parse_sections(text: str) -> dict[str, str]:
    """Section name -> its output (lines end at "\\n" only, as the shell wrote them)."""
    sections: dict[str, list[str]] = {}
    current: Optional[list[str]] = None
    for line in text.split("\n"):
        if line.startswith(SECTION_MARK):
            current = sections.setdefault(line[len(SECTION_MARK):].strip(), [])
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


def parse_containers(section: Optional[str]) -> Optional[list[Container]]:
    """The stack's containers from the containers section; None when docker did not answer with JSON."""
    try:
        inspected = json.loads(base64.b64decode((section or "").strip(), validate=True).decode() or "null")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(inspected, list):
        return None
    found = []
    for item in inspected:
        config, state = item.get("Config") or {}, item.get("State") or {}
        env = dict(line.split("=", 1) for line in config.get("Env") or [] if "=" in line)
        found.append(Container(name=item.get("Name", "").lstrip("/"), image=config.get("Image", ""),
                               running=bool(state.get("Running")), status=state.get("Status", "unknown"),
                               health=(state.get("Health") or {}).get("Status"),
                               restarts=int(item.get("RestartCount") or 0), env=env,
                               labels=config.get("Labels") or {}))
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


def parse_shm(section: Optional[str]) -> list[tuple[str, int]]:
    """(name, bytes) of the /dev/shm entries that match the stack's patterns."""
    found = []
    for line in (section or "").split("\n"):
        size, _, name = line.partition(" ")
        if name and size.isdigit() and any(fnmatch.fnmatch(name, p) for p in STACK_SHM_PATTERNS):
            found.append((name, int(size)))
    return found


# --- decisions: drift ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Drift:
    """One difference between the rig and today's data: ``source`` (image, files, .env, compose, container),
    the knob (or env var, compose key) it is about, and both sides as shown (secrets never)."""

    source: str
    knob: str
    rig: str
    today: str

    def line(self) -> str:
        return f"{self.source}: {self.knob}: rig {self.rig}, today {self.today}"


def _shown(env: str, value: Optional[str]) -> str:
    """A value as status prints it: a secret as <secret> (or <unset>), others quoted and cut."""
    if value is None:
        return "<unset>"
    if env in SECRET_ENV_NAMES:
        return str(redacted(env, value)) if value else "<unset>"
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= SHOWN_VALUE_CHARS else text[:SHOWN_VALUE_CHARS - 1] + "…"


def image_drift(running: Optional[str], declared: str) -> list[Drift]:
    """The container's image (repo@sha256:...) against the declared one."""
    if running == declared:
        return []
    return [Drift("image", "serving_image", running or "<no container>", declared)]


def files_drift(compose: Optional[str], env: Optional[str], recorded_hash: Optional[str]) -> list[Drift]:
    """The stack's files against the release hash recorded once they were verified: a mismatch means they
    changed since (by hand, or a release that failed and was not rolled back)."""
    if compose is None or env is None:
        missing = " and ".join(n for n, t in (("compose.yml", compose), (".env", env)) if t is None)
        return [Drift("files", "stack files", f"{missing} missing", "rendered files")]
    recorded = (recorded_hash or "").strip()
    actual = release_hash(compose, env)
    if not recorded:
        return [Drift("files", "release hash", "none recorded (the last release was not verified)", actual[:12])]
    if recorded != actual:
        return [Drift("files", "release hash", f"hash {actual[:12]} (changed since verified)",
                      f"verified {recorded[:12]}")]
    return []


def env_values_drift(source: str, rig: Mapping[str, str], today: Mapping[str, str]) -> list[Drift]:
    """Per env var of today's rendering (and any the rig has beyond it): the knob whose values differ."""
    return [Drift(source, knob_for_env(name), _shown(name, rig.get(name)), _shown(name, today.get(name)))
            for name in sorted(set(today) | set(rig)) if rig.get(name) != today.get(name)]


def _flags(script: str) -> dict[str, Optional[str]]:
    """--flag -> its value (None for a bare flag) in an entrypoint script."""
    try:
        tokens = shlex.split(script.replace("\\\n", " "))
    except ValueError:
        return {}
    flags: dict[str, Optional[str]] = {}
    for index, token in enumerate(tokens):
        if token.startswith("--"):
            name, equals, value = token.partition("=")
            following = tokens[index + 1] if index + 1 < len(tokens) else None
            flags[name] = value if equals else (following if following and not following.startswith("-") else None)
    return flags


def _compact(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), default=str) if not isinstance(value, str) else value
    return repr(text if len(text) <= SHOWN_VALUE_CHARS else text[:SHOWN_VALUE_CHARS - 1] + "…")


def _command_drift(rig: list, today: list) -> list[Drift]:
    rig_flags, today_flags = _flags(" ".join(map(str, rig))), _flags(" ".join(map(str, today)))
    found = [Drift("compose", FLAG_KNOBS.get(flag, f"command {flag}"), _compact(rig_flags.get(flag, "<absent>")),
                   _compact(today_flags.get(flag, "<absent>")))
             for flag in sorted(set(rig_flags) | set(today_flags)) if rig_flags.get(flag, 0) != today_flags.get(flag, 0)]
    return found or [Drift("compose", "command", "differs", "the profile's launcher or prelude")]


def compose_drift(rig_compose: Optional[str], todays_compose: str) -> list[Drift]:
    """The rig's compose.yml against today's, per service key, named by the knob that sets it. Values of the
    environment block are in .env (env_values_drift); here only which variables it declares."""
    if rig_compose is None:
        return []  # files_drift says it is missing
    try:
        rig = (yaml.safe_load(rig_compose) or {})["services"][SERVICE_NAME]
    except (yaml.YAMLError, KeyError, TypeError):
        return [Drift("compose", "compose.yml", f"unreadable (no services.{SERVICE_NAME})", "rendered")]
    today = yaml.safe_load(todays_compose)["services"][SERVICE_NAME]
    found: list[Drift] = []
    for key in list(today) + [k for k in rig if k not in today]:
        mine, theirs = rig.get(key), today.get(key)
        if mine == theirs:
            continue
        if key == "command":
            found += _command_drift(mine or [], theirs or [])
        elif key == "environment":
            names = lambda block: {line.split("=", 1)[0] for line in block or []}  # noqa: E731
            found += [Drift("compose", knob_for_env(name), "declared" if name in names(mine) else "not declared",
                            "declared" if name in names(theirs) else "not declared")
                      for name in sorted(names(mine) ^ names(theirs))]
        elif key == "labels":
            found += [Drift("compose", f"label {name}", _compact((mine or {}).get(name)),
                            _compact((theirs or {}).get(name)))
                      for name in sorted(set(mine or {}) | set(theirs or {}))
                      if (mine or {}).get(name) != (theirs or {}).get(name)]
        else:
            found.append(Drift("compose", COMPOSE_KEY_KNOBS.get(key, key), _compact(mine), _compact(theirs)))
    return found


def rendering_drift(compose: Optional[str], env: Optional[str], today: Rendering) -> list[Drift]:
    """The rig's files against today's rendering: .env per knob, compose.yml per key. The knobs-hash label
    changes with every knob: named only when nothing else explains it."""
    found = compose_drift(compose, today.compose)
    if env is not None:
        found += env_values_drift(".env", parse_dotenv(env), parse_dotenv(today.env))
    knobs_hash = f"label {KNOBS_HASH_LABEL}"
    explained = [d for d in found if d.knob != knobs_hash]
    return explained if explained else found


def container_drift(container: Container, today: Rendering) -> list[Drift]:
    """The container against the declared stack: its environment (only the variables the stack declares), its
    profile label, and its knobs-hash label when nothing else explains it (a stack re-rendered by another
    tool, e.g. validate.py's decode A/B left on the baseline)."""
    declared = today.container_env()
    found = env_values_drift("container", {name: container.env[name] for name in declared if name in container.env},
                             declared)
    profile = container.labels.get(PROFILE_LABEL)
    if profile != today.profile:
        found.append(Drift("container", "serving_profile", _compact(profile), _compact(today.profile)))
    knobs_hash = container.labels.get(KNOBS_HASH_LABEL)
    if not found and knobs_hash != today.knobs_hash:
        found.append(Drift("container", f"label {KNOBS_HASH_LABEL}", _compact(knobs_hash), _compact(today.knobs_hash)))
    return found


# --- decisions: health and the whole rig ------------------------------------------------------------------

@dataclass
class RigStatus:
    """One rig's answer, judged. Holds no secret: values are shown through _shown."""

    rig: str
    reachable: bool = True
    error: str = ""  # why the rig could not be asked
    image: Optional[str] = None  # what the stack's container runs
    declared_image: Optional[str] = None
    drift: list[Drift] = field(default_factory=list)
    health: dict[str, str] = field(default_factory=dict)  # engine, container, api: "ok" or the problem
    unhealthy: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    ledger: Optional[dict[str, Any]] = None  # the last entry: kind, smoke, deployed_at, image, note
    driver: Optional[str] = None
    cuda: Optional[str] = None
    l2: Optional[dict[str, Any]] = None
    shm_leftovers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def state(self) -> str:
        if not self.reachable:
            return UNREACHABLE
        if self.unhealthy:
            return UNHEALTHY
        return DRIFT if self.drift else OK

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state, **asdict(self)}


def last_release(ledger_text: Optional[str]) -> Optional[dict[str, Any]]:
    """The ledger's newest entry (kind, smoke verdict, time, image, note), None without one."""
    try:
        current = Ledger.from_json(ledger_text).current
    except ValueError as exc:
        return {"error": f"ledger unreadable: {exc}"}
    if current is None:
        return None
    return {"kind": current.kind, "smoke": current.smoke, "deployed_at": current.deployed_at,
            "image": current.image, "rendering": current.rendering, "note": current.note}


def assess(rig: str, stack: Optional[Settings], output: str) -> RigStatus:
    """Judge one rig from its script's output and the stack today's data declares (None: none declared)."""
    sections = parse_sections(output)
    status = RigStatus(rig, declared_image=stack.image if stack else None)
    engine = DockerEngine().process((sections.get("engine") or "").split("\n"))
    status.health["engine"] = "ok" if engine["server_version"] else f"docker does not answer: {engine['error']}"
    # docker ps failing prints no id, so the fact's command answers "[]": without an engine, nothing is known
    containers = parse_containers(sections.get("containers")) if engine["server_version"] else None
    running = [c for c in containers or [] if c.running]
    container = (running or containers or [None])[0]
    status.image = container.image if container else None
    if container is None:
        status.health["container"] = "no container of the stack" if containers is not None else "unknown"
    elif not container.running or container.status != "running":  # restarting, paused: not serving
        status.health["container"] = f"{container.name} {container.status}"
    elif container.health not in (None, "healthy"):
        status.health["container"] = f"{container.name} {container.health}"
    else:
        status.health["container"] = "ok"
    if container is not None and container.restarts:
        status.warnings.append(f"{container.name} restarted {container.restarts} times (its engine died and the "
                               f"restart policy brought it back): docker logs {container.name}")

    compose, env = decoded_file(sections.get("compose")), decoded_file(sections.get("env"))
    if stack is not None:
        today = rendering_for(stack)
        status.drift += image_drift(status.image, stack.image)
        status.drift += files_drift(compose, env, decoded_file(sections.get("release-hash")))
        status.drift += rendering_drift(compose, env, today)
        if container is not None:
            status.drift += container_drift(container, today)
        served = container.env.get("RIGKIT_SERVED_MODEL_NAME") if container else None
        served = served or today.knob("served_model_name")
        api = parse_api(sections.get("api"))
        if api["error"]:
            status.health["api"] = f"{ready_url(today)}: {api['error']}"
        elif served not in api["models"]:
            status.health["api"] = f"/v1/models lists {api['models']}, not {served!r}"
        else:
            status.health["api"] = "ok"
        if "l2" in sections:
            status.l2 = l2_report(stack, sections["l2"])
    else:
        status.warnings.append("no serving_profile in today's data: drift not judged")
    status.unhealthy = [f"{what}: {text}" for what, text in status.health.items() if not text.startswith("ok")]
    if status.l2 and status.l2["level"] == "fail":
        status.unhealthy += status.l2["problems"]
    elif status.l2 and status.l2["level"] == "warn":
        status.warnings += status.l2["problems"]
    nvidia = parse_nvidia(sections.get("nvidia"))
    status.driver, status.cuda = nvidia["driver"], nvidia["cuda"]
    if nvidia["error"]:
        status.warnings.append(f"nvidia-smi failed: {nvidia['error']}")
    status.ledger = last_release(decoded_file(sections.get("ledger")))
    if not running:
        status.shm_leftovers = [{"name": name, "bytes": size} for name, size in parse_shm(sections.get("shm"))]
        if status.shm_leftovers:
            total = sum(item["bytes"] for item in status.shm_leftovers)
            status.warnings.append(f"{len(status.shm_leftovers)} shared-memory segments of the stack left in /dev/shm "
                                   f"({total / 2**20:.0f} MiB) while no container of it runs: remove them "
                                   "(rm /dev/shm/NAME) before the next start")
    return status


def l2_report(stack: Settings, probe_output: str) -> dict[str, Any]:
    """The L2 tier judged as validation judges it, from the probe's output in the script."""
    from rigkit.l2_state import read_l2

    report = read_l2(lambda command: probe_output, stack)
    return report.model_dump() if report is not None else None


# --- reading rigs ----------------------------------------------------------------------------------------

def ask_rig(name: str, data: Mapping[str, Any], script: str, timeout_s: float = SCRIPT_TIMEOUT_S) -> str:
    """Run the script on the rig in one SSH round trip; its stdout. RigkitError/OSError when unreachable."""
    from rigkit.tunnel import connect_ssh

    client = connect_ssh(data, name)
    try:
        # the script as the command itself, not on stdin: a command in it that reads stdin would eat the rest
        _, stdout, _ = client.exec_command(f"sh -c {shlex.quote(script)}", timeout=timeout_s)
        return stdout.read().decode(errors="replace")
    finally:
        client.close()


def rig_status(name: str, data: Mapping[str, Any], stack: Optional[Settings],
               ask: Callable[[str, Mapping[str, Any], str], str] = ask_rig) -> RigStatus:
    try:
        output = ask(name, data, status_script(stack))
    except (RigkitError, OSError, EOFError) as exc:
        return RigStatus(name, reachable=False, error=str(exc), declared_image=stack.image if stack else None)
    except Exception as exc:  # paramiko's own (SSHException, socket.timeout): one rig down must not stop the rest
        return RigStatus(name, reachable=False, error=f"{type(exc).__name__}: {exc}",
                         declared_image=stack.image if stack else None)
    if not output.strip():
        return RigStatus(name, reachable=False, error="the rig's shell printed nothing",
                         declared_image=stack.image if stack else None)
    return assess(name, stack, output)


def cli_value(text: str) -> Any:
    """A ``--data`` value as pyinfra reads it (pyinfra_cli.util.parse_cli_arg): true/false, an int, JSON, else
    the text. Not imported from there: importing pyinfra_cli patches the whole process with gevent."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_data(pairs: Sequence[str]) -> dict[str, Any]:
    data = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise ConfigError("--data", pair, "is not KEY=VALUE", "write --data name=value, as pyinfra takes it")
        data[key] = cli_value(value)
    return data


def fleet_status(inventory: str, limits: Sequence[str] = (), override: Optional[dict] = None,
                 ask: Callable[[str, Mapping[str, Any], str], str] = ask_rig) -> list[RigStatus]:
    """Every targeted rig's status, asked in parallel; ConfigError (before any rig is asked) on bad input."""
    from rigkit.fleet import check_connection_data, load_inventory, rigs_among, targeted

    hosts = load_inventory(inventory)
    patterns = [p for limit in limits for p in limit.split(",") if p]
    names = rigs_among(hosts, targeted(hosts, patterns))  # a gateway or the KV store serves no stack
    if not names:
        raise ConfigError("--limit", ",".join(patterns), f"matches no rig of {inventory}",
                          f"use host or group names from the inventory: {', '.join(sorted(hosts))}")
    datas = {name: {**hosts[name]["data"], **(override or {})} for name in names}
    stacks = {}
    for name in names:
        check_connection_data(name, datas[name])
        stacks[name] = rig_settings(datas[name], needs_stack=False).declared_stack
    with ThreadPoolExecutor(max_workers=min(len(names), MAX_PARALLEL_RIGS)) as pool:
        return list(pool.map(lambda name: rig_status(name, datas[name], stacks[name], ask), names))


# --- output ----------------------------------------------------------------------------------------------

def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(width - 1, 0)] + "…"


def fit_table(rows: Sequence[Sequence[str]], width: int = TABLE_WIDTH, gap: int = 2) -> list[str]:
    """Rows as aligned lines no longer than ``width``: the last column (the one the details repeat in full)
    gives up characters first, down to LAST_COLUMN_MIN, then the widest others."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    floor = [min(w, max(len(rows[0][i]), 4)) for i, w in enumerate(widths)]
    floor[-1] = min(widths[-1], max(floor[-1], LAST_COLUMN_MIN))
    while sum(widths) + gap * (len(widths) - 1) > width and widths != floor:
        if widths[-1] > floor[-1]:
            widths[-1] -= 1
            continue
        i = max(range(len(widths)), key=lambda k: widths[k] - floor[k])
        widths[i] -= 1
    return [(" " * gap).join(_cut(cell, widths[i]).ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
            for row in rows]


def _digest(image: Optional[str]) -> str:
    return image.rpartition("@")[2].removeprefix("sha256:")[:12] if image else "-"


def _release_cell(ledger: Optional[dict]) -> str:
    if not ledger:
        return "-"
    if "error" in ledger:
        return "unreadable"
    when = (ledger.get("deployed_at") or "")[5:16].replace("T", " ")
    return f"{ledger['kind']} {ledger.get('smoke') or '-'} {when}".strip()


def _l2_cell(l2: Optional[dict]) -> str:
    if not l2:
        return "-"
    if l2.get("store_bytes") is None:
        return l2["state"]
    used = f"{100 * l2['store_bytes'] / l2['budget_bytes']:.0f}%"
    return used if l2["state"] == "ok" else f"{used} {l2['state']}"


def _gpu_cell(status: RigStatus) -> str:
    if status.driver in (None, "none"):
        return status.driver or "?"
    return f"{status.driver}/{status.cuda or '?'}"


def _problems_cell(status: RigStatus) -> str:
    """What is wrong, shortest first: unhealthy parts, then the knobs that drifted (details name them all)."""
    if not status.reachable:
        return " ".join(status.error.split())
    bad = [f"{what} down" for what, text in status.health.items() if not text.startswith("ok")]
    if status.l2 and status.l2["level"] == "fail":
        bad.append(f"L2 {status.l2['state']}")
    knobs = list(dict.fromkeys(d.knob for d in status.drift))
    return ", ".join(bad + knobs) or "-"


def format_report(statuses: Sequence[RigStatus], width: int = TABLE_WIDTH) -> str:
    """The table (at most ``width`` columns), then each rig's details: every drift, problem and warning."""
    header = ("rig", "state", "image", "last release", "gpu", "L2", "what")
    rows = [header] + [(s.rig, s.state, _digest(s.image), _release_cell(s.ledger), _gpu_cell(s), _l2_cell(s.l2),
                        _problems_cell(s)) for s in statuses]
    lines = fit_table(rows, width)
    for status in statuses:
        details = ([f"unreachable: {status.error}"] if not status.reachable else [])
        details += [f"drift {d.line()}" for d in status.drift]
        details += [f"unhealthy {problem}" for problem in status.unhealthy]
        details += [f"warning {warning}" for warning in status.warnings]
        if status.ledger and status.ledger.get("note") and status.state != OK:
            details.append(f"last release note: {status.ledger['note']}")
        if details:
            lines.append(f"{status.rig}:")
            lines += [f"  {line}" for line in details]
    bad = [s.rig for s in statuses if s.state != OK]
    lines.append(f"{len(statuses) - len(bad)} of {len(statuses)} rigs ok"
                 + (f"; not ok: {', '.join(bad)}" if bad else ""))
    return "\n".join(lines)


def exit_status(statuses: Sequence[RigStatus]) -> int:
    return 0 if all(s.state == OK for s in statuses) else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inventory", help="pyinfra inventory file, e.g. inventory/lab.py")
    parser.add_argument("--limit", action="append", default=[],
                        help="host or group names or globs, as pyinfra's --limit (a comma list is split)")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                        help="override host data as pyinfra's --data does (what a deploy with it would render)")
    parser.add_argument("--json", action="store_true", help="print the whole structure as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        statuses = fleet_status(args.inventory, args.limit, parse_data(args.data))
    except ConfigError as exc:
        print(f"rigkit status: refused before any rig was asked: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"rigs": [s.as_dict() for s in statuses]}, indent=2, sort_keys=True))
    else:
        print(format_report(statuses))
    return exit_status(statuses)
