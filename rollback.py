"""Roll each rig back by digest, without a pull when the image is still on the rig.

    pyinfra -y inventory/lab.py rollback.py                                   # last known-good
    pyinfra -y inventory/lab.py rollback.py --data rollback_to=REPO@sha256:... # a given release

The target comes from the rig's release ledger (the newest release whose smoke passed, other than
the one running now) unless ``rollback_to`` names one. The rollback is a release like any other:
same rendering, same wait and smoke, recorded in the ledger with kind "rollback".
"""

from pyinfra import host
from pyinfra.facts.files import FileContents

from rigkit.errors import ConfigError
from rigkit.ledger import LEDGER_PATH, Ledger
from rigkit.registry import require_digest
from roles.rig_lock import rig_lock
from roles.serving import serving


def rollback_target() -> str:
    wanted = host.data.get("rollback_to")
    if wanted:
        return require_digest(wanted, "rollback_to")
    ledger = Ledger.from_json("\n".join(host.get_fact(FileContents, path=LEDGER_PATH) or []))
    current = ledger.current.image if ledger.current else None
    good = ledger.last_known_good(exclude_image=current)
    if good is None:
        raise ConfigError("rollback_to", None,
                          f"{host.name}'s ledger has no known-good release other than the running one ({current})",
                          "pass --data rollback_to=REPO@sha256:<digest>")
    return good.image


if rig_lock():  # one deploy or rollback at a time per rig; the ledger is read under the lock
    serving(image_override=rollback_target(), kind="rollback")
