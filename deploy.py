"""rigkit's one deploy: every role in pipeline order (roles.PIPELINE) on each rig.

    pyinfra -y inventory/lab.py deploy.py

The host's settings are built once, here, before any host is touched: bad input (a tag image, an
unknown name, a bad value, no serving profile) stops the run while pyinfra prepares. A role that
refuses the rig (rig_lock: another deploy holds it; preflight: the bare host cannot serve) names why
in its failing operation, and the rig gets nothing else.

Rigs sharing a KV store (kv_share) must declare one kv_hash_seed and one kv_share_janitor (rigkit.kv_share):
checked over the whole inventory, here and by `rigkit deploy` before it starts pyinfra.

With a rollout set in the data (rollout_canary / rollout_batch), only `rigkit deploy` batches: a plain
pyinfra run would upgrade every rig at once, so it is refused (rigkit.rollout.refuse_unbatched).

The hosts of the inventory group KV_STORE_GROUP ("kv_stores") are the fleet's Valkey store: they get the
kv_store role only (roles.KV_STORE_PIPELINE).
"""

import os

from pyinfra import host, inventory

from rigkit.defaults import KV_STORE_GROUP
from rigkit.hostdata import rig_settings
from rigkit.kv_share import check_inventory
from rigkit.rollout import refuse_unbatched
from roles import KV_STORE_PIPELINE, deploy_rig

if KV_STORE_GROUP in host.groups:  # the fleet's KV store: no serving stack, the store role only
    deploy_rig(rig_settings(host.data.dict(), needs_stack=False), KV_STORE_PIPELINE)
else:
    settings = rig_settings(host.data.dict())
    # rigs sharing a KV store agree on its hash seed and its one janitor: every host of the inventory, targeted or not
    check_inventory((other.name, other.groups, other.data.dict()) for other in inventory)
    refuse_unbatched(settings.rollout, os.environ)
    deploy_rig(settings)
