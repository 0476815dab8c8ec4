"""serving: the profile's compose stack on the rig, pinned by digest, with a release ledger.

Ensures, in order:
- the host data is valid (rigkit.settings.hostdata: unknown knobs, tags, bad values refused before any change);
- preflights pass (RAM, shm, L2 disk, GPU memory, engine, compose, image): a refusal fails this rig only;
  on a fresh rig, where the docker role installs the engine in this same run, the engine, compose and
  image checks run once that role ran (``engine_checked``), still before this role changes anything;
- compose.yml and .env (mode 0600) rendered from the one knob registry;
- the release: pull the digest (before stopping anything), `compose down`, `compose up -d`, wait for
  /v1/models with progress (never `docker restart`); nothing happens when the rig already runs
  exactly this rendering ("No Change");
- after a release: smoke (HTTP through an SSH tunnel, env and command line inside the container),
  the verdict in the rig's ledger, automatic rollback to the last known-good digest when the release
  never became ready or smoke fails (both the failure and the rollback are ledger entries), and
  pruning of images and stored renderings beyond keep_images (the current and last known-good
  ones are always kept).
  RELEASE_HASH_FILE is written only once the release is verified (or rolled back), so a run killed
  anywhere in between redoes the release when re-run instead of reporting "No Change".
- a verified release's compose.yml and .env are stored under rigkit.serving.ledger.rendering_dir(<release
  hash>) and named in its ledger entry: a rollback (automatic, or rollback.py via
  ``serving(kind="rollback", restore_rendering=...)``) brings back exactly that rendering, not the
  old image re-rendered with today's data. Only when it is missing (a ledger older than stored
  renderings, files deleted) is the old image re-rendered, with a warning and a ledger note saying so.
"""

from __future__ import annotations

import logging
import secrets
from io import StringIO
from typing import Optional

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import FileContents
from pyinfra.operations import files, python, systemd
from pyinfra.operations.util import any_changed

from rigkit.facts.batch import FactSpec
from rigkit.facts.docker import ManifestProbe
from rigkit.facts.model import StagedModel
from rigkit.facts.serving import serving_engine
from rigkit.facts.surveyed import directory_reads, put_reads, service_reads
from rigkit.files.l2_janitor import L2_JANITOR_INTERVAL_S, L2_JANITOR_MIN_FREE_BYTES, L2_JANITOR_UNIT
from rigkit.operations import refusal_of, refuse, refusing_step
from rigkit.operations.files import secret_file
from rigkit.operations.serving import PULL_STEP, engine_checked, image_pulled, stack_release
from rigkit.paths import RIG_LIB_DIR, RIG_STACK_DIR, RIG_STATE_DIR
from rigkit.preflight import HostFacts, preflight, refusals
from rigkit.remote.tunnel import serving_url
from rigkit.serving import release_steps
from rigkit.serving.commands import (
    FILES_DIR,
    RELEASE_HASH_FILE,
    WAIT_READY_SCRIPT,
    WAIT_READY_SOURCE,
    ready_url,
    rendering_for,
)
from rigkit.serving.ledger import DEPLOY_KIND, ROLLBACK_KIND, Release, Rendering
from rigkit.serving.release import (
    FIX_NOT_RE_RENDERED,
    Outcome,
    Refuse,
    judge_release,
    judge_rollback,
    never_ready,
    roll_back_or_refuse,
    rollback_target,
)
from rigkit.serving.render import COMPOSE_FILE_NAME, CONTAINER_NAME, ENV_FILE_MODE, ENV_FILE_NAME
from rigkit.serving.smoke import HASH_SEED_ENV, SmokeReport, check_container, check_hash_seed, check_http
from rigkit.settings.hostdata import RigSettings, Settings
from rigkit.settings.knobs import KNOBS_BY_NAME
from rigkit.settings.model_source import mounted_dir, parse_model_source, store_stamp
from rigkit.settings.sizing import GB
from rigkit.settings.variables import resolve
from rigkit.survey import RigState
from rigkit.systemd import exec_command_line
from roles import Run

logger = logging.getLogger("rigkit.serving")


L2_JANITOR_SOURCE = FILES_DIR / "l2_janitor.py"
L2_JANITOR_SCRIPT = f"{RIG_LIB_DIR}/l2_janitor.py"


