"""kv_store: the fleet's shared KV store, valkey-server with a password, a memory limit, an eviction policy
and a firewall that lets the rigs alone reach it.

Runs on the hosts of the inventory group rigkit.settings.defaults.KV_STORE_GROUP (they get this role only). Ensures
- with ``kv_store_firewall`` on (the default), before valkey is installed or restarted, so a new bind never
  listens unprotected: nftables installed, rigkit.settings.firewalls.KV_STORE_FIREWALL's table ``inet rigkit_kv_store``
  (its own ruleset file and boot unit, independent of the API firewall's on the same host) letting only
  loopback and ``store_sources`` reach kv_store_port: ``kv_store_allowed_sources`` when declared, else every
  rig of the inventory (deploy.py passes ``rigs``: rig name -> rigkit.router.rig_address), resolved on the
  controller; a name that does not resolve, or a loopback rig with the store elsewhere, is refused naming the
  rig. Loaded, re-loaded only when the table lacks the wanted ruleset's hash, exactly as roles/api_firewall.py
  (both use roles/firewall.py). Off: a table, unit and ruleset an earlier deploy made are removed.
- valkey-server installed (Debian 13 ships valkey 8.1; Debian 12's archive has none: refused, naming the OS);
- /etc/valkey/rigkit.conf (root:valkey 0640: it holds the password; never shown in a diff) with the directives
  of rigkit.kv_store.config_text: bind to ``kv_store_bind_addresses`` only, protected-mode, requirepass,
  maxmemory and its policy, no persistence; the package's valkey.conf includes it as its last line;
- the service enabled and running, restarted only when either file changed.
Verifies (while the deploy runs) that a PING without the password is refused with NOAUTH, one with it answers,
and CONFIG GET maxmemory / maxmemory-policy are the declared values. Its variables: rigkit.settings.defaults, section
kv_store; the password is the secret knob kv_store_password (the controller's RIGKIT_KV_STORE_PASSWORD),
checked before any host is touched.

Why the firewall is on by default while api_firewall is off: turning api_firewall on cuts the LAN clients a
rig already serves; the store has no clients but the rigs, so limiting it to them cuts nobody off. The
controller is not allowed (no api_allow_controller here): nothing on the controller talks to the store, and the
role's own check runs on the store host, from loopback or from the address it connects to (which
store_sources allows). Lab rule, as for api_firewall: a lab rig on host networking shares this machine's
network namespace, so its rules would be this machine's firewall; such a store is refused with the firewall
on (tests/lab/inventories/kv_store_rig2.py sets kv_store_firewall false), and a lab rig whose namespace turns
out to be the controller's is refused on the host.
"""

from __future__ import annotations

from typing import Mapping, Optional

from pyinfra import host
from pyinfra.api import StringCommand
from pyinfra.api.deploy import deploy
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import files, python, server, systemd
from pyinfra.operations.util import any_changed

from rigkit.distro import target_os
from rigkit.errors import PreflightError
from rigkit.facts.firewall import FirewallTrace, NetworkNamespace, trace_kwargs
from rigkit.firewall import refuse_same_namespace, wildcard_exposure_notice
from rigkit.kv_store import (
    INCLUDE_LINE,
    KV_STORE_FIREWALL,
    RIGKIT_CONF,
    RIGKIT_CONF_MODE,
    VALKEY_MAIN_CONF,
    VALKEY_PACKAGES,
    VALKEY_USER,
    config_text,
    store_sources,
)
from rigkit.operations import refuse, say
from rigkit.operations.apt import packages_installed
from rigkit.operations.files import secret_file
from rigkit.operations.kv_store import store_verified
from rigkit.remote.tunnel import ssh_address
from rigkit.settings.firewalls import VALKEY_SERVICE, refuse_on_shared_network
from rigkit.settings.hostdata import RigSettings, required_secret
from roles import Run
from roles.firewall import controller_namespace, firewall_applied, firewall_removed

# valkey-server is in Debian from 13 (trixie) on; Debian 12's archive has only redis-server, whose config and
# service differ, so the role refuses there rather than install another server.
KV_STORE_SUPPORTED_OS = frozenset({("debian", "13")})


@deploy("kv_store")
def kv_store(rig: RigSettings, run: Run, rigs: Optional[Mapping[str, str]] = None) -> None:
    settings = rig.kv_store
    password = required_secret(rig.data, "kv_store_password", "the kv_store role")
    text = config_text(settings, password)
    enabled = settings["kv_store_firewall"]
    if enabled:  # every refusal of the data before the host is asked anything
        refuse_on_shared_network(KV_STORE_FIREWALL, rig.data, enabled)
        sources = store_sources(settings, (host.name, ssh_address(host.name, rig.data)), rigs or {})
    target_os(host.get_fact(LinuxDistribution)["release_meta"], "kv_store", KV_STORE_SUPPORTED_OS)
    notice = (
        None
        if enabled
        else wildcard_exposure_notice(
            "kv_store",
            "kv_store_bind_addresses",
            settings["kv_store_bind_addresses"],
            settings["kv_store_port"],
            KV_STORE_FIREWALL.setting,
        )
    )
    if notice:
        say(host, notice)

    if not enabled:
        firewall_removed(KV_STORE_FIREWALL, host.get_fact(FirewallTrace, **trace_kwargs(KV_STORE_FIREWALL)))
    else:
        try:
            if rig.data.get("lab_rig"):
                refuse_same_namespace(KV_STORE_FIREWALL, host.get_fact(NetworkNamespace), controller_namespace())
        except PreflightError as refused:
            python.call(
                name="KV store firewall refused",
                function=refuse,
                field=refused.field,
                value=refused.value,
                problem=refused.problem,
                fix=refused.fix,
            )
            run.refused_by = "kv_store"
            return
        firewall_applied(KV_STORE_FIREWALL, [settings["kv_store_port"]], sources)
    packages_installed(name="Install valkey-server", packages=list(VALKEY_PACKAGES))
    config = secret_file(
        name="rigkit's valkey directives (password, limit, policy, bind)",
        dest=RIGKIT_CONF,
        text=text,
        mode=RIGKIT_CONF_MODE,
        user="root",
        group=VALKEY_USER,
    )
    include = files.line(
        name="valkey.conf includes rigkit's directives last",
        path=VALKEY_MAIN_CONF,
        line=INCLUDE_LINE,
        ensure_newline=True,
    )
    systemd.service(name="valkey-server enabled and running", service=VALKEY_SERVICE, running=True, enabled=True)
    # the package starts valkey with its own defaults: any change of either file needs a restart to apply
    # a plain restart: systemd.service(restarted=True) plans "start" for a service not running while the deploy
    # is prepared, which on a fresh host (started by the package meanwhile) would leave the defaults in force
    server.shell(
        name="Restart valkey-server for the new configuration",
        commands=[StringCommand("systemctl", "restart", VALKEY_SERVICE)],
        _if=any_changed(config, include),
    )
    store_verified(
        name="Verify valkey refuses a client without the password and holds the declared limit", store=settings
    )
