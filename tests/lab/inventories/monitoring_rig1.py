"""pyinfra inventory for tests/lab/test_monitoring_lab.py: the lab's host-network rigs with a node exporter each,
and the first of them also as the fleet's monitoring host.

Group ``lab`` (so group_data/lab.py gives the rigs their profile and release, as for inventory/lab.py): the rigs of
inventory/lab.py that share the host network (a netns rig binds its API to its own loopback, which no other host
scrapes), each with its own node_exporter_port (they share one network namespace).
Group ``monitoring`` (rigkit.settings.defaults.MONITORING_GROUP), one host ``monitor``: rig1's SSH data, Prometheus
on 127.0.0.1:MONITORING_PORT, which the controller reaches (the same namespace), scraping every 2 s.
"""

import runpy

from rigkit.paths import REPO_ROOT

MONITORING_PORT = 9390
NODE_EXPORTER_PORT_BASE = 9300
SCRAPE_INTERVAL_S = 2

_lab = runpy.run_path(str(REPO_ROOT / "inventory" / "lab.py"))["lab"]
lab = [
    (name, {**data, "node_exporter": True, "node_exporter_port": NODE_EXPORTER_PORT_BASE + index})
    for index, (name, data) in enumerate(_lab, start=1)
    if not data["lab_netns"]
]
monitoring = [
    (
        "monitor",
        {
            **{key: value for key, value in lab[0][1].items() if key.startswith("ssh_")},
            "lab_rig": True,
            "monitoring_port": MONITORING_PORT,
            "monitoring_scrape_interval_s": SCRAPE_INTERVAL_S,
        },
    )
]
