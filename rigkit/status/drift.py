"""Drift: what a rig runs against what today's data renders, each difference named by the knob it is about.
"Today's data" is what the inventory, group_data and --data of this `rigkit status` run render now: what the next
deploy would put on the rig.

The running image against the declared one; the rig's compose.yml and .env against today's rendering, per knob;
the files against the release hash recorded when they were verified (an edit by hand); the container's
environment and labels against the declared stack. Secrets are compared, never shown."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import yaml

from rigkit.serving.ledger import SHORT_DIGEST, Rendering, parse_dotenv, release_hash
from rigkit.serving.render import KNOBS_HASH_LABEL, LABEL_PREFIX, SERVICE_NAME
from rigkit.settings.knobs import ENGINE_FLAGS, SECRET_ENV_NAMES, knob_for_env, redacted
from rigkit.status.probe import Container

SHOWN_VALUE_CHARS = 60

# compose.yml service keys (rigkit.serving.render.compose_document) and the knob each carries.
COMPOSE_KEY_KNOBS = {
    "image": "serving_image",
    "restart": "restart_policy",
    "mem_limit": "mem_limit_gb",
    "memswap_limit": "mem_limit_gb",
    "volumes": "l2_path",
    "deploy": "gpu_mask",
}
FLAG_KNOBS = {flag: knob for knob, flag in ENGINE_FLAGS.items()} | {"--kv-transfer-config": "serving_profile"}

PROFILE_LABEL = f"{LABEL_PREFIX}.profile"


@dataclass(frozen=True)
class Drift:
    """One difference between the rig and today's data: ``source`` (image, files, .env, compose, container),
    the knob (or env var, compose key) it is about, and both sides as shown (secrets never)."""

    source: str
    knob: str
    rig: str
    today: str

    def line(self) -> str:
        return f"{self.source}: {self.knob}: the rig has {self.rig}; today's data renders {self.today}"


def for_reading(drifts: Sequence[Drift]) -> list[Drift]:
    """The drift as status prints it: one line per knob, naming every place it differs (a new serving_image is in
    the running image and in compose.yml: one line, "image, compose"), the values of the first place (the image's
    are whole); the knobs-hash label only when no knob explains it (it changes with every knob)."""
    by_knob: dict[str, list[Drift]] = {}
    for drift in drifts:
        by_knob.setdefault(drift.knob, []).append(drift)
    knobs_hash = f"label {KNOBS_HASH_LABEL}"
    if len(by_knob) > 1:
        by_knob.pop(knobs_hash, None)
    return [
        Drift(", ".join(dict.fromkeys(d.source for d in group)), knob, group[0].rig, group[0].today)
        for knob, group in by_knob.items()
    ]


def _shown(env: str, value: Optional[str]) -> str:
    """A value as status prints it: a secret as <secret> (or <unset>), others quoted and cut."""
    if value is None:
        return "<unset>"
    if env in SECRET_ENV_NAMES:
        return str(redacted(env, value)) if value else "<unset>"
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= SHOWN_VALUE_CHARS else text[: SHOWN_VALUE_CHARS - 1] + "…"


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
        return [
            Drift("files", "release hash", "none recorded (the last release was not verified)", actual[:SHORT_DIGEST])
        ]
    if recorded != actual:
        return [
            Drift(
                "files",
                "release hash",
                f"hash {actual[:SHORT_DIGEST]} (changed since verified)",
                f"verified {recorded[:SHORT_DIGEST]}",
            )
        ]
    return []


def env_values_drift(source: str, rig: Mapping[str, str], today: Mapping[str, str]) -> list[Drift]:
    """Per env var of today's rendering (and any the rig has beyond it): the knob whose values differ."""
    return [
        Drift(source, knob_for_env(name), _shown(name, rig.get(name)), _shown(name, today.get(name)))
        for name in sorted(set(today) | set(rig))
        if rig.get(name) != today.get(name)
    ]


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
    return repr(text if len(text) <= SHOWN_VALUE_CHARS else text[: SHOWN_VALUE_CHARS - 1] + "…")


def _command_drift(rig: list, today: list) -> list[Drift]:
    rig_flags, today_flags = _flags(" ".join(map(str, rig))), _flags(" ".join(map(str, today)))
    found = [
        Drift(
            "compose",
            FLAG_KNOBS.get(flag, f"command {flag}"),
            _compact(rig_flags.get(flag, "<absent>")),
            _compact(today_flags.get(flag, "<absent>")),
        )
        for flag in sorted(set(rig_flags) | set(today_flags))
        if rig_flags.get(flag, 0) != today_flags.get(flag, 0)
    ]
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
            found += [
                Drift(
                    "compose",
                    knob_for_env(name),
                    "declared" if name in names(mine) else "not declared",
                    "declared" if name in names(theirs) else "not declared",
                )
                for name in sorted(names(mine) ^ names(theirs))
            ]
        elif key == "labels":
            found += [
                Drift("compose", f"label {name}", _compact((mine or {}).get(name)), _compact((theirs or {}).get(name)))
                for name in sorted(set(mine or {}) | set(theirs or {}))
                if (mine or {}).get(name) != (theirs or {}).get(name)
            ]
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
    found = env_values_drift(
        "container", {name: container.env[name] for name in declared if name in container.env}, declared
    )
    profile = container.labels.get(PROFILE_LABEL)
    if profile != today.profile:
        found.append(Drift("container", "serving_profile", _compact(profile), _compact(today.profile)))
    knobs_hash = container.labels.get(KNOBS_HASH_LABEL)
    if not found and knobs_hash != today.knobs_hash:
        found.append(Drift("container", f"label {KNOBS_HASH_LABEL}", _compact(knobs_hash), _compact(today.knobs_hash)))
    return found


def model_check(section: Optional[str]) -> Optional[dict]:
    """The rig's answer to rigkit/files/model_store.py check (its last line: staged, damaged files); None when it
    cannot be read."""
    try:
        answer = json.loads((section or "").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return answer if isinstance(answer, dict) else None


def model_drift(section: Optional[str], declared: str) -> list[Drift]:
    """The rig's staged model (rigkit/files/model_store.py check: staged, damaged files) against model_source."""
    answer = model_check(section)
    if answer is None:
        return [Drift("model", "model_source", "<not readable>", declared)]
    if not answer.get("staged"):
        return [Drift("model", "model_source", "<not staged>", declared)]
    return [
        Drift("model", f"model_source: {item['path']}", item["why"], "as the manifest")
        for item in answer.get("damaged", [])
    ]
