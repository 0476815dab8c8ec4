"""rigkit.fleet.deploy, the `rigkit deploy` command: the release each rig serves, as its ledger says (the command's
options are tested in test_rollout, the parts in test_inventory, test_pyinfra_args, test_fleet_outcome and
test_fleet_table)."""

from __future__ import annotations

from rigkit.fleet.deploy import ledger_release
from rigkit.serving.ledger import Ledger, Release


def test_ledger_release():
    ledger = Ledger(
        [
            Release("r@sha256:" + "cd" * 32, "p", "k"),
            Release("r@sha256:" + "ab" * 32, "p", "k", kind="rollback", smoke="pass"),
        ]
    )
    assert ledger_release(ledger.to_json()) == "abababababab rollback smoke=pass"
    assert ledger_release("") == ""
