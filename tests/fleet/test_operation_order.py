"""rigkit's operation order equals pyinfra's own (pyinfra/api/util.py get_operation_order_from_stack) on the same
stack: a deploy file calling a role calling a frame inside pyinfra's tree, with the deploy file known or not, in CLI
mode or not."""

import importlib
from types import SimpleNamespace

import pyinfra
import pytest
from pyinfra.api.util import PYINFRA_INSTALL_DIR, get_operation_order_from_stack

from rigkit.fleet import operation_order

DEPLOY_FILE = "/srv/fleet/deploy.py"  # compiled under this name: its frames carry it, as pyinfra's exec of a deploy


def both_orders(state):
    return get_operation_order_from_stack(state), operation_order.operation_order(state)  # one line: one lineno


def compiled(filename: str, source: str) -> dict:
    namespace = {"both_orders": both_orders}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


# a frame inside pyinfra's tree (its filter drops those), called by the role, calling the two functions
INSIDE_PYINFRA = compiled(
    f"{PYINFRA_INSTALL_DIR}/api/fake_operation.py", "def op(state):\n    return both_orders(state)\n"
)
ROLE = compiled("/srv/fleet/roles/serving.py", "def role(state, op):\n    x = 1\n    return op(state)\n")
DEPLOY = compiled(DEPLOY_FILE, "def main(state, role, op):\n\n    return role(state, op)\n")


@pytest.mark.parametrize("deploy_filename", [DEPLOY_FILE, "/srv/fleet/other.py", None])
@pytest.mark.parametrize("is_cli", [True, False])
def test_the_same_line_numbers_as_pyinfras_own(monkeypatch, deploy_filename, is_cli):
    monkeypatch.setattr(pyinfra, "is_cli", is_cli)
    state = SimpleNamespace(current_deploy_filename=deploy_filename, current_op_file_number=7)
    theirs, ours = DEPLOY["main"](state, ROLE["role"], INSIDE_PYINFRA["op"])
    assert ours == theirs
    if deploy_filename == DEPLOY_FILE:  # from the deploy file down: its line, the role's, this module's
        assert ours == ([7] if is_cli else []) + [3, 3, both_orders.__code__.co_firstlineno + 1]


def test_installed_it_is_what_pyinfras_operations_call(monkeypatch):
    pyinfra_operation = importlib.import_module("pyinfra.api.operation")
    monkeypatch.setattr(pyinfra_operation, "get_operation_order_from_stack", get_operation_order_from_stack)
    operation_order.install()
    assert pyinfra_operation.get_operation_order_from_stack is operation_order.operation_order
