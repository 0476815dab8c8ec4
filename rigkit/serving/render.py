"""Render a serving stack: compose.yml and .env from validated Settings.

compose.yml is built as data and dumped with yaml.safe_dump; .env is laid out by templates/env.j2.
Every env var of the profile's knobs is declared in ``environment:`` as ``NAME=${NAME:-}`` and
written to .env, so a knob set in host data always reaches the container.
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Optional

import yaml
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from rigkit.errors import ConfigError, PreflightError
from rigkit.paths import LABEL_PREFIX, STACK_LABEL, STACK_NAME, TEMPLATES_DIR
from rigkit.settings.hostdata import Settings
from rigkit.settings.knobs import (
    ENGINE_FLAGS,
    KNOBS_BY_NAME,
    env_text,
    env_value_problem,
    knob_for_env,
)
from rigkit.settings.model_source import MODEL_CONTAINER_PATH, OFFLINE_ENV

COMPOSE_PROJECT = "rigkit"
SERVICE_NAME = "serving"
CONTAINER_NAME = "rigkit-serving"
KNOBS_HASH_LABEL = f"{LABEL_PREFIX}.knobs-hash"
MODEL_LABEL = f"{LABEL_PREFIX}.model"  # the staged model_source (source@revision) the container mounts
L2_CONTAINER_PATH = "/kv-store"
COMPOSE_FILE_NAME = "compose.yml"
ENV_FILE_NAME = ".env"
ENV_FILE_MODE = 0o600

_templates = Environment(
    loader=FileSystemLoader(str(TEMPLATES_DIR)),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
)


def compose_escape(text: str) -> str:
    """In-container text for compose: `$` becomes `$$` so compose passes it through uninterpolated."""
    return text.replace("$", "$$")


# LMCache's fs L2 adapter keeps no checksum in the LMCache versions read: FSL2AdapterConfig.from_dict
# (lmcache/v1/distributed/l2_adapters/fs_l2_adapter.py) reads base_path, relative_tmp_dir, read_ahead_size and
# use_odirect in 0.5.3 (the version run on the H200), + max_capacity_gb and recover_on_start at LMCache commit
# 02ebd8bb; any other key, `checksum` too, is ignored without a word, and each file holds the raw tensor bytes only
# (FSL2Adapter's docstring), so a torn write reads back as a hit. None: nothing to render; the card says so
# (FS_L2_INTEGRITY). Set it to the option's JSON fields once an LMCache release reads one, e.g. {"checksum": "crc32"}.
FS_L2_CHECKSUM: dict = {}
FS_L2_INTEGRITY = (
    "no checksum: LMCache's fs L2 adapter (0.5.3) has no such option, so a torn or rotten file "
    "reads back as a hit and only the greedy check can catch it"
)


def default_l2_adapter() -> str:
    return json.dumps({"type": "fs", "base_path": L2_CONTAINER_PATH, **FS_L2_CHECKSUM}, separators=(",", ":"))


def l2_integrity(settings: Settings) -> Optional[str]:
    """What guards the stack's LMCache fs L2 files against a torn write (the card's setup says it); None: no such
    tier (no LMCache L2, or another adapter such as Valkey)."""
    if not settings.l2_active or "l2_adapter_json" not in settings.profile.all_knobs:
        return None
    adapter = settings.knobs["l2_adapter_json"]
    if (
        adapter is not None
        and json.loads(adapter if isinstance(adapter, str) else json.dumps(adapter)).get("type") != "fs"
    ):
        return None
    return f"checksum {FS_L2_CHECKSUM['checksum']}" if FS_L2_CHECKSUM.get("checksum") else FS_L2_INTEGRITY


def _fill_placeholders(value: Any, settings: Settings) -> Any:
    # the same bytes LMCache's --l1-size-gb allocates (GiB), so an A/B compares equal cache sizes
    fills = {
        "@l1_bytes": settings.l1_bytes,
        "@l2_dir": L2_CONTAINER_PATH,
        "@lmcache_port": settings.knobs["lmcache_port"],
    }
    if isinstance(value, dict):
        return {key: _fill_placeholders(item, settings) for key, item in value.items()}
    if isinstance(value, list):
        return [_fill_placeholders(item, settings) for item in value]
    return fills.get(value, value) if isinstance(value, str) else value


def kv_transfer_config(settings: Settings) -> Optional[dict]:
    connector = settings.profile.connector
    return None if connector is None else _fill_placeholders(connector.kv_transfer_config, settings)


def engine_flags(settings: Settings) -> list[str]:
    """The engine knobs that are set, as shell-quoted vLLM arguments; then each extra argument, quoted alone.

    Values are literal text in the script (shlex.quote: bash neither splits nor expands them), so an unset
    knob renders nothing at all.
    """
    knobs = settings.knobs
    args = []
    for name, flag in ENGINE_FLAGS.items():
        value = knobs[name]
        if value is None or value is False:
            continue
        args.append(flag if value is True else f"{flag} {shlex.quote(str(value))}")
    return args + [shlex.quote(arg) for arg in knobs["extra_engine_args"]]


def entrypoint_script(settings: Settings) -> str:
    """The in-container bash script (unescaped): the connector's prelude, then exec of the engine."""
    profile = settings.profile
    lines = ["set -e"]
    if profile.connector and profile.connector.prelude.strip():
        lines.append(profile.connector.prelude.rstrip())
    args = [profile.launcher, *profile.engine_args, *engine_flags(settings)]
    config = kv_transfer_config(settings)
    if config is not None:
        args.append("--kv-transfer-config " + shlex.quote(json.dumps(config, separators=(",", ":"))))
    lines.append("exec " + " \\\n  ".join(args))
    return "\n".join(lines) + "\n"


