"""serving: the profile's compose stack on the rig, pinned by digest, with a release ledger.

Ensures, in order:
- the host data is valid (rigkit.hostdata: unknown knobs, tags, bad values refused before any change);
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
- a verified release's compose.yml and .env are stored under rigkit.ledger.rendering_dir(<release
  hash>) and named in its ledger entry: a rollback (automatic, or rollback.py via
  ``serving(kind="rollback", restore_rendering=...)``) brings back exactly that rendering, not the
  old image re-rendered with today's data. Only when it is missing (a ledger older than stored
  renderings, files deleted) is the old image re-rendered, with a warning and a ledger note saying so.
"""

from __future__ import annotations

import logging
import shlex
from io import StringIO
from typing import Optional

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, python, systemd
from pyinfra.operations.util import any_changed

from rigkit.errors import PreflightError
from rigkit.facts.docker import ComposeCommand, ManifestProbe
from rigkit.facts.server import ExactFileText
from rigkit.files.l2_janitor import L2_JANITOR_INTERVAL_S, L2_JANITOR_MIN_FREE_BYTES, L2_JANITOR_UNIT
from rigkit.hostdata import RigSettings, Settings, settings_for_host
from rigkit.ledger import LEDGER_PATH, SMOKE_FAIL, SMOKE_PASS, Ledger, Release, Rendering, rendering_dir
from rigkit.operations import REFUSAL_FIX, refuse
from rigkit.operations.files import secret_file
from rigkit.operations.stack import engine_checked, image_pulled, stack_release
from rigkit.paths import RIG_LIB_DIR, RIG_RELEASES_DIR, RIG_STACK_DIR, RIG_STATE_DIR
from rigkit.preflight import HostFacts, preflight, refusals
from rigkit.render import COMPOSE_FILE_NAME, CONTAINER_NAME, ENV_FILE_NAME, render_compose, render_env
from rigkit.sizing import GB
from rigkit.smoke import SmokeReport, check_container, check_http
from rigkit.stack import FILES_DIR, WAIT_READY_SCRIPT, WAIT_READY_SOURCE, ready_url, record_hash_command, release_commands
from rigkit.survey import RigState
from rigkit.tunnel import serving_url
from roles import Run

logger = logging.getLogger("rigkit.serving")


L2_JANITOR_SOURCE = FILES_DIR / "l2_janitor.py"
L2_JANITOR_SCRIPT = f"{RIG_LIB_DIR}/l2_janitor.py"


def host_data() -> dict:
    return host.data.dict()


def janitor_unit(settings: Settings) -> str:
    """systemd unit keeping the connector's store under l2_budget_gb (the connector never evicts)."""
    budget = int(settings.knobs["l2_budget_gb"] * GB)
    return (
        "[Unit]\nDescription=rigkit L2 janitor: keep the KV store under its budget (LRU)\n\n"
        "[Service]\n"
        f"ExecStart=/usr/bin/python3 {L2_JANITOR_SCRIPT} {settings.knobs['l2_path']} {budget} "
        f"{L2_JANITOR_MIN_FREE_BYTES} {L2_JANITOR_INTERVAL_S}\n"
        "Restart=always\n\n[Install]\nWantedBy=multi-user.target\n"
    )


# Every file the role puts lies in a directory an earlier operation of the role ensures (or systemd's own):
# files.put's own parent check would read one more fact, one more SSH round trip, per file and run.
PARENT_ENSURED = {"create_remote_dir": False}


def l2_janitor(settings: Settings) -> None:
    script = files.put(name="L2 janitor script", src=str(L2_JANITOR_SOURCE), dest=L2_JANITOR_SCRIPT, mode="755",
                       **PARENT_ENSURED)
    unit = files.put(name="L2 janitor unit", src=StringIO(janitor_unit(settings)),
                     dest=f"/etc/systemd/system/{L2_JANITOR_UNIT}", **PARENT_ENSURED)
    systemd.daemon_reload(name="systemd reads the L2 janitor unit", _if=unit.did_change)
    systemd.service(name="L2 janitor running", service=L2_JANITOR_UNIT, running=True, enabled=True)
    systemd.service(name="L2 janitor restarted for its new settings", service=L2_JANITOR_UNIT, restarted=True,
                    _if=any_changed(script, unit))


