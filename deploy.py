"""rigkit's one deploy: every role in pipeline order (roles.PIPELINE) on each rig, the router on each gateway.

    pyinfra -y inventory/lab.py deploy.py

The host's settings are built once, here, before any host is touched: bad input (a tag image, an
unknown name, a bad value, no serving profile) stops the run while pyinfra prepares. A role that
refuses the rig (rig_lock: another deploy holds it; preflight: the bare host cannot serve) names why
in its failing operation, and the rig gets nothing else.

Rigs sharing a KV store (kv_share) must declare one kv_hash_seed and one kv_share_janitor (rigkit.kv_share):
checked over the whole inventory, here and by `rigkit deploy` before it starts pyinfra.

A host of the inventory group ROUTER_GROUP ("routers") is a gateway: it gets the router role only, and the
router's workers are every other host of the inventory (the rigs, also those a --limit leaves out: the router
routes to the whole fleet). Its settings and every rig's are validated here too. The controller itself (@local) as
a gateway is refused unless its data says router_on_controller: true (rigkit.router.refuse_router_on_controller).

With a rollout set in the data (rollout_canary / rollout_batch), only `rigkit deploy` batches: a plain
pyinfra run would upgrade every rig at once, so it is refused (rigkit.rollout.plan.refuse_unbatched).

The hosts of the inventory group KV_STORE_GROUP ("kv_stores") are the fleet's Valkey store: they get the
kv_store role only, whose firewall lets every rig of the inventory in (the same rigs the router routes to).

The hosts of the inventory group MONITORING_GROUP ("monitoring") get the monitoring role only: Prometheus scraping
every rig of the inventory (also those a --limit leaves out) and each gateway's router; a rig's API firewall lets
the monitoring hosts in (Run.scrapers).
"""

import os
from io import StringIO

from pyinfra import host, inventory
from pyinfra.operations import files

from rigkit.errors import RigkitError
from rigkit.fleet import deploy_process
from rigkit.fleet.inventory import inventory_rigs
from rigkit.fleet.provision import roles_until
from rigkit.kv_share import check_inventory
from rigkit.listeners import refuse_shared_ports
from rigkit.monitoring.prometheus import fleet_targets, scraper_addresses
from rigkit.operations.router import rigs_before_router
from rigkit.remote.tunnel import ssh_address
from rigkit.rollout.plan import refuse_unbatched
from rigkit.rollout.router_record import ROUTER_RECORD_PATH, inventory_record
from rigkit.router import is_gateway, refuse_router_on_controller, rig_address, workers
from rigkit.settings.defaults import KV_STORE_GROUP, MONITORING_GROUP
from rigkit.settings.hostdata import RigSettings, rig_settings
from roles import PIPELINE, Run, deploy_rig

deploy_process.install()  # cheaper operations and collections in this process (rigkit.fleet.deploy_process)


def validated(needs_stack: bool = True) -> RigSettings:
    """This host's settings; a refusal raised from this file, so plain pyinfra names deploy.py, not rigkit's
    internals, before the refusal's own field, value and fix."""
    try:
        return rig_settings(host.data.dict(), needs_stack=needs_stack)
    except RigkitError as refusal:
        raise refusal.with_traceback(None) from None


# two services of this host's machine on one port (a node exporter on the serving port, the KV store declared on a
# rig's box): refused here, before any host is touched
try:
    refuse_shared_ports(((other.name, other.groups, other.data.dict()) for other in inventory), only=[host.name])
except RigkitError as refusal:
    raise refusal.with_traceback(None) from None
gateway = is_gateway(host.groups)
# Each group's own role is imported by its branch: a rig's run never loads the router's HTTP client or the
# monitoring role's dashboards (~50 ms of every run's start).
if KV_STORE_GROUP in host.groups:  # the fleet's KV store: no serving stack, the store role only
    from roles.kv_store import kv_store

    settings = validated(needs_stack=False)
    rigs = inventory_rigs(host.inventory) if settings.kv_store["kv_store_firewall"] else {}
    kv_store(
        settings, Run(), {name: rig_address(name, data, knobs["bind_address"]) for name, (data, knobs) in rigs.items()}
    )
elif MONITORING_GROUP in host.groups:  # Prometheus over the whole fleet: every rig's data validated here too
    from roles.monitoring import monitoring

    settings = validated(needs_stack=False)
    monitoring(settings, Run(), fleet_targets(host.inventory, ssh_address(host.name, host.data.dict())))
elif gateway:  # every rig's data validated here too: a bad value stops the run before any host is touched
    settings = rig_settings(host.data.dict(), needs_stack=False)
    refuse_router_on_controller(host.name, settings.router)
    settings = validated(needs_stack=False)
    refuse_unbatched(settings.rollout, os.environ)
    router_workers = workers(inventory_rigs(host.inventory))
else:
    settings = validated()
    # rigs sharing a KV store agree on its hash seed and its one janitor: every host of the inventory, targeted or not
    check_inventory((other.name, other.groups, other.data.dict()) for other in inventory)
    refuse_unbatched(settings.rollout, os.environ)
    roles = roles_until(PIPELINE, os.environ)  # rigkit deploy provisions a fresh rig's model store first
    run = deploy_rig(settings, roles, run=Run(scrapers=tuple(scraper_addresses(inventory))))
    # the rig remembers the router it is behind: a later deploy through an inventory that declares none still knows
    # not to restart every rig of that router at once (rigkit.rollout.router_record)
    record = inventory_record({other.name: other.groups for other in inventory})
    if record is not None and not run.refused_by and roles == PIPELINE:
        files.put(
            name="The router this rig is behind",
            src=StringIO(record.text()),
            dest=ROUTER_RECORD_PATH,
            mode="644",
            create_remote_dir=False,
        )
# The router waits at start for its workers (rigkit.router.ROUTER_WORKER_STARTUP_TIMEOUT_S): every rig is
# released and smoked first, then the router is started and checked against them.
if any(is_gateway(other.groups) for other in host.inventory):
    rigs_before_router(name="Rigs first, then the router")
if gateway:
    from roles.router import router

    router(settings, Run(), router_workers)
