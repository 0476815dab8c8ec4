"""`rigkit resolve-model SOURCE`: print the pinned model_source for a hub branch or tag, or a controller directory.

rigkit resolve-model Qwen/Qwen3-8B          -> Qwen/Qwen3-8B@<40-hex commit of main>
rigkit resolve-model Qwen/Qwen3-8B@v1.0     -> the commit the tag points at
rigkit resolve-model controller:/srv/tiny   -> controller:/srv/tiny@<manifest sha256> (writes the manifest)
"""

from __future__ import annotations

import argparse
import sys

from rigkit.errors import RigkitError
from rigkit.model.hub import resolve_revision
from rigkit.model.source import CONTROLLER_PREFIX, resolve_directory


def resolve_model(value: str) -> str:
    if value.startswith(CONTROLLER_PREFIX):
        return resolve_directory(value[len(CONTROLLER_PREFIX) :].rsplit("@", 1)[0]).spec
    repo, _, revision = value.partition("@")
    return f"{repo}@{resolve_revision(repo, revision or 'main')}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sources", nargs="+", metavar="SOURCE", help="ORG/NAME[@BRANCH|TAG] or controller:/DIR")


def run(args: argparse.Namespace) -> int:
    status = 0
    for value in args.sources:
        try:
            print(resolve_model(value))
        except RigkitError as exc:
            print(f"rigkit resolve-model: {exc}", file=sys.stderr)
            status = 1
    return status