def preflight_facts(settings: Settings, state: RigState) -> HostFacts:
    """The serving preflight's view of the rig survey; the registry is asked (one more round trip) only
    when the image is not on the rig."""
    probe_registry = state.docker_cli is not None and not state.image_present
    return HostFacts.from_state(state, image_probe_error=host.get_fact(ManifestProbe, image=settings.image)
                                if probe_registry else None)


def smoke(rendering: Rendering, data: dict) -> SmokeReport:
    """Every smoke check against the running stack (HTTP through the tunnel, container via the rig),
    expecting what ``rendering`` declares."""
    report = SmokeReport()
    with serving_url(data, rendering.knob("bind_address"), int(rendering.knob("serving_port")), host.name) as url:
        report.checks += check_http(url, rendering.knob("served_model_name"))
    _, env_out = host.run_shell_command(f"docker exec {CONTAINER_NAME} env")
    _, inspect_out = host.run_shell_command(f"docker inspect {CONTAINER_NAME}")
    expected_command = [rendering.connector] if rendering.connector else []
    report.checks += check_container(env_out.stdout, inspect_out.stdout, rendering.container_env(), expected_command)
    return report


def read_ledger() -> Ledger:
    status, output = host.run_shell_command(f"cat {LEDGER_PATH} 2>/dev/null || true")
    return Ledger.from_json(output.stdout)


def write_ledger(ledger: Ledger) -> None:
    host.run_shell_command(f"mkdir -p {RIG_STATE_DIR}")
    if not host.put_file(StringIO(ledger.to_json()), LEDGER_PATH):
        raise RuntimeError(f"could not write {LEDGER_PATH}")


def stored_rendering(rendering_hash: Optional[str]) -> tuple[Optional[Rendering], str]:
    """The verified rendering stored on the rig under that hash, or (None, why it cannot be used)."""
    if not rendering_hash:
        return None, "stored rendering missing"
    directory = rendering_dir(rendering_hash)
    compose_text = host.get_fact(ExactFileText, path=f"{directory}/{COMPOSE_FILE_NAME}")
    env_text = host.get_fact(ExactFileText, path=f"{directory}/{ENV_FILE_NAME}")
    if compose_text is None or env_text is None:
        return None, "stored rendering missing"
    rendering = Rendering(compose_text, env_text)
    if rendering.hash != rendering_hash:
        return None, f"stored rendering damaged (its files hash to {rendering.hash[:12]})"
    return rendering, ""


REPLACEMENT_NOTE = "re-rendered with today's data: {why}"


def restored_rendering(release: Release, todays: Optional[Rendering]) -> tuple[Optional[Rendering], str]:
    """What a rollback to ``release`` brings up, and the ledger note saying which rendering that is.

    ``todays`` is the release's image rendered from today's data (None when today's data cannot
    render it): used only when the stored rendering is missing, and said so in a warning and the note."""
    rendering, why = stored_rendering(release.rendering)
    if rendering is not None and rendering.image != release.image:
        rendering, why = None, f"the stored rendering {rendering.hash[:12]} is of {rendering.image}"
    if rendering is not None:
        return rendering, f"restored the verified rendering {rendering.hash[:12]}"
    logger.warning(f"[{host.name}] rollback to {release.image}: {why}; re-rendering it with today's data, "
                   "which may differ from what was verified")
    return todays, REPLACEMENT_NOTE.format(why=why)


def store_rendering(rendering: Rendering) -> None:
    """Keep a verified release's compose.yml and .env on the rig (dir 0700, .env 0600) for rollbacks."""
    directory = rendering_dir(rendering.hash)
    _run_checked([f"install -d -m 700 {RIG_RELEASES_DIR} {directory}"])
    for name, text in ((COMPOSE_FILE_NAME, rendering.compose), (ENV_FILE_NAME, rendering.env)):
        if not host.put_file(StringIO(text), f"{directory}/{name}"):
            raise RuntimeError(f"could not write {directory}/{name}")
    _run_checked([f"chmod 600 {directory}/{ENV_FILE_NAME}"])


NOTE_TAIL_CHARS = 600  # of the wait's output kept in the ledger when a release never became ready


def _joined(*notes: str) -> str:
    return "; ".join(note for note in notes if note)


