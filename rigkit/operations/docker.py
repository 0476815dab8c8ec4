"""docker: daemon.json merged without clobbering foreign keys, the engine checked by running a container."""

from __future__ import annotations

import json
from io import StringIO
from typing import Optional

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.files import FileContents
from pyinfra.operations import files

from rigkit.errors import PreflightError
from rigkit.facts.docker import DockerEngine, DockerLocalImages, DockerRunCheck
from rigkit.operations import fail, say


def read_json_file(path: str) -> dict:
    """The JSON object in a file on the host ({} when absent or empty); PreflightError if broken."""
    text = "\n".join(host.get_fact(FileContents, path=path) or [])
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PreflightError(
            path,
            text[:80],
            f"not valid JSON ({exc})",
            f"repair or remove {path}; rigkit merges into it and will not guess",
        ) from None
    if not isinstance(value, dict):
        raise PreflightError(path, text[:80], "not a JSON object", f"make {path} a JSON object")
    return value


def merge_options(current: dict, wanted: dict) -> dict:
    """``current`` with ``wanted`` laid over it; nested objects merge key by key, other keys stay."""
    merged = dict(current)
    for key, value in wanted.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_options(merged[key], value)
        else:
            merged[key] = value
    return merged


def render_json(value: dict) -> str:
    return json.dumps(value, indent=2, sort_keys=True) + "\n"


@operation()
def json_file_merged(path: str, options: dict):
    """
    Merge ``options`` into the JSON object in ``path`` and write it only if that changes it.

    + path: the JSON file (e.g. /etc/docker/daemon.json)
    + options: keys rigkit owns; every other key in the file is kept as it is
    """
    current = read_json_file(path)
    merged = merge_options(current, options)
    # an absent file reads as {}: it is written exactly when there are options to put in it
    if merged == current:
        host.noop(f"{path} has {', '.join(sorted(options))}" if options else f"no options to merge into {path}")
        return
    yield from files.put._inner(src=StringIO(render_json(merged)), dest=path, mode="644")


def pick_verify_image(image: Optional[str]) -> Optional[str]:
    """The image to run a check container from: the declared one, else one already on the host."""
    if image:
        return image
    local = host.get_fact(DockerLocalImages)
    return local[0] if local else None


@operation()
def docker_engine_verified(image: Optional[str], image_field: str):
    """
    Check: the engine answers ``docker info`` and runs a container from ``image``.

    + image: image to run (``true`` inside, host network); None = an image already on the host,
      and when there is none the run step is skipped with a notice (no registry is contacted)
    + image_field: the variable that sets ``image``, named in errors
    """
    yield from ()  # a check: it never yields a command
    if not host.state.is_executing:
        host.noop("the engine is checked while the deploy runs")
        return
    engine = host.get_fact(DockerEngine)
    if engine is None or engine["error"]:
        problem = "no docker CLI" if engine is None else f"the engine does not answer: {engine['error']}"
        raise fail("docker", "engine", problem, "see `journalctl -u docker` on the host")
    chosen = pick_verify_image(image)
    if chosen is None:
        say(
            host,
            f"docker {engine['server_version']} answers; no local image to run a container from, "
            f"run check skipped (set {image_field} to check it)",
        )
        return
    run = host.get_fact(DockerRunCheck, image=chosen)
    if not run["ok"]:
        raise fail(
            image_field,
            chosen,
            f"the engine cannot run a container: {run['output'][-300:]}",
            f"fix the engine, or set {image_field} to an image that has /bin/true",
        )
    host.noop(f"docker {engine['server_version']} answers and runs a container from {chosen}")
