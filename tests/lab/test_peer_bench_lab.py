"""The Ansible peer of bench/peer_bench.py on real lab rigs (issue 14): the play finds nothing to change on a rig
rigkit deployed (the same compose.yml, .env and daemon.json bytes, compose v1 and v2 rigs, a netns rig), pyinfra's
floor runs on the lab inventory, and a knob change brought up by Ansible is recreated and serving, measured by the
bench's own code (engine start seen), then set back by rigkit's deploy, which serves its own rendering again.
"""

from __future__ import annotations

import sys

import pytest

from rigkit.fleet import load_inventory
from rigkit.hostdata import rig_settings
from rigkit.paths import REPO_ROOT

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


def test_a_knob_change_by_ansible_serves_and_rigkit_sets_it_back(lab, peer):
    playbook, rigs, _, directory = peer
    host_network = [rig for rig in lab.rigs if not rig.netns]
    # compose v2 (`docker compose`) where the lab has a Debian 13 rig: the play's other compose command
    rig = next((r for r in host_network if r.distro == "trixie"), host_network[0])
    data, baseline = rigs[rig.name]
    changed = peer_bench.knob_changed(data, "max_num_seqs", 16)
    inventory_file = ansible_peer.write_inputs({rig.name: (data, changed)}, directory / "knob")
    control = directory / "cp-knob"
    control.mkdir()
    try:
        by_ansible = peer_bench.knob_change(
            peer_bench.ANSIBLE, "sets max_num_seqs=16", rig,
            lambda: peer_bench.ansible_deploy(playbook, inventory_file, [rig], control), changed.stack.knobs_hash)
    finally:
        ansible_peer.close_masters(control)
    assert by_ansible.recreated and by_ansible.serving, by_ansible
    assert by_ansible.engine_start_s is not None and 0 < by_ansible.engine_start_s < by_ansible.wall_s

    by_rigkit = peer_bench.knob_change(peer_bench.RIGKIT, "sets it back", rig,
                                       lambda: peer_bench.rigkit_deploy([rig]), baseline.stack.knobs_hash)
    assert by_rigkit.recreated and by_rigkit.serving, by_rigkit
    assert by_rigkit.engine_start_s is not None and 0 < by_rigkit.engine_start_s < by_rigkit.wall_s
    assert peer_bench.rigkit_deploy([rig]).outcome == peer_bench.NO_CHANGE