def after_release(rendering: Rendering, data: dict, compose: Optional[str], kind: str, run_smoke: bool,
                  auto_rollback: bool, keep_images: int, ready_timeout_s: int, note: str = "",
                  release_op=None) -> None:
    """Smoke, ledger, stored rendering, automatic rollback and pruning, right after a release was brought up.

    ``rendering`` is what the release brought up; ``note`` goes into its ledger entry. ``release_op``
    is the stack_release operation: when it failed (a container died, the wait timed out, `up -d`
    failed) the release is recorded as failed and rolled back like a failed smoke. ``compose`` None: the
    rig's compose command is read when a rollback needs it (an earlier role of the run may have installed it).
    """
    ledger = read_ledger()
    ledger.record(Release(image=rendering.image, profile=rendering.profile, knobs_hash=rendering.knobs_hash,
                          kind=kind, note=note, rendering=rendering.hash))
    verdict = None
    if release_op is not None and release_op.did_error():
        tail = "\n".join((release_op.stdout_lines + release_op.stderr_lines)[-12:])[-NOTE_TAIL_CHARS:]
        verdict = SMOKE_FAIL
        ledger.record_smoke(verdict, _joined(note, f"release never became ready: {tail}"))
    elif run_smoke:
        report = smoke(rendering, data)
        verdict = SMOKE_PASS if report.passed else SMOKE_FAIL
        ledger.record_smoke(verdict, _joined(note, report.summary()))
        logger.warning(f"[{host.name}] {report.summary()}")
    if verdict != SMOKE_FAIL:
        store_rendering(rendering)  # before the ledger names it: a verified entry's rendering is on the rig
    write_ledger(ledger)
    if verdict != SMOKE_FAIL:
        _run_checked([record_hash_command(rendering.hash)])
        prune(ledger, keep_images)
        return
    failed = ledger.current
    good = ledger.last_known_good(other_than=failed)
    restored, restore_note = (None, "")
    if auto_rollback and good:
        restored, restore_note = restored_rendering(good, _todays_rendering(data, good.image))
    if restored is None:
        why = ("serving_auto_rollback is off" if not auto_rollback else
               "no known-good release other than this one in the ledger" if not good else
               f"{good.image} has no stored rendering and cannot be rendered from the current data")
        raise PreflightError("release", failed.image, f"{kind} failed, not rolled back ({why}): {failed.note}",
                             "fix the release, or roll back with rollback.py --data rollback_to=REPO@sha256:...")
    logger.warning(f"[{host.name}] rolling back to last known-good {good.image}")
    apply_rendered(restored.as_dict())
    rollback = Release(image=restored.image, profile=restored.profile, knobs_hash=restored.knobs_hash,
                       kind="rollback", rendering=restored.hash,
                       note=_joined(f"automatic: {kind} of {failed.image} failed", restore_note))
    ledger.record(rollback)
    try:
        compose = compose or host.get_fact(ComposeCommand)
        _run_checked(release_commands(compose, restored.image, False, ready_url(restored), ready_timeout_s))
        report = smoke(restored, data) if run_smoke else None
    except RuntimeError as exc:
        ledger.record_smoke(SMOKE_FAIL, f"{rollback.note}; the rollback failed too: {exc}"[:2000])
        write_ledger(ledger)
        raise PreflightError("release", failed.image, f"{kind} failed and the rollback to {good.image} failed too: "
                             f"{exc}; the failure: {failed.note}",
                             "inspect the rig (docker logs rigkit-serving) and deploy a release that starts")
    if report is not None:
        ledger.record_smoke(SMOKE_PASS if report.passed else SMOKE_FAIL, _joined(rollback.note, report.summary()))
    if report is None or report.passed:
        store_rendering(restored)
    write_ledger(ledger)
    _run_checked([record_hash_command(restored.hash)])
    raise PreflightError("release", failed.image, f"{kind} failed and the rig was rolled back to {good.image} "
                         f"(serving again); the failure: {failed.note}",
                         "fix the release and deploy it again; the rig serves the last known-good release")


def _todays_rendering(data: dict, image: str) -> Optional[Rendering]:
    """``image`` rendered from today's host data (None when that data cannot render it any more)."""
    try:
        return rendering_for(settings_for_host({**data, "serving_image": image}))
    except Exception as exc:  # an old image the current data cannot render is no rollback target
        logger.warning(f"[{host.name}] cannot render {image} from today's data: {exc}")
        return None


def apply_rendered(rendered: dict) -> None:
    host.put_file(StringIO(rendered["compose"]), f"{RIG_STACK_DIR}/{COMPOSE_FILE_NAME}")
    host.put_file(StringIO(rendered["env"]), f"{RIG_STACK_DIR}/{ENV_FILE_NAME}")
    host.run_shell_command(f"chmod 600 {RIG_STACK_DIR}/{ENV_FILE_NAME}")


