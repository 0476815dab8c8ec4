"""Roll each rig back to a verified release, exactly as it was verified, by digest and without a pull
when the image is still on the rig.

    pyinfra -y inventory/lab.py rollback.py                                   # undo the latest deploy
    pyinfra -y inventory/lab.py rollback.py --data rollback_to=REPO@sha256:... # a given release

The target comes from the rig's release ledger (the newest release whose smoke passed before the
latest deploy; rigkit.serving.ledger.Ledger.rollback_target) unless ``rollback_to`` names an image (then its
newest verified release). The rollback restores that release's stored compose.yml and .env
(rigkit.serving.ledger.rendering_dir), not the old image re-rendered with today's data; only when they are
missing is it re-rendered, with a warning and a ledger note. It is a release like any other: same
wait and smoke, recorded in the ledger with kind "rollback". A second run finds the rig there: No Change.
A gateway (group routers) or the KV store (group kv_stores) of the same inventory has no release: it is left alone.
"""

from pyinfra import host
from pyinfra.facts.files import FileContents

from rigkit.errors import ConfigError
from rigkit.facts.surveyed import serve_operation_facts
from rigkit.fleet import deploy_process
from rigkit.fleet.inventory import is_service_host
from rigkit.remote.registry import require_digest
from rigkit.serving.ledger import LEDGER_PATH, ROLLBACK_KIND, Ledger, Release
from rigkit.settings.hostdata import rig_settings
from roles import Run, operation_reads
from roles.rig_lock import rig_lock
from roles.serving import serving

deploy_process.install()  # cheaper operations and collections in this process (rigkit.fleet.deploy_process)


def rollback_target(wanted: str | None) -> tuple[Release, Release | None]:
    """The release to bring back, and the one the rollback undoes (the latest deploy)."""
    ledger = Ledger.from_json("\n".join(host.get_fact(FileContents, path=LEDGER_PATH) or []))
    if wanted:
        image = require_digest(wanted, "rollback_to")
        # an image the ledger never saw has no stored rendering: it is rendered from today's data
        return ledger.newest_of_image(image) or Release(image=image, profile="", knobs_hash=""), ledger.latest_deploy()
    target = ledger.rollback_target()
    if target is None:
        current = ledger.current.image if ledger.current else None
        raise ConfigError(
            "rollback_to",
            None,
            f"{host.name}'s ledger has no verified release before its latest deploy ({current})",
            "pass --data rollback_to=REPO@sha256:<digest>",
        )
    return target, ledger.latest_deploy()


if is_service_host(host.groups):  # a gateway, the KV store, monitoring: deploy.py gives it its role, no release
    host.noop(f"{host.name} is a gateway, a KV store or a monitoring host, not a rig: it has no release to roll back")
else:
    settings = rig_settings(host.data.dict())
    run = Run()
    rig_lock(settings, run)  # one deploy or rollback at a time per rig; the ledger is read under the lock
    if not run.refused_by:
        target, undone = rollback_target(settings.serving["rollback_to"])
        release = settings.for_image(target.image)
        serve_operation_facts(host, operation_reads(release, ("serving",)))
        serving(release, run, kind=ROLLBACK_KIND, restore_rendering=target.rendering, undoing=undone)
