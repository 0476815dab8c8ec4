"""pyinfra inventory of the local lab behind its router: the rigs `rigkit lab up --router` routes to, and that router
(vllm-router on this machine's loopback, started by the lab) as the gateway `@local`.

    rigkit lab up && rigkit deploy inventory/lab.py     # release 1 on every rig
    rigkit lab up --router                               # the router in front of the rigs that serve
    rigkit deploy inventory/lab_router.py --data serving_image=<release 2>   # one rig at a time, each drained first

`rigkit deploy` on it goes one rig at a time through the router (rigkit.rollout.drain.routed_default); the router
role is never run here (refused on the controller: the lab runs its own router). Rigs the router left out (a rig in
its own network namespace, one that did not serve) are not in this inventory.
"""

import runpy as _runpy
from pathlib import Path as _Path

from rigkit.errors import ConfigError as _ConfigError
from rigkit.lab.router_server import LAB_ROUTER_HOST as _HOST
from rigkit.lab.router_server import LAB_ROUTER_PORT as _PORT
from rigkit.lab.state import read_state as _read_state
from rigkit.router import CONTROLLER_HOST as _CONTROLLER

_state = _read_state()  # no lab: ConfigError "... run `rigkit lab up` first"
if not _state.router:
    raise _ConfigError("lab router", None, "the lab runs no router", "run `rigkit lab up --router` (after a deploy)")
_behind = set(_state.router["workers"])
_lab = dict(_runpy.run_path(str(_Path(__file__).with_name("lab.py")))["lab"])  # the lab's own host data

lab = [(name, data) for name, data in _lab.items() if name in _behind]
routers = [(_CONTROLLER, {"router_bind_address": _HOST, "router_port": _PORT})]
