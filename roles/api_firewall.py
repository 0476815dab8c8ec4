"""api_firewall: the stack's TCP ports reachable from loopback, the controller and the declared sources only.

Ensures, with ``api_firewall`` on (rigkit/firewall.py renders everything from validated values):
- nftables is installed; ``/etc/rigkit/api-firewall.nft`` holds rigkit's table ``inet rigkit_api``: TCP to
  serving_port (and the LMCache ports of a profile that runs LMCache) from loopback, established connections,
  ``api_allowed_sources`` (the router's address) and the controller (``api_allow_controller``: the address
  the deploy's SSH session comes from, read at every deploy) passes; the rest to those ports is dropped and
  counted. Every other packet (SSH included) passes the table untouched, and no other table is changed;
- the table is loaded (``nft -c`` first, one atomic ``nft -f`` replacing only rigkit's table) whenever the
  loaded table does not carry the wanted ruleset's hash, and ``rigkit-api-firewall.service`` loads it at boot.
A re-run with nothing changed changes nothing. Runs before serving, so a new bind never listens unprotected.
With ``api_firewall`` off, a table, unit and ruleset an earlier deploy made are removed; a rig without any
gets no operation. The deploy says when the API listens beyond loopback with no firewall.

Lab rule: a lab rig on host networking shares this machine's network namespace; rigkit.hostdata refuses
api_firewall there before any host is touched, and this role refuses a lab rig whose namespace turns out
to be the controller's.
"""

from __future__ import annotations

import os
from io import StringIO

from pyinfra import host
from pyinfra.api.deploy import deploy
from pyinfra.operations import files, python, systemd

from rigkit.errors import PreflightError
from rigkit.firewall import (RULESET_PATH, UNIT_NAME, UNIT_PATH, allowed_sources, controller_source,
                             exposure_notice, refuse_same_namespace, ruleset, ruleset_comment, source_text,
                             unit_text)
from rigkit.hostdata import RigSettings
from rigkit.operations import refuse, say
from rigkit.operations.apt import packages_installed
from rigkit.operations.firewall import ruleset_loaded, table_removed
from rigkit.survey import RigState
from roles import Run

PACKAGES = ["nftables"]


def controller_namespace() -> str:
    """This machine's network namespace, as the rig's NetworkNamespace fact names one."""
    return os.readlink("/proc/self/ns/net")


def removed(state: RigState) -> None:
    """What an earlier deploy left: the unit stopped and disabled, the table deleted, the files gone."""
    trace = state.api_firewall_trace
    if "unit" in trace:
        systemd.service(name="API firewall unit stopped and disabled", service=UNIT_NAME, running=False,
                        enabled=False)
    if "table" in trace:
        table_removed(name="rigkit's nft table removed")
    files.file(name="API firewall unit file removed", path=UNIT_PATH, present=False)
    files.file(name="API firewall ruleset removed", path=RULESET_PATH, present=False)
    if "unit" in trace:
        systemd.daemon_reload(name="systemd forgets the API firewall unit")


@deploy("api_firewall")
def api_firewall(rig: RigSettings, run: Run) -> None:
    settings, knobs = rig.api_firewall, rig.stack.knobs
    enabled = settings["api_firewall"]
    notice = exposure_notice(enabled, knobs["bind_address"], knobs["serving_port"])
    if notice:
        say(host, notice)
    state = run.rig_state(rig)
    if not enabled:
        if state.api_firewall_trace:
            removed(state)
        return

    try:
        if rig.data.get("lab_rig"):
            refuse_same_namespace(state.net_namespace, controller_namespace())
        controller = controller_source(settings["api_allow_controller"], state.ssh_connection)
    except PreflightError as refused:
        python.call(name="API firewall refused", function=refuse, field=refused.field, value=refused.value,
                    problem=refused.problem, fix=refused.fix)
        run.refused_by = "api_firewall"
        return
    sources = allowed_sources(settings["api_allowed_sources"], controller)
    ports = list(rig.stack.listen_ports.values())

    packages_installed(name="Install nftables", packages=PACKAGES)
    files.put(name="API firewall ruleset", src=StringIO(ruleset(ports, sources)), dest=RULESET_PATH, mode="644")
    unit = files.put(name="API firewall unit (loads the ruleset at boot)", src=StringIO(unit_text()),
                     dest=UNIT_PATH, mode="644")
    systemd.daemon_reload(name="systemd reads the API firewall unit", _if=unit.did_change)
    ruleset_loaded(name="rigkit's nft table holds the ruleset", path=RULESET_PATH,
                   comment=ruleset_comment(ports, sources))
    systemd.service(name="API firewall unit enabled", service=UNIT_NAME, running=True, enabled=True)
    allowed = ", ".join(["loopback", *(source_text(source) for source in sources)])
    say(host, f"api_firewall: TCP {', '.join(map(str, sorted(set(ports))))} from {allowed} only")
