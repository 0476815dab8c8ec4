"""The serving stack on a rig: where its files live and the commands that release it.

Pure: paths and command text only; rigkit.operations.serving and rigkit.serving.release_steps run them, roles/serving.py
sequences them.
"""

from __future__ import annotations

import shlex
from typing import Optional

from rigkit.paths import FILES_DIR, RIG_LIB_DIR, RIG_RELEASES_DIR, RIG_STACK_DIR, RIG_STATE_DIR
from rigkit.remote.tunnel import rig_local_url
from rigkit.serving.ledger import LEDGER_PATH, Rendering, rendering_dir
from rigkit.serving.render import (
    COMPOSE_FILE_NAME,
    COMPOSE_PROJECT,
    ENV_FILE_MODE,
    ENV_FILE_NAME,
    STACK_LABEL,
    STACK_NAME,
    render_compose,
    render_env,
)
from rigkit.settings.hostdata import Settings

RELEASE_HASH_FILE = f"{RIG_STATE_DIR}/release.sha256"


# What --dry shows for the compose command of a rig the docker role has yet to give one (read when it runs)
COMPOSE_NOT_YET = "<compose, once the docker role installed it>"


WAIT_READY_SCRIPT = f"{RIG_LIB_DIR}/wait_ready.py"


WAIT_READY_SOURCE = FILES_DIR / "wait_ready.py"


def ready_url(rendering: Rendering) -> str:
    """Where wait_ready.py, on the rig, polls the API (an IPv6 bind in brackets: http://[::1]:8000/...)."""
    return rig_local_url(rendering.knob("bind_address"), int(rendering.knob("serving_port")), "/v1/models")


def in_stack(compose: str) -> str:
    """The rig's compose command (``docker compose`` or ``docker-compose``) on rigkit's project."""
    return f"cd {RIG_STACK_DIR} && {compose} -p {COMPOSE_PROJECT}"


# What a stopped engine leaves in the rig's /dev/shm (`ipc: host`), one pattern a line: a restart removes each file
# no process maps or holds open (it belongs to an engine no longer running; one a process maps is never touched), and
# `rigkit status` names those left while the stack runs.
STALE_SHM_GLOBS = (
    # vLLM 0.26's TieringOffloadingSpec CPU tier, vllm_offload_<engine id>.mmap (size cpu_bytes_to_use), never removed
    # when stopped (SIGTERM aborts with shutdown timeout 0): l1_size_gb of RAM at each down (H200, 2026-12-03)
    "/dev/shm/vllm_offload_*.mmap",
    # a POSIX semaphore of Python's multiprocessing (sem.mp-<random>), one more at every engine start (issue 43)
    "/dev/shm/sem.mp-*",
    # every LMCache server and LMCache-MP engine: its CUDA IPC segment cuda.shm.0.<pid>.1 and torch's shared tensors
    # torch_<pid>_*, ~80 KB each, left at every stop (H100, issue 39: 21 after three short runs)
    "/dev/shm/cuda.shm.*",
    "/dev/shm/torch_*",
)


def _each_stale_segment(action: str) -> str:
    """Run `action` on each file of STALE_SHM_GLOBS ($f) that no process maps or holds open."""
    return (
        f'for f in {" ".join(STALE_SHM_GLOBS)}; do [ -f "$f" ] || continue; '
        'if grep -qsF "$f" /proc/[0-9]*/maps || '
        'find /proc/[0-9]*/fd -lname "$f" -print -quit 2>/dev/null | grep -q .; then continue; fi; '
        f"{action}; done"
    )


def shm_cleanup_command() -> str:
    """Remove stopped engines' files from /dev/shm (STALE_SHM_GLOBS no process maps or holds), printing each."""
    return _each_stale_segment('rm -f -- "$f" && echo "removed stale $f"')


def stale_shm_command() -> str:
    """List stopped engines' files in /dev/shm (STALE_SHM_GLOBS) as `BYTES PATH` lines (rigkit status, while the
    stack runs too)."""
    return _each_stale_segment("stat -c '%s %n' \"$f\"")


