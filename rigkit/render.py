"""Render a serving stack: compose.yml and .env from validated Settings.

Decisions live here; the templates only lay out values that this module has already quoted.
Every env var of the profile's knobs is declared in ``environment:`` as ``NAME=${NAME:-}`` and
written to .env, so a knob set in host data always reaches the container.
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Optional

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from rigkit.errors import ConfigError, PreflightError
from rigkit.hostdata import Settings
from rigkit.knobs import KNOBS_BY_NAME, env_text, env_value_problem
from rigkit.paths import TEMPLATES_DIR
from rigkit.sizing import GB

COMPOSE_PROJECT = "rigkit"
SERVICE_NAME = "serving"
CONTAINER_NAME = "rigkit-serving"
LABEL_PREFIX = "org.rigkit"
STACK_LABEL = f"{LABEL_PREFIX}.stack"  # finds the stack's containers (rigkit.facts.stack.StackContainers)
STACK_NAME = "serving"  # the STACK_LABEL value
KNOBS_HASH_LABEL = f"{LABEL_PREFIX}.knobs-hash"
L2_CONTAINER_PATH = "/kv-store"
COMPOSE_FILE_NAME = "compose.yml"
ENV_FILE_NAME = ".env"
ENV_FILE_MODE = 0o600

_templates = Environment(loader=FileSystemLoader(str(TEMPLATES_DIR)), undefined=StrictUndefined,
                         trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)


def yaml_scalar(value: Any) -> str:
    """A YAML double-quoted scalar (JSON strings are valid YAML): no value can break the layout."""
    return json.dumps(str(value))


def compose_escape(text: str) -> str:
    """In-container text for compose: `$` becomes `$$` so compose passes it through uninterpolated."""
    return text.replace("$", "$$")


def default_l2_adapter() -> str:
    return json.dumps({"type": "fs", "base_path": L2_CONTAINER_PATH}, separators=(",", ":"))


def _fill_placeholders(value: Any, settings: Settings) -> Any:
    fills = {"@l1_bytes": settings.l1_gb * GB, "@l2_dir": L2_CONTAINER_PATH}
    if isinstance(value, dict):
        return {key: _fill_placeholders(item, settings) for key, item in value.items()}
    if isinstance(value, list):
        return [_fill_placeholders(item, settings) for item in value]
    return fills.get(value, value) if isinstance(value, str) else value


def kv_transfer_config(settings: Settings) -> Optional[dict]:
    connector = settings.profile.connector
    return None if connector is None else _fill_placeholders(connector.kv_transfer_config, settings)


def entrypoint_script(settings: Settings) -> str:
    """The in-container bash script (unescaped): the connector's prelude, then exec of the engine."""
    profile = settings.profile
    lines = ["set -e"]
    if profile.connector and profile.connector.prelude.strip():
        lines.append(profile.connector.prelude.rstrip())
    args = [profile.launcher, *profile.engine_args]
    config = kv_transfer_config(settings)
    if config is not None:
        args.append("--kv-transfer-config " + shlex.quote(json.dumps(config, separators=(",", ":"))))
    lines.append("exec " + " \\\n  ".join(args))
    return "\n".join(lines) + "\n"


def env_values(settings: Settings) -> dict[str, str]:
    """NAME -> value of every env var the profile's knobs feed (what .env holds)."""
    values = {}
    for name in settings.profile.env_knobs:
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
        raise ConfigError(field or name, value, f"cannot be written to .env: {problem}",
                          "remove that character from the value")
    if "'" in value or "\\" in value:
        return f'{name}="' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{name}='{value}'"


def _knob_for_env(env: str) -> str:
    return next((k.name for k in KNOBS_BY_NAME.values() if k.env == env), env)


def render_env(settings: Settings) -> str:
    """.env content (the role writes it with mode ENV_FILE_MODE: it may hold a token)."""
    lines = [dotenv_line(name, value, _knob_for_env(name)) for name, value in env_values(settings).items()]
    return _templates.get_template("env.j2").render(profile=settings.profile.name, lines=lines)


def labels(settings: Settings) -> dict[str, str]:
    return {STACK_LABEL: STACK_NAME,
            f"{LABEL_PREFIX}.profile": settings.profile.name,
            KNOBS_HASH_LABEL: settings.knobs_hash}


def environment_lines(settings: Settings) -> list[str]:
    declared = [f"{name}=${{{name}:-}}" for name in env_values(settings)]
    fixed = [f"{name}={compose_escape(value)}" for name, value in settings.profile.fixed_env.items()]
    return declared + fixed


def compose_context(settings: Settings) -> dict[str, Any]:
    """Plain, pre-quoted values for templates/compose.yml.j2."""
    knobs = settings.knobs
    gpu = None
    if settings.profile.needs_gpus:
        gpu = {"device_ids": [yaml_scalar(index) for index in settings.gpu_ids]}
    # Long bind syntax: a missing source is an error, never created on the fly, so a stack whose L2
    # disk did not mount refuses to start instead of filling the root filesystem.
    volumes = ([{"source": yaml_scalar(knobs["l2_path"]), "target": yaml_scalar(L2_CONTAINER_PATH)}]
               if settings.l2_active else [])
    return {
        "profile": settings.profile.name,
        "service": SERVICE_NAME,
        "container_name": yaml_scalar(CONTAINER_NAME),
        "image": yaml_scalar(settings.image),
        "restart": yaml_scalar(knobs["restart_policy"]),
        "mem_limit": yaml_scalar(f"{knobs['mem_limit_gb']}g"),
        "labels": [(yaml_scalar(key), yaml_scalar(value)) for key, value in labels(settings).items()],
        "entrypoint": [yaml_scalar("/bin/bash"), yaml_scalar("-c")],
        "command": [yaml_scalar(compose_escape(entrypoint_script(settings)))],
        "environment": [yaml_scalar(line) for line in environment_lines(settings)],
        "volumes": volumes,
        "gpu": gpu,
    }


def render_compose(settings: Settings) -> str:
    return _templates.get_template("compose.yml.j2").render(**compose_context(settings))


def compose_argv(compose_command: Optional[str]) -> list[str]:
    """The compose command as argv from the rig's ComposeCommand fact ("docker compose" | "docker-compose")."""
    if compose_command not in ("docker compose", "docker-compose"):
        raise PreflightError("compose", compose_command, "neither `docker compose` (v2) nor `docker-compose` (v1)",
                             "install the docker compose plugin (the docker role does)")
    return compose_command.split()


def detect_compose_command(has_compose_plugin: bool, docker_compose_path: Optional[str]) -> Optional[str]:
    """Prefer the v2 plugin (real rigs), fall back to standalone v1 (Debian), else None."""
    if has_compose_plugin:
        return "docker compose"
    if docker_compose_path:
        return "docker-compose"
    return None
