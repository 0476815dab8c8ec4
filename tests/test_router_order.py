"""pyinfra interleaves the operation sequences of different hosts (a topological sort, layer by layer): the one
ordering operation deploy.py adds on every host (rigkit.operations.router.rigs_before_router) puts every router
operation after every rig operation. A deploy file shaped like deploy.py, loaded by pyinfra's own CLI loader."""

from __future__ import annotations

import pyinfra
import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_state
from pyinfra_cli.util import load_deploy_file

DEPLOY_SHAPE = """
from pyinfra import host
from pyinfra.operations import server
from rigkit.operations.router import rigs_before_router
from rigkit.router import is_gateway
if not is_gateway(host.groups):
    for i in range(4):
        server.shell(name=f"rig op {i}", commands=["true"])
if ORDERED and any(is_gateway(other.groups) for other in host.inventory):
    rigs_before_router(name="Rigs first, then the router")
if is_gateway(host.groups):
    for i in range(2):
        server.shell(name=f"router op {i}", commands=["true"])
"""


def op_order(tmp_path, ordered: bool) -> list[str]:
    deploy = tmp_path / "deploy_shape.py"
    deploy.write_text(f"ORDERED = {ordered}\n" + DEPLOY_SHAPE)
    inventory = Inventory((["rig1", "gw"], {}), routers=(["gw"], {}))
    state = State(inventory, Config())
    state.current_stage = StateStage.Prepare
    for host in inventory:
        host.connected = True
        state.activate_host(host)
    was_cli, pyinfra.is_cli = pyinfra.is_cli, True
    state.current_op_file_number = 0
    try:
        with ctx_state.use(state):
            load_deploy_file(state, str(deploy))
    finally:
        pyinfra.is_cli = was_cli
    return [next(iter(state.op_meta[op_hash].names)) for op_hash in state.get_op_order()]


@pytest.mark.parametrize("ordered", [True, False])
def test_router_operations_come_after_every_rig_operation(tmp_path, ordered: bool) -> None:
    order = op_order(tmp_path, ordered)
    first_router = order.index("router op 0")
    last_rig = order.index("rig op 3")
    # without the ordering operation the router would start while the rigs are still being released
    assert (first_router > last_rig) is ordered, order
