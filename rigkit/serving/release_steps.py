"""The release's steps on the rig, each given the host it runs on (pyinfra's, or a test's fake): the ledger
file, stored renderings, the stack's files, pruning, bringing a rendering up.

What to do and in which order is rigkit.serving.release's decision; the command text is rigkit.serving.commands's. These
run while the deploy executes (inside a Python step), so they talk to the host directly.
"""

from __future__ import annotations

import logging
from io import StringIO
from typing import Callable, Optional

from rigkit.errors import PreflightError
from rigkit.facts.docker import ComposeCommand
from rigkit.facts.server import ExactFileText
from rigkit.serving.commands import (
    STATE_DIR_COMMAND,
    env_private_command,
    prune_commands,
    read_ledger_command,
    ready_url,
    record_hash_command,
    release_commands,
    stack_files,
    stored_dir_command,
    stored_files,
)
from rigkit.serving.ledger import LEDGER_PATH, Ledger, Release, Rendering
from rigkit.serving.release import (
    Outcome,
    Prune,
    RecordHash,
    Refuse,
    Restore,
    Step,
    StoreRendering,
    WriteLedger,
    restore,
)
from rigkit.serving.smoke import SmokeReport

logger = logging.getLogger("rigkit.serving")


def run_checked(host, commands: list[str]) -> None:
    """Run each command in turn; RuntimeError with its output at the first that fails."""
    for command in commands:
        status, output = host.run_shell_command(command)
        if not status:
            raise RuntimeError(f"`{command}` failed: {output.stdout[-2000:]} {output.stderr[-2000:]}")


def put_text(host, text: str, path: str) -> None:
    if not host.put_file(StringIO(text), path):
        raise RuntimeError(f"could not write {path}")


def read_ledger(host) -> Ledger:
    _, output = host.run_shell_command(read_ledger_command())
    return Ledger.from_json(output.stdout)


def write_ledger(host, text: str) -> None:
    host.run_shell_command(STATE_DIR_COMMAND)
    put_text(host, text, LEDGER_PATH)


def read_stored_rendering(host, rendering_hash: Optional[str]) -> Optional[tuple[str, str]]:
    """The texts of a stored rendering's compose.yml and .env, None when there is none (or either is missing)."""
    if not rendering_hash:
        return None
    texts = tuple(host.get_fact(ExactFileText, path=path) for path in stored_files(rendering_hash))
    return None if None in texts else texts


def store_rendering(host, rendering: Rendering) -> None:
    """Keep a verified release's compose.yml and .env on the rig (dir 0700, .env 0600) for rollbacks."""
    compose_path, env_path = stored_files(rendering.hash)
    run_checked(host, [stored_dir_command(rendering.hash)])
    put_text(host, rendering.compose, compose_path)
    put_text(host, rendering.env, env_path)
    run_checked(host, [env_private_command(env_path)])


def apply_rendering(host, rendering: Rendering) -> None:
    """Make ``rendering`` the stack's compose.yml and .env (taken by the next compose up)."""
    compose_path, env_path = stack_files()
    host.put_file(StringIO(rendering.compose), compose_path)
    host.put_file(StringIO(rendering.env), env_path)
    host.run_shell_command(env_private_command(env_path))


def restored_rendering(host, target: Release, todays: Optional[Rendering], undone: Optional[Release] = None) -> Restore:
    """What a rollback to ``target`` brings up (rigkit.serving.release.restore), warning when it is not the stored one."""
    restored = restore(target, read_stored_rendering(host, target.rendering), todays, undone)
    if restored.warning:
        logger.warning(f"[{host.name}] {restored.warning}")
    return restored


def bring_up(
    host,
    rendering: Rendering,
    compose: Optional[str],
    ready_timeout_s: int,
    verify: Optional[Callable[[Rendering], SmokeReport]],
) -> Outcome:
    """Put ``rendering`` in place and release it without a pull (the image is on the rig); ``verify``: the
    smoke, None when it is off. ``compose`` None: read from the rig now."""
    apply_rendering(host, rendering)
    try:
        compose = compose or host.get_fact(ComposeCommand)
        run_checked(host, release_commands(compose, rendering.image, False, ready_url(rendering), ready_timeout_s))
        report = verify(rendering) if verify else None
    except RuntimeError as exc:
        return Outcome(ready=False, why_not_ready=str(exc))
    return Outcome(ready=True, smoke=report)


def failure(refusal: Refuse) -> PreflightError:
    """The error a Refuse step fails the rig with."""
    return PreflightError("release", refusal.image, refusal.problem, refusal.fix)


def carry_out(host, steps: list[Step]) -> None:
    """Each step on the rig, in order; a Refuse fails the rig (PreflightError) once the steps before it are done."""
    for step in steps:
        if isinstance(step, StoreRendering):
            store_rendering(host, step.rendering)
        elif isinstance(step, WriteLedger):
            write_ledger(host, step.text)
        elif isinstance(step, RecordHash):
            run_checked(host, [record_hash_command(step.rendering_hash)])
        elif isinstance(step, Prune):
            commands = prune_commands(list(step.images), list(step.renderings))
            if commands:  # one round trip; each removal's own failure is ignored, as alone
                host.run_shell_command("; ".join(commands))
        elif isinstance(step, Refuse):
            raise failure(step)
        else:
            raise TypeError(f"not a release step: {step!r}")