def janitor_unit(settings: Settings) -> str:
    """systemd unit keeping the connector's store under l2_budget_gb (the connector never evicts)."""
    budget = int(settings.knobs["l2_budget_gb"] * GB)
    return (
        "[Unit]\nDescription=rigkit L2 janitor: keep the KV store under its budget (LRU)\n\n"
        "[Service]\n"
        "ExecStart="
        + exec_command_line(
            [
                "/usr/bin/python3",
                L2_JANITOR_SCRIPT,
                settings.knobs["l2_path"],
                budget,
                L2_JANITOR_MIN_FREE_BYTES,
                L2_JANITOR_INTERVAL_S,
            ]
        )
        + "\n"
        "Restart=always\n\n[Install]\nWantedBy=multi-user.target\n"
    )


# Every file the role puts lies in a directory an earlier operation of the role ensures (or systemd's own):
# files.put's own parent check would read one more fact, one more SSH round trip, per file and run.
PARENT_ENSURED = {"create_remote_dir": False}


def l2_janitor(settings: Settings) -> None:
    script = files.put(
        name="L2 janitor script", src=str(L2_JANITOR_SOURCE), dest=L2_JANITOR_SCRIPT, mode="755", **PARENT_ENSURED
    )
    unit = files.put(
        name="L2 janitor unit",
        src=StringIO(janitor_unit(settings)),
        dest=f"/etc/systemd/system/{L2_JANITOR_UNIT}",
        **PARENT_ENSURED,
    )
    systemd.daemon_reload(name="systemd reads the L2 janitor unit", _if=unit.did_change)
    systemd.service(name="L2 janitor running", service=L2_JANITOR_UNIT, running=True, enabled=True)
    systemd.service(
        name="L2 janitor restarted for its new settings",
        service=L2_JANITOR_UNIT,
        restarted=True,
        _if=any_changed(script, unit),
    )


def preflight_facts(settings: Settings, state: RigState) -> HostFacts:
    """The serving preflight's view of the rig survey; the registry is asked (one more round trip) only
    when the image is not on the rig."""
    probe_registry = state.docker_cli is not None and not state.image_present
    return HostFacts.from_state(
        state, image_probe_error=host.get_fact(ManifestProbe, image=settings.image) if probe_registry else None
    )


def smoke(rendering: Rendering, data: dict) -> SmokeReport:
    """Every smoke check against the running stack (HTTP through the tunnel, container via the rig),
    expecting what ``rendering`` declares; a stack that hashes with a fixed seed must have the seed the
    rig's data declares now (kv_hash_seed, the fleet's one), whatever release it runs."""
    report = SmokeReport()
    with serving_url(data, rendering.knob("bind_address"), int(rendering.knob("serving_port")), host.name) as url:
        report.checks += check_http(url, rendering.knob("served_model_name"))
    # the container's environment and its inspect JSON in one round trip, cut at a line neither can print
    between = f"rigkit-smoke-{secrets.token_hex(8)}"
    _, out = host.run_shell_command(
        f"docker exec {CONTAINER_NAME} env; echo {between}; docker inspect {CONTAINER_NAME}"
    )
    lines = out.stdout.splitlines()
    cut = lines.index(between) if between in lines else len(lines)
    env_text, inspect_text = "\n".join(lines[:cut]), "\n".join(lines[cut + 1 :])
    expected_command = [rendering.connector] if rendering.connector else []
    report.checks += check_container(env_text, inspect_text, rendering.container_env(), expected_command)
    if HASH_SEED_ENV in rendering.container_env():
        seed = resolve([KNOBS_BY_NAME["kv_hash_seed"]], data)["kv_hash_seed"]
        report.checks.append(check_hash_seed(env_text, seed))
    return report


