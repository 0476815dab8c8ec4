"""kv_store: the fleet's shared KV store, valkey-server with a password, a memory limit and an eviction policy.

Runs on the hosts of the inventory group rigkit.defaults.KV_STORE_GROUP (they get this role only). Ensures
- valkey-server installed (Debian 13 ships valkey 8.1; Debian 12's archive has none: refused, naming the OS);
- /etc/valkey/rigkit.conf (root:valkey 0640: it holds the password; never shown in a diff) with the directives
  of rigkit.kv_store.config_text: bind to ``kv_store_bind_addresses`` only, protected-mode, requirepass,
  maxmemory and its policy, no persistence; the package's valkey.conf includes it as its last line;
- the service enabled and running, restarted only when either file changed.
Verifies (while the deploy runs) that a PING without the password is refused with NOAUTH, one with it answers,
and CONFIG GET maxmemory / maxmemory-policy are the declared values. Its variables: rigkit.defaults, section
kv_store; the password is the secret knob kv_store_password (the controller's RIGKIT_KV_STORE_PASSWORD),
checked before any host is touched.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api.deploy import deploy
from pyinfra.facts.server import LinuxDistribution
from pyinfra.api import StringCommand
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

from rigkit.distro import target_os
from rigkit.hostdata import RigSettings, required_secret
from rigkit.kv_store import (INCLUDE_LINE, RIGKIT_CONF, RIGKIT_CONF_MODE, VALKEY_MAIN_CONF, VALKEY_PACKAGES,
                             VALKEY_SERVICE, VALKEY_USER, config_text)
from rigkit.operations.apt import packages_installed
from rigkit.operations.files import secret_file
from rigkit.operations.kv_store import store_verified
from roles import Run

# valkey-server is in Debian from 13 (trixie) on; Debian 12's archive has only redis-server, whose config and
# service differ, so the role refuses there rather than install another server.
KV_STORE_SUPPORTED_OS = frozenset({("debian", "13")})


@deploy("kv_store")
def kv_store(rig: RigSettings, run: Run) -> None:
    settings = rig.kv_store
    password = required_secret(rig.data, "kv_store_password", "the kv_store role")
    text = config_text(settings, password)
    target_os(host.get_fact(LinuxDistribution)["release_meta"], "kv_store", KV_STORE_SUPPORTED_OS)

    packages_installed(name="Install valkey-server", packages=list(VALKEY_PACKAGES))
    config = secret_file(name="rigkit's valkey directives (password, limit, policy, bind)", dest=RIGKIT_CONF,
                         text=text, mode=RIGKIT_CONF_MODE, user="root", group=VALKEY_USER)
    include = files.line(name="valkey.conf includes rigkit's directives last", path=VALKEY_MAIN_CONF,
                         line=INCLUDE_LINE, ensure_newline=True)
    systemd.service(name="valkey-server enabled and running", service=VALKEY_SERVICE, running=True, enabled=True)
    # the package starts valkey with its own defaults: any change of either file needs a restart to apply
    # a plain restart: systemd.service(restarted=True) plans "start" for a service not running while the deploy
    # is prepared, which on a fresh host (started by the package meanwhile) would leave the defaults in force
    server.shell(name="Restart valkey-server for the new configuration",
                 commands=[StringCommand("systemctl", "restart", VALKEY_SERVICE)], _if=any_changed(config, include))
    store_verified(name="Verify valkey refuses a client without the password and holds the declared limit",
                   store=settings)
