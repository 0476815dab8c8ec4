"""router: checks of the router on the gateway (roles/router.py installs and starts it)."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from rigkit.facts.router import RouterWorkers
from rigkit.operations import fail
from rigkit.router import Worker, worker_mismatch


@operation()
def router_verified(url: str, workers: list[Worker], timeout_s: int):
    """
    Check: the router answers /health within ``timeout_s`` and its /list_workers is exactly ``workers``.

    + url: the router's base URL as the gateway reaches it
    + workers: the declared workers (rigkit.router.workers)
    + timeout_s: how long to wait for /health (the router waits for its workers first)
    """
    yield from ()  # a check: it never yields a command
    workers = [Worker.of(worker) for worker in workers]
    if not host.state.is_executing:
        host.noop("the router is checked while the deploy runs")
        return
    found = host.get_fact(RouterWorkers, url=url, timeout_s=timeout_s)
    if not found["ready"]:
        raise fail(
            "router",
            url,
            f"/health did not answer within {timeout_s} s ({found['error']})",
            "see `journalctl -u rigkit-router` on the gateway: a worker that never became healthy is named there",
        )
    if found["urls"] is None:
        raise fail("router", url, f"no worker list: {found['error']}", "see `journalctl -u rigkit-router`")
    mismatch = worker_mismatch(workers, found["urls"])
    if mismatch:
        raise fail(
            "router",
            url,
            f"its workers differ from the rigs of the inventory: {mismatch}",
            "re-run the deploy over the whole inventory (someone changed the router's workers by hand, "
            "or /remove_worker took a rig out)",
        )
    host.noop(f"the router answers and routes to {len(workers)} rig(s): " + ", ".join(worker.rig for worker in workers))


@operation()
def rigs_before_router():
    """
    An ordering point, no commands: every host of a run with a gateway adds it from the same line of deploy.py,
    after its rig roles on a rig and before the router role on a gateway. pyinfra orders operations by a
    topological sort of each host's sequence (pyinfra/api/state.py, get_op_order), so two independent sequences
    interleave; one shared operation makes every router operation wait for every rig's release and smoke.
    """
    yield from ()
    host.noop("the rigs' roles are done before the router's")
