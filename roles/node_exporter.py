"""node_exporter: Debian's prometheus-node-exporter on the rig and rigkit's textfile collector, for the monitoring
host's Prometheus (roles/monitoring.py). Only with ``node_exporter`` on; off, nothing is installed or changed.

Ensures
- /etc/default/prometheus-node-exporter holds rigkit's ARGS (listen on the rig's bind_address at
  node_exporter_port) before the package is installed: dpkg keeps the file (--force-confold), so the exporter never
  listens with the package's default (every address, 9100). Behind the API firewall when that is on: the role runs
  after api_firewall, whose table then guards node_exporter_port too (roles/api_firewall.py);
- prometheus-node-exporter installed, enabled, running, restarted when its ARGS changed;
- rigkit/files/node_textfile.py at RIG_LIB_DIR, run as root every TEXTFILE_INTERVAL_S seconds by a systemd timer,
  writing rigkit.prom into Debian's textfile directory: the GPUs from ``nvidia-smi --query-gpu``, NVRM Xid lines
  of the kernel log, /dev/shm and the L2 store against its budget (the janitor's status file).

Why nvidia-smi and not DCGM's exporter: DCGM (datacenter-gpu-manager) and dcgm-exporter are in no Debian archive
(NVIDIA's CUDA repository and a container), DCGM's profiling metrics do not cover the GeForce cards the story's rigs
run, and the driver rigkit installs already ships nvidia-smi: one query per interval, no daemon.
"""

from __future__ import annotations

from io import StringIO

from pyinfra.api.deploy import deploy
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import files, systemd
from pyinfra.operations.util import any_changed

from rigkit.facts.batch import FactSpec
from rigkit.facts.surveyed import put_reads, service_reads
from rigkit.files.l2_janitor import STATUS_FILE
from rigkit.monitoring.prometheus import (
    NODE_EXPORTER_DEFAULTS,
    NODE_EXPORTER_PACKAGES,
    NODE_EXPORTER_SERVICE,
    TEXTFILE,
    TEXTFILE_INTERVAL_S,
    node_exporter_args,
)
from rigkit.operations.apt import packages_installed
from rigkit.paths import FILES_DIR, RIG_LIB_DIR
from rigkit.settings.hostdata import RigSettings
from rigkit.systemd import exec_command_line
from roles import Run

TEXTFILE_SOURCE = FILES_DIR / "node_textfile.py"
TEXTFILE_SCRIPT = f"{RIG_LIB_DIR}/node_textfile.py"
TEXTFILE_UNIT = "rigkit-node-textfile.service"
TEXTFILE_TIMER = "rigkit-node-textfile.timer"
UNIT_DIR = "/etc/systemd/system"


def defaults_text(rig: RigSettings) -> str:
    args = node_exporter_args(rig.stack.knobs["bind_address"], rig.node_exporter["node_exporter_port"])
    return f"# rigkit: written by roles/node_exporter.py; edits are overwritten\n{args}\n"


def textfile_unit() -> str:
    command = exec_command_line(["/usr/bin/python3", TEXTFILE_SCRIPT, TEXTFILE, STATUS_FILE])
    return (
        "[Unit]\nDescription=rigkit textfile collector: GPUs, Xid lines, /dev/shm, L2 for the node exporter\n\n"
        f"[Service]\nType=oneshot\nExecStart={command}\n"
    )


def textfile_timer() -> str:
    return (
        "[Unit]\nDescription=rigkit textfile collector, every "
        f"{TEXTFILE_INTERVAL_S} s\n\n[Timer]\nOnBootSec=10s\nOnUnitActiveSec={TEXTFILE_INTERVAL_S}s\n"
        "AccuracySec=1s\n\n[Install]\nWantedBy=timers.target\n"
    )


def operation_reads(rig: RigSettings) -> list[FactSpec]:
    """What this role's operations read on a rig that is already right."""
    if not rig.node_exporter["node_exporter"]:
        return []
    return [
        FactSpec.of(DebPackages),
        *put_reads(NODE_EXPORTER_DEFAULTS),
        *put_reads(TEXTFILE_SCRIPT),
        *put_reads(f"{UNIT_DIR}/{TEXTFILE_UNIT}"),
        *put_reads(f"{UNIT_DIR}/{TEXTFILE_TIMER}"),
        *service_reads(TEXTFILE_TIMER),
        *service_reads(NODE_EXPORTER_SERVICE),
    ]


@deploy("node_exporter")
def node_exporter(rig: RigSettings, run: Run) -> None:
    if not rig.node_exporter["node_exporter"]:
        return
    defaults = files.put(
        name="node exporter listens on the rig's bind address (before the package: dpkg keeps it)",
        src=StringIO(defaults_text(rig)),
        dest=NODE_EXPORTER_DEFAULTS,
        mode="644",
    )
    packages_installed(
        name="Install prometheus-node-exporter", packages=list(NODE_EXPORTER_PACKAGES), no_recommends=True
    )
    files.put(name="rigkit textfile collector script", src=str(TEXTFILE_SOURCE), dest=TEXTFILE_SCRIPT, mode="755")
    unit = files.put(
        name="rigkit textfile collector unit", src=StringIO(textfile_unit()), dest=f"{UNIT_DIR}/{TEXTFILE_UNIT}"
    )
    timer = files.put(
        name="rigkit textfile collector timer", src=StringIO(textfile_timer()), dest=f"{UNIT_DIR}/{TEXTFILE_TIMER}"
    )
    systemd.daemon_reload(name="systemd reads the textfile collector's units", _if=any_changed(unit, timer))
    systemd.service(name="textfile collector timer running", service=TEXTFILE_TIMER, running=True, enabled=True)
    systemd.service(name="node exporter running", service=NODE_EXPORTER_SERVICE, running=True, enabled=True)
    systemd.service(
        name="node exporter restarted for its new address",
        service=NODE_EXPORTER_SERVICE,
        restarted=True,
        _if=defaults.did_change,
    )
