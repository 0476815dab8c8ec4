"""pyinfra inventory of the local lab: one host per rig, read from the lab state file.

    rigkit lab up && .venv/bin/pyinfra -y inventory/lab.py deploy.py

Group `lab`. Per host: SSH connection data (lab key, the lab's known_hosts, strict checking, no agent;
127.0.0.1:22NN for a rig on host networking, its own address port 22 for a rig in its own network
namespace), `serving_port` (rigs on the host network share it, so each serves on its own port),
`l2_device` (the rig's spare "NVMe", an unformatted loop device), `lab_rig=True` and `lab_netns` (the rig
has its own network namespace: only such a rig may take api_firewall, whose rules on a host-network rig would
be this machine's firewall). A netns rig's loopback is its own: the controller reaches its serving API only
through the SSH tunnel.
The shared KV tier's stand-in for a NAS: the host directory every rig has bind-mounted at the same path
(`kv_share_fstype` none); `--data kv_share=true` puts cpu-lab's store there, the first rig its one janitor.
"""

from rigkit.lab.rigs import KV_SHARE_DIR as _KV_SHARE_DIR
from rigkit.lab.rigs import KV_SHARE_IN_RIG as _KV_SHARE_IN_RIG
from rigkit.lab.state import read_state as _read_state


def _lab_hosts() -> list:
    state = _read_state()  # no lab: ConfigError "... run `rigkit lab up` first"
    return [
        (
            rig.name,
            {
                **state.ssh_data(rig),
                "serving_port": rig.serving_port,
                "l2_device": rig.nvme_path,
                "lab_rig": True,
                "lab_netns": rig.netns,
                "lab_registry": state.registry,
                "kv_share_source": f"lab:{_KV_SHARE_DIR}",
                "kv_share_mount_point": _KV_SHARE_IN_RIG,
                "kv_share_fstype": "none",
                "kv_share_janitor": index == 0,
            },
        )
        for index, rig in enumerate(state.rigs)
    ]


lab = _lab_hosts()
