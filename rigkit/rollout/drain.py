"""The rollout through the router: each rig leaves the router before its deploy and comes back after it.

When the inventory declares a router (hosts of group ROUTER_GROUP, rigkit.rollout.router_admin), `rigkit deploy
--canary/--batch` (rigkit.rollout.run) does, per rig of a stage: remove it from every router routing to it, wait
until it finished the requests it had (its vllm:num_requests_running/_waiting read 0), deploy (the serving role
smokes it), for a canary prove its cache (the proof's counters then see no routed traffic), and add it back only
when all of that passed. A rig whose deploy, smoke, proof or drain failed stays out of the router, said in the
summary; the rollout's record keeps it (RolloutRecord.out_of_router), so the re-run that gets it verified puts it
back (a rolling rollback's re-run too). The rollback (--on-failure rollback) goes rig by rig, drained and restored
the same way.

Refused before any rig is touched: a stage that would take every rig a router routes to out at once (no rig left
to serve). A drain that would take out a router's last rig is refused when it comes (the others failed and are
out): that rig keeps serving its release, and the summary says why.

`rigkit deploy` (deploy.py or rollback.py) on an inventory with a router goes one rig at a time through it when no
batch is asked (routed_default: --batch 1, said first); only --all-at-once (or --batch 0 on the command line) runs
every targeted rig at once. Plain pyinfra runs (deploy.py, rollback.py, with or without --limit) and `rigkit deploy
--all-at-once` do not touch the router: they restart the rigs they run on while the router may still send them
requests (it notices a dead worker only at its next health check); `rigkit deploy` says so first (plain_run_note).
A rolling rollback (rigkit.rollout.rollback) uses the same drain, a rig back in the router only once its rollback is
verified. A rollout deploys rigs only: the router's own host is deployed by a run limited to it (`--limit
<gateway>`), and a first deploy, which installs the router, takes --all-at-once (the router does not answer yet).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Any, Callable, ContextManager, Iterator, Mapping, Optional, Sequence

from rigkit.errors import ConfigError, RigkitError
from rigkit.fleet.inventory import rigs_among
from rigkit.metrics import requests_in_flight
from rigkit.remote.http_session import server_session
from rigkit.remote.tunnel import serving_url
from rigkit.rollout.router_admin import (
    LOCAL_HOST,
    RouterAdmin,
    add_worker_command,
    gateway_router_url,
    gateways,
    rig_worker_url,
    router_url,
    wait_idle,
)
from rigkit.rollout.router_record import ALL_AT_ONCE_OPTION
from rigkit.router import CONTROLLER_HOST
from rigkit.settings.defaults import ROUTER_VARIABLES
from rigkit.settings.hostdata import rig_settings
from rigkit.settings.variables import resolve

NO_RIG_LEFT = "no rig left to serve"
# the steps a summary names when the router is why a rig halted the rollout
DRAIN_STEP = "drain from the router"
RESTORE_STEP = "back into the router"
# how a rig a rollout left out of the router gets back in (RouterDrain.keep_out), before the by-hand command
RERUN_PUTS_BACK = "the re-run that gets it verified puts it back, or by hand"


# A plain `rigkit deploy` (deploy.py or rollback.py) on an inventory with a router: one rig at a time, drained
# first, unless the operator says otherwise in so many words (ALL_AT_ONCE_OPTION, or --batch 0 on the command line).
ROUTER_DEFAULT_BATCH = 1


def routed_default(hosts: Mapping[str, Mapping], targeted: Sequence[str], explicit: bool) -> Optional[str]:
    """Why this run goes one rig at a time through the router when nobody asked for a batch or for every rig at once
    (None: no router, no targeted rig, or the operator chose): said before any rig is touched."""
    routers = gateways(hosts)
    if explicit or not routers or not targeted:
        return None
    return (
        f"the inventory has a router (on {', '.join(routers)}): {', '.join(targeted)} go one at a time, each "
        f"out of the router until its smoke passed (--batch {ROUTER_DEFAULT_BATCH}); {ALL_AT_ONCE_OPTION} (or "
        "--batch 0) restarts them all at once while the router still sends them requests"
    )


def gateways_left_note(hosts: Mapping[str, Mapping], targeted_hosts: Sequence[str], inventory: str) -> Optional[str]:
    """A rolling run deploys rigs only: the targeted router hosts it leaves as they are, and the run that deploys
    them (None when it targets none). The controller (@local) counts only where its data lets the role run there
    (router_on_controller): a router someone runs there by hand is no host to deploy."""
    left = [
        gateway
        for gateway in gateways(hosts)
        if gateway in targeted_hosts
        and (
            gateway != CONTROLLER_HOST
            or resolve(ROUTER_VARIABLES, dict(hosts[gateway].get("data", {})))["router_on_controller"]
        )
    ]
    if not left:
        return None
    limits = " ".join(f"--limit {gateway}" for gateway in left)
    return (
        f"the router's host {', '.join(left)} is not deployed by a rolling run (rigs only): `rigkit deploy "
        f"{inventory} {limits}` deploys it (its router restarts only when its unit or install changed)"
    )


def unreachable_router_fix(exc: ConfigError) -> ConfigError:
    """The router a defaulted rolling run drains through does not answer (a first deploy, which installs it): the
    refusal says how to run every rig and the router in one run."""
    return ConfigError(
        exc.field,
        exc.value,
        exc.problem,
        f"{exc.fix}; a first deploy, which installs the router, runs every rig at once: pass "
        f"{ALL_AT_ONCE_OPTION} (nothing is served through the router yet)",
    )


def plain_run_note(hosts: Mapping[str, Mapping], targeted: Sequence[str]) -> Optional[str]:
    """What a run without --batch on ``targeted`` does not do when the inventory has a router and rigs among them:
    drain them (None otherwise). Said before the run; a first deploy that installs the router is not stopped."""
    routers, rigs = gateways(hosts), rigs_among(hosts, targeted)
    if not routers or not rigs:
        return None
    return (
        f"the router on {', '.join(routers)} is not drained by a run with {ALL_AT_ONCE_OPTION}: a rig it "
        f"restarts ({', '.join(rigs)}) still gets requests until the router's next health check, and those fail; "
        "without it each rig leaves the router first and comes back after its smoke"
    )


def refuse_full_drain(stages: Sequence[Any], worker_of: Mapping[str, str], routed: Mapping[str, Sequence[str]]) -> None:
    """ConfigError when a stage (rigkit.rollout.plan.Stage) would drain every worker a router routes to at once."""
    for gateway, workers in routed.items():
        for stage in stages:
            out = [rig for rig in stage.rigs if worker_of[rig] in workers]
            if out and len(out) >= len(workers):
                knob = "rollout_canary" if stage.canary else "rollout_batch"
                raise ConfigError(
                    knob,
                    len(stage.rigs),
                    f"{stage.label} ({', '.join(stage.rigs)}) would take all {len(workers)} rigs the "
                    f"router on {gateway} routes to out of it at once: {NO_RIG_LEFT}",
                    f"pass {'--canary' if stage.canary else '--batch'} below {len(workers)} "
                    "(--batch 1 keeps the most rigs serving), or put more rigs behind the router",
                )


class RouterDrain:
    """The routers of one rollout: which rigs they route to, drains and restores, and the words for the summary.
    Without a router every call is a no-op (``active`` is False)."""

    def __init__(
        self,
        admins: Mapping[str, RouterAdmin],
        worker_of: Mapping[str, str],
        in_flight: Callable[[str], ContextManager[Callable[[], float]]],
        out_of_router: Optional[Mapping[str, Sequence[str]]] = None,
    ):
        self.admins = dict(admins)
        self.worker_of = dict(worker_of)
        self.in_flight = in_flight
        self.routed = {gateway: admin.list_workers() for gateway, admin in self.admins.items()}
        # rig -> the routers it was taken out of (by this rollout or the killed/halted run before it)
        self.out = {rig: list(gws) for rig, gws in (out_of_router or {}).items() if gws}
        self.lines: list[str] = []
        # the by-hand commands that put a rig left out back into its router (keep_out), one a line
        self.add_back: list[str] = []

    @property
    def active(self) -> bool:
        return bool(self.admins)

    def describe(self, run: str = "deploy") -> str:
        return "; ".join(
            f"router on {gateway}: {len(workers)} rigs routed, each drained before its {run} and back after its smoke"
            for gateway, workers in self.routed.items()
        )

    def refuse_full_drain(self, stages: Sequence[Any]) -> None:
        refuse_full_drain(stages, self.worker_of, self.routed)

    def drain(self, rig: str) -> Optional[str]:
        """Take ``rig`` out of every router routing to it and wait until it is idle; why not, or None."""
        if not self.active:
            return None
        worker = self.worker_of[rig]
        routing = [gateway for gateway, workers in self.routed.items() if worker in workers]
        if not routing:
            if rig not in self.out:
                self.lines.append(f"{rig}: not routed to by the router ({worker}): deployed without a drain")
            return None
        last = [gateway for gateway in routing if len(self.routed[gateway]) == 1]
        if last:
            return (
                f"it is the only rig the router on {last[0]} still routes to (the others are out of it): "
                f"draining it would leave {NO_RIG_LEFT}; it keeps serving its release"
            )
        print(f"--> rigkit rollout: {rig} out of the router ({worker}), waiting for its requests to finish", flush=True)
        removed: list[str] = []
        try:
            for gateway in routing:
                self.admins[gateway].remove(worker)
                removed.append(gateway)
                self.routed[gateway].remove(worker)
            with self.in_flight(rig) as reading:
                wait_idle(reading, worker)
        except RigkitError as exc:
            self.out[rig] = removed
            return f"{exc}" + ("" if self.restore(rig, quiet=True) is None else "; it stays out of the router")
        self.out[rig] = routing
        return None

    def drain_each(self, rigs: Sequence[str]) -> dict[str, str]:
        """Drain each of ``rigs`` in turn; why, by rig, for each that could not be (it is not to be run on)."""
        return {rig: why for rig in rigs if (why := self.drain(rig))}

    def settle(self, rigs: Sequence[str], failed: Mapping[str, str]) -> dict[str, str]:
        """After a stage's run: each rig of ``failed`` (rig -> the step it failed at) stays out of the router, every
        other of ``rigs`` goes back in; why, by rig, for each the router did not take back (it stays out too)."""
        not_back = {}
        for rig in rigs:
            if rig in failed:
                self.keep_out(rig, f"it failed at {failed[rig]}")
            elif why := self.restore(rig):
                not_back[rig] = why
                self.keep_out(rig, f"the router did not take it back: {why}")
        return not_back

    def restore(self, rig: str, quiet: bool = False) -> Optional[str]:
        """Put ``rig`` back into the routers it was taken out of; why not, or None."""
        if rig not in self.out:
            return None
        worker = self.worker_of[rig]
        for gateway in list(self.out.get(rig, ())):
            if gateway not in self.admins:  # a router this inventory no longer declares
                self.out[rig].remove(gateway)
                continue
            try:
                self.admins[gateway].add(worker)
            except RigkitError as exc:
                return str(exc)
            self.routed[gateway].append(worker)
            self.out[rig].remove(gateway)
        if rig in self.out:
            del self.out[rig]
            if not quiet:
                self.lines.append(f"{rig}: back in the router ({worker})")
        return None

    def keep_out(self, rig: str, why: str) -> None:
        """Say that ``rig`` stays out of the routers it was taken out of, why, and how it returns; the exact command
        that adds it back on each gateway goes to ``add_back`` (printed whole, one a line)."""
        if rig in self.out:
            self.lines.append(f"{rig}: left out of the router ({why}); {RERUN_PUTS_BACK}: the command below")
            self.add_back += self.add_back_commands(rig)

    def add_back_commands(self, rig: str) -> list[str]:
        """The command that puts ``rig`` back into each router it is out of, with where to run it as a comment."""
        worker = self.worker_of[rig]
        return [
            f"{add_worker_command(self.admins[gateway].gateway_url, worker)}  # on "
            f"{'this controller' if gateway == LOCAL_HOST else gateway}"
            for gateway in self.out.get(rig, ())
            if gateway in self.admins
        ]


@contextmanager
def rig_in_flight(rig: str, data: Mapping[str, Any]) -> Iterator[Callable[[], float]]:
    """A reading of the rig's requests in flight from its /metrics, through the SSH tunnel to its API."""

    knobs = rig_settings(dict(data)).stack.knobs
    with serving_url(data, knobs["bind_address"], knobs["serving_port"], inventory_name=rig) as url:
        with server_session() as session:
            yield lambda: requests_in_flight(session.get(f"{url}/metrics", timeout=5).text)


@contextmanager
def router_session(
    hosts: Mapping[str, Mapping], rigs: Sequence[str], out_of_router: Optional[Mapping[str, Sequence[str]]] = None
) -> Iterator[RouterDrain]:
    """The inventory's routers for one rollout, each reached through its gateway's tunnel for the whole rollout;
    a RouterDrain that does nothing when the inventory declares none."""
    with ExitStack() as stack:
        try:
            admins = {
                gateway: RouterAdmin(
                    stack.enter_context(router_url(gateway, hosts[gateway]["data"])),
                    gateway_url=gateway_router_url(hosts[gateway]["data"]),
                )
                for gateway in gateways(hosts)
            }
            worker_of = {rig: rig_worker_url(rig, hosts[rig]["data"]) for rig in rigs} if admins else {}
            drain = RouterDrain(admins, worker_of, lambda rig: rig_in_flight(rig, hosts[rig]["data"]), out_of_router)
        except RigkitError as exc:  # a router the rollout cannot reach or read: refused before any rig is touched
            raise ConfigError(
                exc.field, exc.value, f"{exc.problem} (the rollout drains rigs through it)", exc.fix
            ) from None
        yield drain
