"""pyinfra inventory for tests/lab/test_kv_store_lab.py: the lab's Debian 13 rig as the fleet's Valkey store.

Group ``kv_stores`` (rigkit.settings.defaults.KV_STORE_GROUP), one host: the lab rig on trixie, with its SSH data from
inventory/lab.py and the store's settings below. The rigs share the host network, so the store listens on a
port no lab service uses (not valkey's usual 6379). The password comes from RIGKIT_KV_STORE_PASSWORD.
kv_store_firewall is off: this rig is on host networking, so its nft rules would be this machine's firewall
(rigkit.settings.firewalls.refuse_on_shared_network refuses the default, on).
"""

import runpy

from rigkit.lab.state import read_state
from rigkit.paths import REPO_ROOT

STORE_DATA = {
    "kv_store_port": 6390,
    "kv_store_bind_addresses": ["127.0.0.1"],
    "kv_store_maxmemory_gib": 1,
    "kv_store_maxmemory_policy": "allkeys-lfu",
    "kv_store_firewall": False,
}
STORE_SUITE = "trixie"


def _store_host() -> tuple[str, dict]:
    rig = next(rig for rig in read_state().rigs if rig.distro == STORE_SUITE)
    hosts = dict(runpy.run_path(str(REPO_ROOT / "inventory" / "lab.py"))["lab"])
    connection = {key: value for key, value in hosts[rig.name].items() if key.startswith("ssh_")}
    return rig.name, {**connection, "lab_rig": True, **STORE_DATA}


kv_stores = [_store_host()]
