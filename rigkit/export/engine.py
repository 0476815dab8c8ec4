"""The engine's command line and environment as an SSH rig's container gets them, as plain data.

rigkit.serving.render writes them as a bash entrypoint (the profile's shell text reading env vars, then the engine
knobs' flags) and a .env file; a target that takes an argv and an env list (production-stack's modelSpec) needs the
words bash would pass. ``launch_argv`` expands the profile's text the way bash does for the two forms profiles.yaml
uses ("${NAME}" or "$NAME" inside double quotes, and ${NAME:+WORDS}); tests/export/test_engine.py holds it to what
bash itself launches from the rendered script.
"""

from __future__ import annotations

import json
import re
import shlex

from rigkit.errors import ConfigError
from rigkit.serving.render import engine_flags, env_values, kv_transfer_config
from rigkit.settings.hostdata import Settings
from rigkit.settings.model_source import OFFLINE_ENV

_SET_ALTERNATIVE = re.compile(r"\$\{(\w+):\+([^}]*)\}")
_QUOTED_REFERENCE = re.compile(r'"\$(?:\{(\w+)\}|(\w+))"')
_ANY_REFERENCE = re.compile(r"\$(?:\{|\w)")


def _double_quoted(value: str) -> str:
    """``value`` as the inside of a double-quoted shell word (bash removes these escapes)."""
    return re.sub(r'(["\\$`])', r"\\\1", value)


def expand(text: str, env: dict[str, str]) -> list[str]:
    """The words bash makes of one line of a profile's shell text under ``env``; ConfigError for a reference in a
    form not expanded here (bash would read it some other way than this function)."""
    text = _SET_ALTERNATIVE.sub(lambda m: m.group(2) if env.get(m.group(1)) else "", text)
    text = _QUOTED_REFERENCE.sub(lambda m: '"' + _double_quoted(env.get(m.group(1) or m.group(2), "")) + '"', text)
    if _ANY_REFERENCE.search(text.replace("\\$", "")):
        raise ConfigError(
            "profiles.yaml",
            text,
            "holds a variable reference outside double quotes or ${NAME:+...}: its expansion depends on word "
            "splitting, which the export does not imitate",
            'write it as "${NAME}" (profiles.yaml)',
        )
    return shlex.split(text)


def container_env(settings: Settings) -> dict[str, str]:
    """NAME -> value of every env var the rig's container gets: the knobs' (.env), the profile's fixed ones, and
    the hub switched off where a pinned model is mounted (rigkit.serving.render.compose_document)."""
    env = {**env_values(settings), **settings.profile.fixed_env}
    if settings.model_source:
        env.update({name: value for name, value in OFFLINE_ENV.items() if name not in settings.profile.fixed_env})
    return env


def launch_argv(settings: Settings) -> list[str]:
    """The engine's argv as the rig's entrypoint execs it: the launcher, the profile's arguments, the engine knobs'
    flags and the connector's --kv-transfer-config (rigkit.serving.render.entrypoint_script)."""
    env = container_env(settings)
    words = expand(settings.profile.launcher, env)
    for line in settings.profile.engine_args:
        words += expand(line, env)
    for flag in engine_flags(settings):
        words += shlex.split(flag)
    config = kv_transfer_config(settings)
    if config is not None:
        words += ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
    return words


def flag_pairs(argv: list[str]) -> list[tuple[str, object]]:
    """(--flag, value or True for a bare flag) in order, from an argv of flags only; ConfigError for a word that
    is neither a flag nor a flag's value."""
    pairs: list[tuple[str, object]] = []
    index = 0
    while index < len(argv):
        word = argv[index]
        if not word.startswith("-"):
            raise ConfigError("engine argv", word, "is not a flag", "report it: the rendering changed shape")
        if "=" in word:
            pairs.append(tuple(word.split("=", 1)))  # type: ignore[arg-type]
        elif index + 1 < len(argv) and not argv[index + 1].startswith("--"):
            pairs.append((word, argv[index + 1]))
            index += 1
        else:
            pairs.append((word, True))
        index += 1
    return pairs
