"""The roles a rig's model store needs before anything is staged there, run by `rigkit deploy` ahead of staging.

A fresh rig's default model store (``<l2_mount_point>/models``) is on the L2 NVMe, which the l2_disk role formats and
mounts during the deploy: staged before, the copy would be hidden under the mount (rigkit.model.stage
refuses it). So `rigkit deploy` first runs deploy.py on those rigs up to STORE_ROLES_UNTIL (DEPLOY_UNTIL_ENV tells
deploy.py where to stop), then stages, then runs the whole deploy: one command from a bare rig to serving.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from rigkit.errors import ConfigError

# deploy.py runs roles.PIPELINE up to and including the role this names, and nothing after it
DEPLOY_UNTIL_ENV = "RIGKIT_DEPLOY_UNTIL"
# the last role a model store on the L2 disk needs: it formats and mounts the disk
STORE_ROLES_UNTIL = "l2_disk"


def roles_until(pipeline: Sequence[str], environ: Mapping[str, str]) -> tuple[str, ...]:
    """The roles of ``pipeline`` this run deploys: all of them, or up to DEPLOY_UNTIL_ENV's role."""
    until = environ.get(DEPLOY_UNTIL_ENV)
    if not until:
        return tuple(pipeline)
    if until not in pipeline:
        raise ConfigError(
            DEPLOY_UNTIL_ENV, until, "is no role of the pipeline", f"name one of {', '.join(pipeline)}, or unset it"
        )
    return tuple(pipeline[: pipeline.index(until) + 1])
