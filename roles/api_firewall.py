"""api_firewall: the stack's TCP ports reachable from loopback, the controller and the declared sources only.

Ensures, with ``api_firewall`` on (rigkit/firewall.py renders everything from validated values):
- nftables is installed; ``/etc/rigkit/api-firewall.nft`` holds rigkit's table ``inet rigkit_api``: TCP to
  serving_port (the LMCache ports of a profile that runs LMCache, node_exporter_port with node_exporter on) from
  loopback, established connections, ``api_allowed_sources`` (the router's address), the inventory's monitoring
  hosts (Run.scrapers) and the controller (``api_allow_controller``: the address the deploy's SSH session comes
  from, read at every deploy) passes; the rest to those ports is dropped and
  counted. Every other packet (SSH included) passes the table untouched, and no other table is changed;
- the table is loaded (``nft -c`` first, one atomic ``nft -f`` replacing only rigkit's table) whenever the
  loaded table does not carry the wanted ruleset's hash, and ``rigkit-api-firewall.service`` loads it at boot.
A re-run with nothing changed changes nothing. Runs before serving, so a new bind never listens unprotected.
With ``api_firewall`` off, a table, unit and ruleset an earlier deploy made are removed; a rig without any
gets no operation. The deploy says when the API listens beyond loopback with no firewall.

Lab rule: a lab rig on host networking shares this machine's network namespace; rigkit.settings.hostdata refuses
api_firewall there before any host is touched, and this role refuses a lab rig whose namespace turns out
to be the controller's.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api.deploy import deploy
from pyinfra.operations import python

from rigkit.errors import PreflightError
from rigkit.facts.batch import FactSpec
from rigkit.firewall import API_FIREWALL, allowed_sources, controller_source, exposure_notice, refuse_same_namespace
from rigkit.operations import refuse, say
from rigkit.settings.hostdata import RigSettings
from roles import Run
from roles.firewall import applied_reads, controller_namespace, firewall_applied, firewall_removed


def operation_reads(rig: RigSettings) -> list[FactSpec]:
    """What this role's operations read on a rig that is already right (taking an old firewall off reads live)."""
    return applied_reads(API_FIREWALL) if rig.api_firewall["api_firewall"] else []


@deploy("api_firewall")
def api_firewall(rig: RigSettings, run: Run) -> None:
    settings, knobs = rig.api_firewall, rig.stack.knobs
    enabled = settings["api_firewall"]
    notice = exposure_notice(enabled, knobs["bind_address"], knobs["serving_port"])
    if notice:
        say(host, notice)
    state = run.rig_state(rig)
    if not enabled:
        firewall_removed(API_FIREWALL, state.api_firewall_trace)
        return

    try:
        if rig.data.get("lab_rig"):
            refuse_same_namespace(API_FIREWALL, state.net_namespace, controller_namespace())
        controller = controller_source(settings["api_allow_controller"], state.ssh_connection)
    except PreflightError as refused:
        python.call(
            name="API firewall refused",
            function=refuse,
            field=refused.field,
            value=refused.value,
            problem=refused.problem,
            fix=refused.fix,
        )
        run.refused_by = "api_firewall"
        return
    sources = allowed_sources([*settings["api_allowed_sources"], *run.scrapers], controller, API_FIREWALL)
    firewall_applied(API_FIREWALL, guarded_ports(rig), sources)


def guarded_ports(rig: RigSettings) -> list[int]:
    """The stack's ports, and the node exporter's where the rig runs one (roles/node_exporter.py)."""
    ports = list(rig.stack.listen_ports.values())
    if rig.node_exporter["node_exporter"]:
        ports.append(rig.node_exporter["node_exporter_port"])
    return ports