def env_values(settings: Settings) -> dict[str, str]:
    """NAME -> value of every env var the profile's knobs feed (what .env holds)."""
    values = {}
    for name in settings.env_knobs:
        value = settings.knobs[name]
        if name == "l2_adapter_json" and value is None:
            value = default_l2_adapter()
        values[KNOBS_BY_NAME[name].env] = env_text(value)
    return values


def dotenv_line(name: str, value: str, field: Optional[str] = None) -> str:
    """``NAME='value'`` quoted so compose v1 (python-dotenv) and v2 (compose-go) both read back ``value``.

    Single quotes keep everything literal for both except `'` and `\\`; those values go in double
    quotes with `\\` and `"` escaped. knobs.env_value_problem() refuses what neither form can carry.
    """
    problem = env_value_problem(value)
    if problem:
        raise ConfigError(
            field or name, value, f"cannot be written to .env: {problem}", "remove that character from the value"
        )
    if "'" in value or "\\" in value:
        return f'{name}="' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{name}='{value}'"


def render_env(settings: Settings) -> str:
    """.env content (the role writes it with mode ENV_FILE_MODE: it may hold a token)."""
    lines = [dotenv_line(name, value, knob_for_env(name)) for name, value in env_values(settings).items()]
    return _templates.get_template("env.j2").render(profile=settings.profile.name, lines=lines)


def labels(settings: Settings) -> dict[str, str]:
    found = {
        STACK_LABEL: STACK_NAME,
        f"{LABEL_PREFIX}.profile": settings.profile.name,
        KNOBS_HASH_LABEL: settings.knobs_hash,
    }
    if settings.model_source:
        found[MODEL_LABEL] = settings.model_source.spec
    return found


def compose_document(settings: Settings) -> dict[str, Any]:
    """compose.yml as data. Every string is escaped for compose's interpolation except the declared
    ``NAME=${NAME:-}`` lines, which are what carries .env into the container."""
    knobs = settings.knobs
    service: dict[str, Any] = {
        "image": settings.image,
        "container_name": CONTAINER_NAME,
        "network_mode": "host",
        "ipc": "host",
        "init": True,
        "restart": knobs["restart_policy"],
        "mem_limit": f"{knobs['mem_limit_gb']}g",
        "memswap_limit": f"{knobs['mem_limit_gb']}g",
        "labels": labels(settings),
        "entrypoint": ["/bin/bash", "-c"],
        "command": [entrypoint_script(settings)],
        "environment": [f"{name}={value}" for name, value in settings.profile.fixed_env.items()],
    }
    if settings.model_source:
        service["environment"] += [
            f"{name}={value}" for name, value in OFFLINE_ENV.items() if name not in settings.profile.fixed_env
        ]
    service = _escaped(service)
    service["environment"] = [f"{name}=${{{name}:-}}" for name in env_values(settings)] + service["environment"]
    # Long bind syntax: a missing source is an error, never created on the fly, so a stack whose L2
    # disk did not mount refuses to start instead of filling the root filesystem, and one whose model
    # revision is not staged refuses instead of starting on an empty directory.
    volumes = []
    if settings.l2_active:
        volumes.append(_escaped({"type": "bind", "source": knobs["l2_path"], "target": L2_CONTAINER_PATH}))
    if settings.model_source:
        volumes.append(
            _escaped({"type": "bind", "source": settings.model_dir, "target": MODEL_CONTAINER_PATH, "read_only": True})
        )
    if volumes:
        service["volumes"] = volumes
    if settings.profile.needs_gpus:
        device: dict[str, Any] = {"driver": "nvidia"}
        device.update(
            {"device_ids": [str(index) for index in settings.gpu_ids]} if settings.gpu_ids else {"count": "all"}
        )
        device["capabilities"] = ["gpu"]
        service["deploy"] = {"resources": {"reservations": {"devices": [device]}}}
    return {"services": {SERVICE_NAME: service}}


def _escaped(value: Any) -> Any:
    if isinstance(value, str):
        return compose_escape(value)
    if isinstance(value, dict):
        return {key: _escaped(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_escaped(item) for item in value]
    return value


# The header names the module by its path before rigkit/ had packages: it is part of the rendering (and so of the
# release hash every rig compares), and a rigkit upgrade must not make every deployed rig look drifted.
COMPOSE_HEADER = (
    "# Rendered by rigkit (rigkit/render.py) for profile {profile}: change profiles.yaml or the knobs, not this file.\n"
)


def render_compose(settings: Settings) -> str:
    """compose.yml: the document dumped by PyYAML (no quoting layer of rigkit's own), under a header."""
    text = yaml.safe_dump(compose_document(settings), sort_keys=False, allow_unicode=True, width=float("inf"))
    return COMPOSE_HEADER.format(profile=settings.profile.name) + text


def compose_argv(compose_command: Optional[str]) -> list[str]:
    """The compose command as argv from the rig's ComposeCommand fact ("docker compose" | "docker-compose")."""
    if compose_command not in ("docker compose", "docker-compose"):
        raise PreflightError(
            "compose",
            compose_command,
            "neither `docker compose` (v2) nor `docker-compose` (v1)",
            "install the docker compose plugin (the docker role does)",
        )
    return compose_command.split()


def detect_compose_command(has_compose_plugin: bool, docker_compose_path: Optional[str]) -> Optional[str]:
    """Prefer the v2 plugin (real rigs), fall back to standalone v1 (Debian), else None."""
    if has_compose_plugin:
        return "docker compose"
    if docker_compose_path:
        return "docker-compose"
    return None
