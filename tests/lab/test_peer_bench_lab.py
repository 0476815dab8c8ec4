"""The Ansible peer of bench/peer_bench.py on real lab rigs (issue 14): the play finds nothing to change on a rig
rigkit deployed (the same compose.yml, .env and daemon.json bytes, compose v1 and v2 rigs, a netns rig), and
pyinfra's floor runs on the lab inventory.

The bench's knob change (Ansible brings up max_num_seqs=16, rigkit sets it back: two vLLM restarts, ~2.5 min) is
not repeated here: `bench/peer_bench.py` runs and checks it (recreated, serving, engine start seen) every time the
bench runs, and the suite keeps its vLLM starts for the product's own paths.
"""

from __future__ import annotations

import sys

import pytest

from rigkit.fleet.inventory import load_inventory
from rigkit.paths import REPO_ROOT
from rigkit.settings.hostdata import rig_settings

sys.path.insert(0, str(REPO_ROOT / "bench"))
import ansible_peer  # noqa: E402
import peer_bench  # noqa: E402

pytestmark = [pytest.mark.lab]


@pytest.fixture(scope="module")
def peer(lab, deployed, tmp_path_factory):
    """(ansible-playbook, {rig: (host data, RigSettings)}, inventory file, work dir), the rigs converged by rigkit."""
    playbook = ansible_peer.ensure_ansible()
    peer_bench.rigkit_deploy(lab.rigs)  # earlier lab tests may have left another release or knob
    hosts = load_inventory(str(REPO_ROOT / "inventory" / "lab.py"))
    rigs = {name: (host["data"], rig_settings(host["data"])) for name, host in hosts.items()}
    directory = tmp_path_factory.mktemp("ansible-peer")
    return playbook, rigs, ansible_peer.write_inputs(rigs, directory), directory


def test_after_rigkits_deploy_the_play_changes_nothing_on_any_rig(lab, peer):
    playbook, _, inventory_file, directory = peer
    control = directory / "cp-noop"
    control.mkdir()
    try:
        cold = peer_bench.ansible_deploy(playbook, inventory_file, lab.rigs, control)
        warm = peer_bench.ansible_deploy(playbook, inventory_file, lab.rigs, control)
    finally:
        ansible_peer.close_masters(control)
    assert (cold.outcome, warm.outcome) == (peer_bench.NO_CHANGE, peer_bench.NO_CHANGE)
    assert list(control.iterdir()) == []  # every ControlPersist master the runs left has exited
    assert peer_bench.rigkit_deploy(lab.rigs).outcome == peer_bench.NO_CHANGE
    assert peer_bench.pyinfra_floor(lab.rigs).seconds > 0