def after_release(
    rendering: Rendering,
    rig: RigSettings,
    compose: Optional[str],
    kind: str,
    run_smoke: bool,
    auto_rollback: bool,
    keep_images: int,
    ready_timeout_s: int,
    note: str = "",
    release_op=None,
) -> None:
    """Smoke, ledger, stored rendering, automatic rollback and pruning, right after a release was brought up:
    rigkit.serving.release decides each step, rigkit.serving.release_steps carries it out on the rig.

    ``rendering`` is what the release brought up; ``note`` goes into its ledger entry. ``release_op``
    is the stack_release operation: when it failed (a container died, the wait timed out, `up -d`
    failed) the release is recorded as failed and rolled back like a failed smoke. ``compose`` None: the
    rig's compose command is read when a rollback needs it (an earlier role of the run may have installed it).
    """
    ledger = release_steps.read_ledger(host)
    verify = (lambda brought_up: smoke(brought_up, dict(rig.data))) if run_smoke else None
    if release_op is not None and release_op.did_error():
        outcome = never_ready(release_op.stdout_lines + release_op.stderr_lines)
    else:
        outcome = Outcome(ready=True, smoke=verify(rendering) if verify else None)
        if outcome.smoke is not None:
            logger.warning(f"[{host.name}] {outcome.smoke.summary()}")
    plan = judge_release(ledger, rendering, kind, note, outcome, keep_images)
    release_steps.carry_out(host, plan.steps)
    if plan.failed is None:
        return
    target = rollback_target(plan, auto_rollback)
    restored = (
        release_steps.restored_rendering(host, target, _todays_rendering(rig, target.image), plan.failed)
        if target is not None
        else None
    )
    decision = roll_back_or_refuse(plan.failed, kind, auto_rollback, target, restored)
    if isinstance(decision, Refuse):
        raise release_steps.failure(decision)
    logger.warning(f"[{host.name}] rolling back to last known-good {decision.target.image}")
    outcome = release_steps.bring_up(host, decision.rendering, compose, ready_timeout_s, verify)
    release_steps.carry_out(host, judge_rollback(plan.ledger, plan.failed, kind, decision, outcome).steps)


def _todays_rendering(rig: RigSettings, image: str) -> Optional[Rendering]:
    """``image`` rendered from today's host data (None when that data cannot render it any more)."""
    try:
        return rendering_for(rig.for_image(image).stack)
    except Exception as exc:  # an old image the current data cannot render is no rollback target
        logger.warning(f"[{host.name}] cannot render {image} from today's data: {exc}")
        return None


def operation_reads(rig: RigSettings) -> list[FactSpec]:
    """What this role's operations read on a rig that already serves this release: its directories, files and
    janitor unit, the image, and the release check (stack_release)."""
    settings = rig.stack
    reads = [*directory_reads(RIG_STACK_DIR), *directory_reads(RIG_STATE_DIR), *directory_reads(RIG_LIB_DIR)]
    if settings.l2_active:
        reads += directory_reads(settings.knobs["l2_path"])
    reads += put_reads(WAIT_READY_SCRIPT)
    if settings.runs_l2_janitor:
        reads += [
            *put_reads(L2_JANITOR_SCRIPT),
            *put_reads(f"/etc/systemd/system/{L2_JANITOR_UNIT}"),
            *service_reads(L2_JANITOR_UNIT),
        ]
    elif settings.l2_active and settings.knobs["kv_share"]:
        reads += service_reads(L2_JANITOR_UNIT)
    return reads + [
        *put_reads(f"{RIG_STACK_DIR}/{COMPOSE_FILE_NAME}"),
        *put_reads(f"{RIG_STACK_DIR}/{ENV_FILE_NAME}"),
        serving_engine(settings.image),
        FactSpec.of(FileContents, path=RELEASE_HASH_FILE),
    ]


