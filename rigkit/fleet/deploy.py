"""A pyinfra deploy over every targeted host at once, and what it did to each rig: the outcome read from pyinfra's
output (rigkit.fleet.outcome) and the release each rig serves afterwards (its ledger). The command is
rigkit.commands.deploy; rollouts and rolling rollbacks (rigkit.rollout.run) run this deploy stage by stage.

Before pyinfra starts, the targets are checked (rigkit.fleet.targets: the connection data of every host) and a
router role on the controller (@local) is refused unless asked for; the pinned model is staged on every rig
(rigkit.fleet.stage) before deploy.py starts a release."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

from rigkit.errors import RigkitError
from rigkit.fleet import pyinfra_args as pyinfra_args_module
from rigkit.fleet.outcome import DRY_RUN, OK, UNREACHABLE, RigOutcome, summarize
from rigkit.fleet.provision import DEPLOY_UNTIL_ENV, STORE_ROLES_UNTIL
from rigkit.fleet.pyinfra_args import is_dry_run, pyinfra_command, without_limits
from rigkit.fleet.stage import rigs_awaiting_store_mount, stage_inventory
from rigkit.fleet.targets import Targets
from rigkit.paths import DEFAULT_DEPLOY
from rigkit.remote.tunnel import connect_ssh
from rigkit.router import is_gateway, refuse_router_on_controller
from rigkit.serving.ledger import LEDGER_PATH, Ledger
from rigkit.settings.defaults import ROUTER_VARIABLES
from rigkit.settings.variables import resolve


def ledger_release(ledger_text: str) -> str:
    """'<digest prefix> <kind> smoke=<verdict>' of a ledger's newest release ('' without one)."""
    current = Ledger.from_json(ledger_text).current
    return current.summary() if current else ""


def read_release(name: str, data: dict) -> str:
    try:
        client = connect_ssh(data, name)
    except Exception as exc:  # the summary must not fail on a rig that is down
        return f"? ({type(exc).__name__})"
    try:
        _, stdout, _ = client.exec_command(f"cat {LEDGER_PATH} 2>/dev/null", timeout=20)
        return ledger_release(stdout.read().decode())
    except Exception as exc:
        return f"? ({type(exc).__name__}: {exc})"
    finally:
        client.close()


def provision_stores(inventory: str, hosts: Mapping[str, Mapping], names: Sequence[str], pyinfra_args: Sequence[str]):
    """Before staging: deploy.py up to STORE_ROLES_UNTIL on each targeted rig whose model store waits for its L2 disk
    (a fresh rig), so one `rigkit deploy` takes it from bare to serving. RigkitError when that run fails."""
    awaiting = rigs_awaiting_store_mount(hosts, names)
    if not awaiting:
        return
    print(
        f"--> rigkit deploy: {', '.join(awaiting)}: the model store is on the L2 disk, not mounted yet (a fresh rig): "
        f"the roles up to {STORE_ROLES_UNTIL} run there first, then the model is staged, then the whole deploy",
        flush=True,
    )
    limits = [arg for rig in awaiting for arg in ("--limit", rig)]
    previous = os.environ.get(DEPLOY_UNTIL_ENV)
    os.environ[DEPLOY_UNTIL_ENV] = STORE_ROLES_UNTIL
    try:
        argv = pyinfra_command([*without_limits(pyinfra_args), *limits], inventory, DEFAULT_DEPLOY)
        status, _ = pyinfra_args_module.run_pyinfra_streaming(argv)
    finally:
        if previous is None:
            os.environ.pop(DEPLOY_UNTIL_ENV, None)
        else:
            os.environ[DEPLOY_UNTIL_ENV] = previous
    if status != 0:
        raise RigkitError(
            "model_store_path",
            ", ".join(awaiting),
            f"the roles up to {STORE_ROLES_UNTIL}, which mount the model store's disk, failed (pyinfra exit {status})",
            "read pyinfra's output above; the rig's failing operation says why",
        )


def fleet_deploy(targets: Targets, deploy: str, pyinfra_args: Sequence[str]) -> tuple[int, list[RigOutcome]]:
    """pyinfra ``deploy`` over ``targets`` in one run (``pyinfra_args`` with each --limit split); (exit status, each
    rig's outcome, targeted rigs first)."""
    hosts, names = targets.hosts, targets.names
    for name in names:  # refused here: nothing has run on any rig yet
        if is_gateway(hosts[name]["groups"]):
            refuse_router_on_controller(name, resolve(ROUTER_VARIABLES, targets.data(name)))
    dry = is_dry_run(pyinfra_args)
    if Path(deploy).name == DEFAULT_DEPLOY and not dry:
        # the model is on every rig, verified, before any release starts (rollback.py mounts what is staged); a fresh
        # rig's store gets its disk first
        provision_stores(targets.inventory, hosts, names, pyinfra_args)
        stage_inventory(hosts, names)
    status, output = pyinfra_args_module.run_pyinfra_streaming(pyinfra_command(pyinfra_args, targets.inventory, deploy))
    outcomes = summarize(output, names, dry_run=dry)
    for outcome in outcomes.values():
        if outcome.status != UNREACHABLE and outcome.rig in hosts:
            outcome.release = read_release(outcome.rig, hosts[outcome.rig]["data"])
    ordered = [outcomes[n] for n in names] + [o for n, o in outcomes.items() if n not in names]
    failed = any(o.status not in (OK, DRY_RUN) for o in ordered)
    return (1 if failed or status != 0 else 0), ordered