def restart_commands(compose: str) -> list[str]:
    """A full ``down``, the files the stopped engine left in /dev/shm (STALE_SHM_GLOBS) removed, then ``up -d``:
    never ``docker restart``, which races the release of GPU memory."""
    return [f"{in_stack(compose)} down --remove-orphans", shm_cleanup_command(), f"{in_stack(compose)} up -d"]


def validate_command(compose: str) -> str:
    """The rig's own compose reads the new files; an invalid one fails here, before the old stack stops."""
    return f"{in_stack(compose)} config -q"


def release_commands(compose: str, image: str, pull: bool, url: str, timeout_s: int) -> list[str]:
    """Pull first (the old stack keeps serving meanwhile), have the rig's compose validate the files, then
    down, up -d, wait until the API answers."""
    commands = [f"docker pull {shlex.quote(image)}"] if pull else []
    return (
        commands
        + [validate_command(compose)]
        + restart_commands(compose)
        + [
            f"python3 {WAIT_READY_SCRIPT} {shlex.quote(url)} {timeout_s} {shlex.quote(f'label={STACK_LABEL}={STACK_NAME}')}",
        ]
    )


def l2_on_disk_command(l2_path: str, disk_mount: str) -> str:
    """Refuses (before the old stack is stopped) when l2_path is not on the L2 disk's filesystem.

    Checked when the release runs, after the l2_disk role mounted the disk in the same deploy."""
    path, mount = shlex.quote(l2_path), shlex.quote(disk_mount)
    return (
        f'p={path}; while [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname "$p"); done; '
        f'[ "$(findmnt -n -o TARGET --target "$p")" = {mount} ] || '
        f'{{ echo "refused: l2_path {l2_path} is not on the L2 disk mounted at {disk_mount}: '
        f'the cache would fill another filesystem. Fix: mount the L2 disk (findmnt {disk_mount})" >&2; exit 1; }}'
    )


def record_hash_command(digest: Optional[str]) -> str:
    """The verified rendering's hash, or none (the next run then redoes the release)."""
    return f"echo {digest} > {RELEASE_HASH_FILE}" if digest else f"rm -f {RELEASE_HASH_FILE}"


def rendering_for(settings: Settings) -> Rendering:
    """The compose.yml and .env the settings render to: what a release brings up."""
    return Rendering(render_compose(settings), render_env(settings))


def stack_files() -> tuple[str, str]:
    """Where the running stack's compose.yml and .env live on the rig."""
    return f"{RIG_STACK_DIR}/{COMPOSE_FILE_NAME}", f"{RIG_STACK_DIR}/{ENV_FILE_NAME}"


def stored_files(rendering_hash: str) -> tuple[str, str]:
    """Where a verified release's stored compose.yml and .env live on the rig."""
    directory = rendering_dir(rendering_hash)
    return f"{directory}/{COMPOSE_FILE_NAME}", f"{directory}/{ENV_FILE_NAME}"


def env_private_command(env_path: str) -> str:
    """A .env may hold a token: owner-only."""
    return f"chmod {ENV_FILE_MODE:o} {env_path}"


def read_ledger_command() -> str:
    """The ledger's text; nothing on a rig without one yet."""
    return f"cat {LEDGER_PATH} 2>/dev/null || true"


STATE_DIR_COMMAND = f"mkdir -p {RIG_STATE_DIR}"


def stored_dir_command(rendering_hash: str) -> str:
    """The stored rendering's directory, owner-only like its parent (the .env inside may hold a token)."""
    return f"install -d -m 700 {RIG_RELEASES_DIR} {rendering_dir(rendering_hash)}"


def prune_commands(images: list[str], renderings: list[str]) -> list[str]:
    """Remove images and stored renderings; an image still in use by a container stays (the error is ignored)."""
    return [f"docker image rm {shlex.quote(image)} 2>/dev/null || true" for image in images] + [
        f"rm -rf {rendering_dir(rendering_hash)}" for rendering_hash in renderings
    ]
