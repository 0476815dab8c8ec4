"""The router a rig was last deployed behind, recorded on the rig, so a deploy through an inventory that declares no
router still knows it.

deploy.py writes ROUTER_RECORD_PATH on each rig of an inventory with a gateway (group routers): the gateways and every
rig they route to. `rigkit lab up --router` writes the same for the lab's router and `lab down` removes it. Before a
run restarts its rigs all at once, `rigkit deploy` reads the record of each targeted rig: when the run would take every
rig of a recorded router down together (with the lab's router serving, `rigkit deploy inventory/lab.py` once failed
276 of 322 requests with no warning), it is refused unless told --all-at-once. A record names the router's rigs as the
inventory named them; an inventory that names them otherwise is not matched.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from rigkit.errors import ConfigError
from rigkit.fleet.inventory import rigs_among
from rigkit.paths import RIG_STATE_DIR
from rigkit.remote.tunnel import connect_ssh
from rigkit.router import is_gateway

ROUTER_RECORD_PATH = f"{RIG_STATE_DIR}/router.json"
ALL_AT_ONCE_OPTION = "--all-at-once"
READ_TIMEOUT_S = 20
READERS = 16  # rigs whose record is read at once


@dataclass(frozen=True)
class RouterRecord:
    """What a rig knows of the router it was last deployed behind."""

    gateways: tuple[str, ...]
    rigs: tuple[str, ...]  # every rig the router routes to, this one included

    def text(self) -> str:
        return json.dumps({"gateways": list(self.gateways), "rigs": list(self.rigs)}, indent=1) + "\n"

    @classmethod
    def parse(cls, text: str) -> Optional["RouterRecord"]:
        """None for no record (a rig never deployed behind a router) or one that cannot be read."""
        try:
            data = json.loads(text)
            return cls(tuple(str(g) for g in data["gateways"]), tuple(str(r) for r in data["rigs"]))
        except (ValueError, KeyError, TypeError):
            return None


def inventory_record(groups: Mapping[str, Sequence[str]]) -> Optional[RouterRecord]:
    """What deploy.py records on each rig of an inventory (host name -> its groups): its gateways and every rig they
    route to; None when it has no gateway (a deploy through it leaves a rig's record as it was)."""
    gateways = [name for name, host_groups in groups.items() if is_gateway(host_groups)]
    if not gateways:
        return None
    hosts = {name: {"groups": list(host_groups)} for name, host_groups in groups.items()}
    return RouterRecord(tuple(gateways), tuple(rigs_among(hosts, list(hosts))))


def read_record(name: str, data: Mapping) -> Optional[RouterRecord]:
    """The rig's record; None when it has none or cannot be reached (the deploy itself then says why)."""
    try:
        client = connect_ssh(data, name)
    except Exception:  # an unreachable rig is the deploy's to report, not this check's
        return None
    try:
        _, stdout, _ = client.exec_command(f"cat {ROUTER_RECORD_PATH} 2>/dev/null", timeout=READ_TIMEOUT_S)
        return RouterRecord.parse(stdout.read().decode())
    except Exception:
        return None
    finally:
        client.close()


def read_records(hosts: Mapping[str, Mapping], names: Sequence[str]) -> dict[str, RouterRecord]:
    """rig -> its record, for the targeted rigs that have one (read in parallel)."""
    with ThreadPoolExecutor(max_workers=READERS) as pool:
        found = dict(zip(names, pool.map(lambda name: read_record(name, hosts[name]["data"]), names)))
    return {name: record for name, record in found.items() if record is not None}


def whole_routers(records: Mapping[str, RouterRecord], targeted: Sequence[str]) -> list[RouterRecord]:
    """The recorded routers every one of whose rigs this run targets: all would restart at once."""
    routers = list(dict.fromkeys(records.values()))
    return [router for router in routers if router.rigs and set(router.rigs) <= set(targeted)]


def refuse_taking_a_whole_router_down(records: Mapping[str, RouterRecord], targeted: Sequence[str]) -> None:
    """ConfigError when a run restarting ``targeted`` all at once would take every rig of a recorded router down."""
    for router in whole_routers(records, targeted):
        raise ConfigError(
            ALL_AT_ONCE_OPTION,
            False,
            f"{', '.join(router.rigs)} were last deployed behind the router on {', '.join(router.gateways)}, and "
            "this run restarts all of them at once: every request through that router fails until one serves again",
            "deploy through the inventory that declares the router (one rig at a time, each drained), --limit "
            f"fewer rigs, or pass {ALL_AT_ONCE_OPTION} to restart them together anyway",
        )
