"""stack: the release of the rendered compose stack, the image pull before it, the engine checks."""

from __future__ import annotations

from typing import Optional

from pyinfra import host
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.facts.files import FileContents
from pyinfra.facts.server import Which

from rigkit.facts.batch import FactSpec, facts_now
from rigkit.facts.docker import ComposeCommand, ManifestProbe
from rigkit.facts.serving import serving_engine
from rigkit.operations import refusal_of, refuse
from rigkit.preflight import HostFacts, check_engine, engine_preflight, refusals
from rigkit.serving.commands import (
    COMPOSE_NOT_YET,
    RELEASE_HASH_FILE,
    l2_on_disk_command,
    record_hash_command,
    release_commands,
)
from rigkit.serving.render import KNOBS_HASH_LABEL
from rigkit.settings.hostdata import Settings


@operation()
def stack_release(
    image: str, knobs_hash: str, digest: str, url: str, timeout_s: int, l2_guard: Optional[tuple[str, str]] = None
):
    """
    Bring the rendered stack up unless the rig already runs exactly this rendering. The compose command is
    read as the release runs: an earlier role of the run may just have installed it.

    + image: the pinned image (repo@sha256:...)
    + knobs_hash: the settings' hash the running containers must carry as their label
    + digest: release_hash of the rendered compose.yml and .env
    + url: the /v1/models URL polled until the API answers
    + timeout_s: seconds to wait for it
    + l2_guard: (l2_path, mount point of the L2 disk): refuse the release when the path is not on it
    """
    stack = serving_engine(image)
    release_hash = FactSpec.of(FileContents, path=RELEASE_HASH_FILE)
    # read as the release runs, never from the preflight's memory
    now = facts_now(host, [stack, release_hash])
    containers = now[stack]["stack_containers"] if now[stack] else []
    applied = (now[release_hash] or [""])[0].strip()
    # the label catches a stack someone else re-rendered (validate.py's decode A/B runs the baseline)
    serving = bool(containers) and all(
        c["running"] and c["image"] == image and c["labels"].get(KNOBS_HASH_LABEL) == knobs_hash for c in containers
    )
    if serving and applied == digest:
        host.noop(f"stack already serving {image}")
        return
    # only a release needs it (a no-op's batch does without); an earlier role of the run may just have installed it
    compose = host.get_fact(ComposeCommand)
    if compose is None and host.state.is_executing:  # the docker role ran and left no compose: nothing stopped
        findings = check_engine(HostFacts(meminfo={}, compose_command=None))
        yield FunctionCommand(refuse, (), refusal_of(findings))
        return
    if l2_guard:
        yield l2_on_disk_command(*l2_guard)
    yield record_hash_command(None)
    yield from release_commands(compose or COMPOSE_NOT_YET, image, False, url, timeout_s)


# The pull's step name (roles/serving.py): rigkit.fleet.outcome words a failed pull by what docker said of the registry.
PULL_STEP = "Pull the image (the old stack keeps serving)"


@operation()
def image_pulled(image: str):
    """
    Pull the pinned image unless the rig has it: before anything is stopped, and fatal for the rig when
    it fails (the old stack keeps serving).

    + image: the pinned image (repo@sha256:...)
    """
    spec = serving_engine(image)
    engine = host.get_fact(spec.fact, **dict(spec.kwargs))
    if engine and engine["image_present"]:
        host.noop(f"{image} already on the rig")
        return
    yield StringCommand("docker", "pull", QuoteString(image))


def engine_facts_now(image: str) -> HostFacts:
    """What the engine checks read, as the rig answers now (one round trip; the registry probe only when
    the image is not on the rig)."""
    which, compose, present = (
        FactSpec.of(Which, command="docker"),
        FactSpec.of(ComposeCommand),
        serving_engine(image),
    )
    now = facts_now(host, [which, compose, present])
    has_engine = now[which] is not None
    image_present = bool(has_engine and now[present] and now[present]["image_present"])
    return HostFacts(
        meminfo={},
        has_engine=has_engine,
        compose_command=now[compose],
        image_present=image_present,
        image_probe_error=host.get_fact(ManifestProbe, image=image) if has_engine and not image_present else None,
    )


@operation()
def engine_checked(settings: Settings):
    """
    The engine, compose and image checks, read once the earlier roles ran (the docker role installed the
    engine in this run): a refusal fails the rig before the serving role changes anything.

    + settings: the rig's settings (its image, ``force``)
    """
    if not host.state.is_executing:  # --dry: the engine is not there yet, the check runs with the deploy
        host.noop("engine, compose and image are checked once the docker role ran")
        return
    findings = engine_preflight(settings, engine_facts_now(settings.image))
    refused = refusals(findings)
    if refused:
        yield FunctionCommand(refuse, (), refusal_of(refused))
        return
    host.noop("; ".join(f.message for f in findings))
