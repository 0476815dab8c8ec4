"""rollback.py, the deploy file, on each kind of host of a fleet inventory: a gateway (group routers) or the KV
store (group kv_stores) has no release and is left alone, saying so; a rig goes on to its lock and ledger."""

from __future__ import annotations

import gc
import logging
import runpy

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_host, ctx_state

from rigkit.fleet.inventory import is_service_host, rigs_among
from rigkit.paths import REPO_ROOT
from rigkit.settings.defaults import KV_STORE_GROUP, MONITORING_GROUP, ROUTER_GROUP

IMAGE_REPO = "127.0.0.1:5000/rigkit/vllm-cpu-tiny"


class FactRead(Exception):
    """Raised by the fake host's fact reader: the deploy file reached the rig's state."""


def run_rollback_on(name: str, caplog) -> State:
    rig = ("rig1", {"serving_profile": "cpu-lab", "serving_image": f"{IMAGE_REPO}@sha256:{'ab' * 32}"})
    inventory = Inventory(
        ([rig, "gw", "store", "mon"], {}),
        **{ROUTER_GROUP: (["gw"], {}), KV_STORE_GROUP: (["store"], {}), MONITORING_GROUP: (["mon"], {})},
    )
    state = State(inventory, Config())
    state.print_noop_info = True
    host = inventory.get_host(name)
    host.connected = True

    def read_fact(*args, **kwargs):
        raise FactRead(name)

    host.get_fact = read_fact  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.INFO), ctx_state.use(state), ctx_host.use(host):
            runpy.run_path(str(REPO_ROOT / "rollback.py"))
    finally:
        gc.unfreeze()  # the deploy file froze this test session's objects (rigkit.fleet.deploy_process)
    return state


@pytest.mark.parametrize("service_host", ["gw", "store", "mon"])
def test_a_gateway_the_kv_store_or_monitoring_has_nothing_rolled_back_and_says_so(service_host, caplog):
    state = run_rollback_on(service_host, caplog)
    assert state.get_op_order() == []
    assert (
        f"{service_host} is a gateway, a KV store or a monitoring host, not a rig: it has no release to roll back"
        in caplog.text
    )


def test_a_rig_of_the_same_inventory_goes_on_to_its_own_state(caplog):
    with pytest.raises(FactRead):  # the rig's lock and ledger are read: its rollback proceeds
        run_rollback_on("rig1", caplog)


def test_the_service_hosts_are_the_router_and_store_groups_and_rigs_among_leaves_them_out():
    assert is_service_host([ROUTER_GROUP]) and is_service_host(["lab", KV_STORE_GROUP]) and not is_service_host(["lab"])
    hosts = {"rig1": {"groups": ["lab"]}, "gw": {"groups": [ROUTER_GROUP]}, "store": {"groups": [KV_STORE_GROUP]}}
    assert rigs_among(hosts, ["rig1", "gw", "store"]) == ["rig1"]
