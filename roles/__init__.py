"""rigkit's pyinfra roles, in deploy order, and the pipeline that runs them.

Each role module ``roles/<name>.py`` has a ``@deploy`` function of the same name taking the rig's
RigSettings (rigkit.settings.hostdata.rig_settings, built once per host by the entry point) and the run's Run.
Its variables are declared in rigkit.settings.defaults (section ``<name>``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional, Sequence

from pyinfra import host

from rigkit.facts.batch import FactSpec
from rigkit.facts.surveyed import serve_operation_facts
from rigkit.settings.hostdata import RigSettings
from rigkit.survey import RigState, read_rig_state

# rig_lock first: one deploy at a time per rig, facts read under the lock. preflight next: what the bare
# host refuses fails the rig before any role changes it. api_firewall before serving: a release that binds
# beyond loopback never listens before its firewall is loaded; node_exporter after it for the same reason.
# kv_share before serving: the shared store must be mounted before the stack's container binds it.
PIPELINE = (
    "rig_lock",
    "preflight",
    "nvidia_driver",
    "docker",
    "nvidia_container_toolkit",
    "l2_disk",
    "api_firewall",
    "node_exporter",
    "kv_share",
    "serving",
)


@dataclass
class Run:
    """What the roles of one host's run tell the roles after them."""

    # The docker role added its operations in this run: they install and start the engine before the
    # serving role's operations run, so an engine missing while the deploy is prepared is checked then.
    engine_provisioned: bool = False
    # The role that refused this rig (its failing operation says why): no later role runs.
    refused_by: Optional[str] = None
    survey: Optional[RigState] = None
    # rig_lock reads the survey in the lock's own channel, right after the lock is held (deploy_rig asks it)
    survey_with_lock: bool = False
    # The inventory's monitoring hosts' addresses (rigkit.monitoring.prometheus.scraper_addresses): the API
    # firewall lets them reach the stack's ports and the node exporter.
    scrapers: tuple[str, ...] = ()

    def rig_state(self, settings: RigSettings) -> RigState:
        """The rig survey: read once per run, in one round trip, before any operation ran."""
        if self.survey is None:
            self.survey = read_rig_state(host, settings)
        return self.survey


def operation_reads(settings: RigSettings, names: Sequence[str] = PIPELINE) -> list[FactSpec]:
    """Every fact the roles' operations read on a rig that is already right (each role's ``operation_reads``)."""
    reads: list[FactSpec] = []
    for name in names:
        module = importlib.import_module(f"roles.{name}")
        if hasattr(module, "operation_reads"):
            reads += module.operation_reads(settings)
    return list(dict.fromkeys(reads))


def deploy_rig(settings: RigSettings, names: Sequence[str] = PIPELINE, run: Optional[Run] = None) -> Run:
    """The roles ``names`` in order on this host, stopping after one that refused it. The rig survey is
    read right after the lock is held, so every plan is made from the state the previous deploy left; the
    operations read the facts they need in one round trip when they run (rigkit.facts.surveyed)."""
    run = Run() if run is None else run
    run.survey_with_lock = True
    serve_operation_facts(host, operation_reads(settings, names))
    for name in names:
        role = getattr(importlib.import_module(f"roles.{name}"), name)
        role(settings, run)
        if run.refused_by:
            break
        if name == "rig_lock":
            run.rig_state(settings)
    return run
