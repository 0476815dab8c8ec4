"""`rigkit resolve-model SOURCE`: print the pinned model_source for a hub branch or tag, or a controller directory.

rigkit resolve-model Qwen/Qwen3-8B          -> Qwen/Qwen3-8B@<40-hex commit of main>
rigkit resolve-model Qwen/Qwen3-8B@v1.0     -> the commit the tag points at
rigkit resolve-model controller:/srv/tiny   -> controller:/srv/tiny@<manifest sha256> (writes the manifest)
rigkit resolve-model shared:/mnt/models/x   -> shared:/mnt/models/x@<manifest sha256>, hashed where the controller
                                               mounts the share at the same path as the rigs (writes the manifest)
"""

from __future__ import annotations

import argparse
import sys

from rigkit.errors import ConfigError, RigkitError
from rigkit.model.hub import resolve_revision
from rigkit.settings.model_source import (
    CONTROLLER_PREFIX,
    SHARED,
    SHARED_PREFIX,
    ModelSource,
    check_directory,
    hub_repo_problem,
    parse_model_source,
    resolve_directory,
)


def resolve_model(value: str) -> str:
    """The pin for ``value``; ConfigError for what a deploy would refuse, with the deploy's words, before the
    directory is hashed or the hub asked (the pin printed is parsed as a deploy parses it, too)."""
    pin = _pin(value)
    parse_model_source(pin)
    return pin


def _pin(value: str) -> str:
    if value.startswith(CONTROLLER_PREFIX):
        return resolve_directory(value[len(CONTROLLER_PREFIX) :].rsplit("@", 1)[0]).spec
    if value.startswith(SHARED_PREFIX):
        path = value[len(SHARED_PREFIX) :].rsplit("@", 1)[0]
        check_directory(value, SHARED, path)
        try:
            pinned = resolve_directory(path)
        except ConfigError as exc:
            raise ConfigError(
                "model_source",
                value,
                f"{exc.problem} (a shared model is pinned where the controller mounts the share at the rigs' path)",
                f"mount the share on the controller at {path} and run again; or read the hash a rig reports: "
                f"`rigkit stage` with {SHARED_PREFIX}{path}@<any 64 hex> names the hash the rig's files have",
            ) from None
        # the path as the rigs mount it (not the controller's resolved one: a symlink there is not one on a rig)
        return ModelSource(SHARED, path.rstrip("/"), pinned.revision).spec
    repo, _, revision = value.partition("@")
    problem = hub_repo_problem(repo)
    if problem:
        raise ConfigError("model_source", value, problem, "write it as org/name[@BRANCH|TAG]")
    return f"{repo}@{resolve_revision(repo, revision or 'main')}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "sources", nargs="+", metavar="SOURCE", help="ORG/NAME[@BRANCH|TAG], controller:/DIR or shared:/DIR"
    )


def run(args: argparse.Namespace) -> int:
    status = 0
    for value in args.sources:
        try:
            print(resolve_model(value))
        except RigkitError as exc:
            print(f"rigkit resolve-model: {exc}", file=sys.stderr)
            status = 1
    return status
