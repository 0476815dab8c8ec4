"""Facts about the serving stack on the rig: its containers, found by rigkit's stack label, and the engine
as the stack needs it."""

from __future__ import annotations

import json
import shlex
from typing import Optional

from pyinfra.api import FactBase

from rigkit.facts.batch import FactSpec
from rigkit.facts.docker import DockerEngine, DockerImagePresent, DockerLocalImages
from rigkit.files import engine_api
from rigkit.paths import FILES_DIR, STACK_LABEL, STACK_NAME


class StackContainers(FactBase):
    """``docker inspect`` of every container (running or not) that carries rigkit's stack label."""

    def requires_command(self, *args, **kwargs) -> str:
        return "docker"

    def command(self, stack: str) -> str:
        selector = shlex.quote(f"label={STACK_LABEL}={stack}")
        return f"ids=$(docker ps -aq --filter {selector}); [ -z \"$ids\" ] && echo '[]' || docker inspect $ids"

    def process(self, output):
        return [
            {
                "id": c["Id"][:12],
                "name": c["Name"].lstrip("/"),
                "image": c["Config"]["Image"],
                "labels": c["Config"].get("Labels") or {},
                "running": bool(c["State"].get("Running")),
                "status": c["State"].get("Status"),
            }
            for c in json.loads("".join(output))
        ]


ENGINE_API_SCRIPT = (FILES_DIR / "engine_api.py").read_text()

# Ends each part of ServingEngine's output; no line of theirs can be it (JSON strings are quoted, tags have a colon).
ENGINE_SECTION_END = "--rigkit-engine-section--"
# How the script's version part starts when it is the engine's Server header
ENGINE_SERVER_PREFIX = engine_api.SERVER_PREFIX.decode()


def engine_parts(output: list[str]) -> list[list[str]]:
    """ServingEngine's output cut into its four parts as the docker CLI prints them: `docker info`'s, the tagged
    images, the pinned image's presence, the stack containers' inspect JSON (a part the output lacks is empty).
    The API script's answers (its first line ``ENGINE_SECTION_END api``) are read here, on the controller."""
    api = bool(output) and output[0].strip() == f"{ENGINE_SECTION_END} api"
    parts: list[list[str]] = [[]]
    for line in output[1:] if api else output:
        if line.strip() == ENGINE_SECTION_END:
            parts.append([])
        else:
            parts[-1].append(line)
    parts = (parts + [[], [], []])[:4]
    return _cli_parts(parts) if api else parts


def _json_values(lines: list[str]) -> list:
    """Every JSON value in ``lines``, one after another (the engine writes each answer on one line)."""
    text, decoder, values, at = "\n".join(lines), json.JSONDecoder(), [], 0
    while at < len(text):
        if text[at].isspace():
            at += 1
            continue
        value, at = decoder.raw_decode(text, at)
        values.append(value)
    return values


def _engine_version(lines: list[str]) -> str:
    """The version in the engine's Server header ("Docker/20.10.24+dfsg1 (linux)": up to its first space), else in
    GET /version's answer."""
    first = lines[0].strip()
    if first.startswith(ENGINE_SERVER_PREFIX):
        return first[len(ENGINE_SERVER_PREFIX) :].partition(" ")[0]
    return _json_values(lines)[0]["Version"]


def _cli_parts(parts: list[list[str]]) -> list[list[str]]:
    """The engine API's answers (its version, GET /images/json, presence, each container's inspect) as the CLI
    commands of ServingEngine's fallback print them."""
    version, images, present, containers = parts
    tags = [tag for image in (_json_values(images) or [[]])[0] for tag in image.get("RepoTags") or []]
    return [
        [_engine_version(version), "exit=0"] if version else [],
        tags,  # DockerLocalImages drops "<none>"
        present,
        [json.dumps(_json_values(containers))],  # no container: "[]", as the fact's CLI command prints
    ]


class ServingEngine(FactBase):
    """{"engine", "local_images", "image_present", "stack_containers"}: what DockerEngine, DockerLocalImages,
    DockerImagePresent and StackContainers read, in one process on the rig (rigkit/files/engine_api.py reads
    the engine's API on its local socket), or through the docker CLI where that script cannot (each fact's own
    command). ``image`` None: image_present is False, not read. None without a docker CLI."""

    def requires_command(self, *args, **kwargs) -> str:
        return "docker"

    def command(self, image: Optional[str], stack: str) -> str:
        end = f"echo {ENGINE_SECTION_END}"
        cli = [DockerEngine().command(), DockerLocalImages().command()]
        cli.append(DockerImagePresent().command(image) if image else "true")
        cli.append(StackContainers().command(stack))
        fallback = "; ".join(f"{{ {part}; }}; {end}" for part in cli)
        arguments = " ".join(shlex.quote(a) for a in (ENGINE_SECTION_END, image or "", f"{STACK_LABEL}={stack}"))
        return f"python3 -I -S -c {shlex.quote(ENGINE_API_SCRIPT)} {arguments} 2>/dev/null || {{ {fallback}; }}"

    def process(self, output: list[str]) -> dict:
        engine, images, present, containers = engine_parts(output)
        return {
            "engine": DockerEngine().process(engine),
            "local_images": DockerLocalImages().process(images),
            "image_present": DockerImagePresent().process(present),
            "stack_containers": StackContainers().process(containers),
        }


def serving_engine(image: Optional[str]) -> FactSpec:
    """The engine as the survey and the serving operations read it: the pinned image and rigkit's stack."""
    return FactSpec.of(ServingEngine, image=image, stack=STACK_NAME)