@deploy("serving")
def serving(
    rig: RigSettings,
    run: Run,
    kind: str = DEPLOY_KIND,
    restore_rendering: Optional[str] = None,
    undoing: Optional[Release] = None,
) -> None:
    """Deploy the rig's release; with kind="rollback" and restore_rendering (a release hash from the
    ledger), bring back that stored rendering of the settings' image instead of rendering it anew;
    ``undoing``: the release the rollback undoes (refused when only it could be brought back)."""
    settings, role = rig.stack, rig.serving
    state = run.rig_state(rig)
    facts = preflight_facts(settings, state)
    # A fresh rig: the docker role installs the engine in this same run, after the survey was read.
    engine_later = (not facts.has_engine or facts.compose_command is None) and run.engine_provisioned

    findings = preflight(settings, facts, engine_later=engine_later)
    for finding in findings:
        if finding.level == "warn":
            logger.warning(f"[{host.name}] {finding}")
    logger.warning(f"[{host.name}] capacity: {settings.capacity()}")
    refused = refusals(findings)
    if refused:
        python.call(name="Preflight refused", function=refuse, **refusal_of(refused))
        return

    if engine_later:
        engine_checked(name="Engine, compose and image checks (the engine is installed by now)", settings=settings)
    rendering, note = rendering_for(settings), ""
    if kind == ROLLBACK_KIND:
        target = Release(
            image=settings.image,
            profile=settings.profile.name,
            knobs_hash=settings.knobs_hash,
            rendering=restore_rendering,
        )
        restored = release_steps.restored_rendering(host, target, rendering, undoing)
        if restored.rendering is None:
            python.call(
                name="Rollback refused",
                function=refuse,
                field="rollback_to",
                value=target.image,
                problem=restored.refused,
                fix=FIX_NOT_RE_RENDERED,
            )
            return
        rendering, note = restored.rendering, restored.note
    # the model the rendering mounts (a rollback's: the revision its stored rendering names) must be staged and
    # verified: a release would mount an empty or partial directory. Refused before anything on the rig changes.
    mounted = parse_model_source(rendering.model) if rendering.model else None
    if mounted is not None:
        store = settings.knobs["model_store_path"]
        staged = (
            state.staged_model  # the survey read the declared model's stamp; a rollback's older one is read now
            if mounted == settings.model_source
            else host.get_fact(StagedModel, revision_dir=mounted_dir(store, mounted), stamp=store_stamp(store, mounted))
        )
        if staged is None:
            python.call(
                name="Model staged",
                function=refuse,
                field="model_source",
                value=mounted.spec,
                problem=f"not staged and verified in {mounted_dir(store, mounted)} on this rig",
                fix="stage it first: `rigkit stage INVENTORY` (`rigkit deploy` stages before it deploys)",
            )
            return
    files.directory(name="rigkit directories", path=RIG_STACK_DIR, mode="700")
    files.directory(name="rigkit state directory", path=RIG_STATE_DIR)
    files.directory(name="rigkit helper directory", path=RIG_LIB_DIR)
    if settings.l2_active:
        files.directory(name="L2 cache directory", path=settings.knobs["l2_path"])
    files.put(
        name="Wait-ready helper", src=str(WAIT_READY_SOURCE), dest=WAIT_READY_SCRIPT, mode="755", **PARENT_ENSURED
    )
    if settings.runs_l2_janitor:
        l2_janitor(settings)
    elif settings.l2_active and settings.knobs["kv_share"]:
        # a shared store has one janitor (kv_share_janitor): this rig's own, from before, must not evict there
        systemd.service(
            name="L2 janitor left to the shared store's janitor rig",
            service=L2_JANITOR_UNIT,
            running=False,
            enabled=False,
        )
    files.put(
        name="Render compose.yml",
        src=StringIO(rendering.compose),
        dest=f"{RIG_STACK_DIR}/{COMPOSE_FILE_NAME}",
        mode="644",
        **PARENT_ENSURED,
    )
    secret_file(
        name="Render .env (0600: may hold a token)",
        text=rendering.env,
        dest=f"{RIG_STACK_DIR}/{ENV_FILE_NAME}",
        mode=f"{ENV_FILE_MODE:o}",
    )
    image_pulled(name=PULL_STEP, image=settings.image)
    # the store must be on the filesystem meant for it: the shared mount, else the L2 disk when one is declared
    disk_mount = (
        rig.kv_share["kv_share_mount_point"]
        if settings.knobs["kv_share"]
        else rig.l2_disk["l2_mount_point"]
        if rig.l2_disk["l2_device"]
        else None
    )
    # A failed release must reach after_release (which rolls it back), so its error is not fatal here.
    release = stack_release(
        name=f"Release {settings.image}",
        image=settings.image,
        knobs_hash=rendering.knobs_hash,
        digest=rendering.hash,
        url=ready_url(rendering),
        timeout_s=settings.knobs["ready_timeout_s"],
        _ignore_errors=True,
        l2_guard=(settings.knobs["l2_path"], disk_mount) if settings.l2_active and disk_mount else None,
    )
    # a refusal inside (rolled back, or no rollback target) fails the rig with its one line, no traceback
    python.call(
        name="Smoke, ledger, prune",
        function=refusing_step(after_release),
        _if=lambda: release.did_change() or release.did_error(),
        rendering=rendering,
        rig=rig,
        compose=None,
        kind=kind,
        run_smoke=role["serving_smoke"],
        auto_rollback=role["serving_auto_rollback"],
        keep_images=settings.knobs["keep_images"],
        ready_timeout_s=settings.knobs["ready_timeout_s"],
        note=note,
        release_op=release,
    )