def _run_checked(commands: list[str]) -> None:
    for command in commands:
        status, output = host.run_shell_command(command)
        if not status:
            raise RuntimeError(f"`{command}` failed: {output.stdout[-2000:]} {output.stderr[-2000:]}")


def prune(ledger: Ledger, keep: int) -> None:
    for image in ledger.images_to_prune(keep):
        host.run_shell_command(f"docker image rm {shlex.quote(image)} 2>/dev/null || true")
    for rendering_hash in ledger.renderings_to_prune(keep):
        host.run_shell_command(f"rm -rf {rendering_dir(rendering_hash)}")


def rendering_for(settings: Settings) -> Rendering:
    return Rendering(render_compose(settings), render_env(settings))


def rendered_for(settings: Settings) -> dict:
    return rendering_for(settings).as_dict()


@deploy("serving")
def serving(rig: RigSettings, run: Run, kind: str = "deploy", restore_rendering: Optional[str] = None) -> None:
    """Deploy the rig's release; with kind="rollback" and restore_rendering (a release hash from the
    ledger), bring back that stored rendering of the settings' image instead of rendering it anew."""
    data = host_data()
    settings, role = rig.stack, rig.serving
    facts = preflight_facts(settings, run.rig_state(rig))
    # A fresh rig: the docker role installs the engine in this same run, after the survey was read.
    engine_later = (not facts.has_engine or facts.compose_command is None) and run.engine_provisioned

    findings = preflight(settings, facts, engine_later=engine_later)
    for finding in findings:
        if finding.level == "warn":
            logger.warning(f"[{host.name}] {finding}")
    logger.warning(f"[{host.name}] capacity: {settings.capacity()}")
    refused = refusals(findings)
    if refused:
        python.call(name="Preflight refused", function=refuse, field="preflight", value=host.name,
                    problem="; ".join(str(f) for f in refused), fix=REFUSAL_FIX)
        return

    if engine_later:
        engine_checked(name="Engine, compose and image checks (the engine is installed by now)", settings=settings)
    rendering, note = rendering_for(settings), ""
    if kind == "rollback":
        rendering, note = restored_rendering(Release(image=settings.image, profile=settings.profile.name,
                                                     knobs_hash=settings.knobs_hash, rendering=restore_rendering),
                                             rendering)
    files.directory(name="rigkit directories", path=RIG_STACK_DIR, mode="700")
    files.directory(name="rigkit state directory", path=RIG_STATE_DIR)
    files.directory(name="rigkit helper directory", path=RIG_LIB_DIR)
    if settings.l2_active:
        files.directory(name="L2 cache directory", path=settings.knobs["l2_path"])
    files.put(name="Wait-ready helper", src=str(WAIT_READY_SOURCE), dest=WAIT_READY_SCRIPT, mode="755",
              **PARENT_ENSURED)
    if settings.l2_active and settings.profile.connector.l2_needs_janitor:
        l2_janitor(settings)
    files.put(name="Render compose.yml", src=StringIO(rendering.compose),
              dest=f"{RIG_STACK_DIR}/{COMPOSE_FILE_NAME}", mode="644", **PARENT_ENSURED)
    secret_file(name="Render .env (0600: may hold a token)", text=rendering.env,
                dest=f"{RIG_STACK_DIR}/{ENV_FILE_NAME}", mode="600")
    image_pulled(name="Pull the image (the old stack keeps serving)", image=settings.image)
    disk_mount = rig.l2_disk["l2_mount_point"] if rig.l2_disk["l2_device"] else None
    # A failed release must reach after_release (which rolls it back), so its error is not fatal here.
    release = stack_release(name=f"Release {settings.image}", image=settings.image,
                            knobs_hash=rendering.knobs_hash,
                            digest=rendering.hash, url=ready_url(rendering),
                            timeout_s=settings.knobs["ready_timeout_s"], _ignore_errors=True,
                            l2_guard=(settings.knobs["l2_path"], disk_mount) if settings.l2_active and disk_mount
                            else None)
    python.call(name="Smoke, ledger, prune", function=after_release,
                _if=lambda: release.did_change() or release.did_error(),
                rendering=rendering, data=data, compose=None, kind=kind, run_smoke=role["serving_smoke"],
                auto_rollback=role["serving_auto_rollback"], keep_images=settings.knobs["keep_images"],
                ready_timeout_s=settings.knobs["ready_timeout_s"], note=note, release_op=release)
