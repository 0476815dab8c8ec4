"""`rigkit status`, the command: --data read by pyinfra's own code, a malformed one refused before any rig is asked."""

from __future__ import annotations

import argparse

from rigkit.commands import status as status_command
from rigkit.fleet.targets import select


def test_data_values_are_read_by_pyinfra_itself(tmp_path):
    inventory = tmp_path / "inventory.py"
    inventory.write_text("rigs = [('rig1', {'ssh_password': 'lab'})]\n")
    samples = {"a": "true", "b": "8", "c": '{"method": "mtp"}', "d": '["--x"]', "e": "tiny", "f": "0,1"}
    targets = select(str(inventory), data=[f"{key}={value}" for key, value in samples.items()])
    data = targets.data("rig1")
    assert [data[key] for key in samples] == [True, 8, {"method": "mtp"}, ["--x"], "tiny", "0,1"]


def test_a_malformed_data_pair_is_refused_before_the_inventory_is_read(capsys):
    args = argparse.Namespace(inventory="inventory/none.py", limit=[], data=["no-equals-sign"], json=False)
    assert status_command.run(args) == 2
    err = capsys.readouterr().err
    assert "refused before any rig was asked: --data='no-equals-sign': is not KEY=VALUE" in err
