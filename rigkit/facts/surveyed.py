"""The facts a rig's operations read, in one SSH round trip per stage, for as long as the rig is as read.

pyinfra 3 reads a fact anew at every ``host.get_fact`` (pyinfra/api/facts.py ``_get_fact``: no cache), one
round trip each; a no-op deploy's operations read some thirty, one after another. ``OperationFacts`` answers
the operations' ``host.get_fact`` calls (made inside an operation: ``host.in_op``; the deploy code's own reads,
the survey among them, stay pyinfra's) for the facts a rig's roles declare (each role's ``operation_reads``):
- the first such read of a stage (while the deploy is prepared, for --dry; while it executes) reads every
  declared fact in one FactBatch, so the operations see the rig as it is when they run, not as the survey
  at prepare saw it: a file changed on the rig after the survey is found changed and put right;
- the first command the rig runs that is not a fact read (a command of an operation, an upload, a Python
  step's command) ends the picture: every later read is pyinfra's own, live, as without this class. An
  operation that changes the rig therefore never decides from what the rig held before it;
- a fact nobody declared, or read with pyinfra's global arguments (``_sudo``...), is read live.
A rig changed by someone else while its operations execute, between this read and the operation that
reads it, is not seen: the same window pyinfra leaves between a fact read and the command it decides.
"""

from __future__ import annotations

from inspect import getcallargs
from typing import Any, Callable, Hashable, Iterable, Optional

from pyinfra.api.host import Host
from pyinfra.facts.files import Directory, File, Sha1File
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from rigkit.facts.batch import FactBatch, FactSpec

PREPARE, EXECUTE = "prepare", "execute"


def _frozen(value: Any) -> Hashable:
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((key, _frozen(item)) for key, item in value.items()))
    return value


def fact_key(fact: type, kwargs: dict) -> tuple:
    """One key for a fact and its arguments however they were passed (a list or a tuple of services)."""
    return fact, tuple(sorted((name, _frozen(value)) for name, value in kwargs.items()))


def spec_key(spec: FactSpec) -> tuple:
    return fact_key(spec.fact, dict(spec.kwargs))


class OperationFacts:
    """Answers ``host.get_fact`` for the declared facts from one batch read per stage (see the module)."""

    def __init__(self, host: Host, specs: Iterable[FactSpec]):
        self.host = host
        self.specs = {spec_key(spec): spec for spec in specs}
        self.values: dict[tuple, Any] = {}
        self.read_in: Optional[str] = None  # the stage of the batch read, None: none yet
        self.rig_changed = False  # a command ran since that read: every read is live
        self.batches = 0
        self._live_get_fact: Callable = host.get_fact
        self._live_run: Callable = host.run_shell_command
        self._live_put: Callable = host.put_file
        self._reading = False

    def install(self) -> "OperationFacts":
        """Put this picture between the host's operations and the rig (one per host and run)."""
        self.host.get_fact = self.get_fact  # type: ignore[method-assign]
        self.host.run_shell_command = self.run_shell_command  # type: ignore[method-assign]
        self.host.put_file = self.put_file  # type: ignore[method-assign]
        return self

    def _stage(self) -> str:
        return EXECUTE if self.host.state.is_executing else PREPARE

    def _live(self, fact: type, *args, **kwargs) -> Any:
        self._reading = True
        try:
            return self._live_get_fact(fact, *args, **kwargs)
        finally:
            self._reading = False

    def _read_all(self) -> None:
        specs = tuple(self.specs.values())
        values = dict(self._live(FactBatch, facts=specs) or {})  # called for a declared fact: specs has one
        self.batches += 1
        # a fact the batch could not read (its command failed) is read alone when asked, as pyinfra would
        self.values = {spec_key(spec): value for spec, value in values.items()}
        self.read_in, self.rig_changed = self._stage(), False

    def _key(self, fact: type, args: tuple, kwargs: dict) -> Optional[tuple]:
        if any(name.startswith("_") for name in kwargs):
            return None  # pyinfra's global arguments (sudo, another user): the fact as pyinfra reads it
        try:
            named = getcallargs(fact().command, *args, **kwargs) if (args or kwargs) else {}
        except TypeError:
            return None
        named.pop("self", None)
        return fact_key(fact, named)

    def get_fact(self, fact: type, *args, **kwargs) -> Any:
        if (
            fact is FactBatch and self.host.in_op
        ):  # facts_now: the declared ones from the picture, the rest in one batch
            wanted = kwargs["facts"]
            served = {
                spec: self.get_fact(spec.fact, **dict(spec.kwargs)) for spec in wanted if spec_key(spec) in self.specs
            }
            rest = tuple(spec for spec in wanted if spec not in served)
            if len(rest) > 1:
                served.update(self._live(FactBatch, facts=rest) or {})
            return served
        key = self._key(fact, args, kwargs)
        # the deploy code's own reads (the survey, a role's plan) are its own: only operations read the picture
        if key is None or key not in self.specs or not self.host.in_op:
            return self._live(fact, *args, **kwargs)
        stage = self._stage()
        if self.read_in != stage:
            self._read_all()
        if self.rig_changed or key not in self.values:
            return self._live(fact, *args, **kwargs)
        return self.values[key]

    def _changing(self) -> None:
        if not self._reading:
            self.rig_changed = True

    def run_shell_command(self, *args, **kwargs):
        self._changing()
        return self._live_run(*args, **kwargs)

    def put_file(self, *args, **kwargs):
        self._changing()
        return self._live_put(*args, **kwargs)


def serve_operation_facts(host: Host, specs: Iterable[FactSpec]) -> OperationFacts:
    """The host's operations read ``specs`` from one round trip per stage (installed once per host)."""
    existing = getattr(host, "_rigkit_operation_facts", None)
    if existing is not None:
        return existing
    facts = OperationFacts(host, specs).install()
    host._rigkit_operation_facts = facts  # type: ignore[attr-defined]
    return facts


# What pyinfra 3.10's own operations read on a host that is already right (pyinfra/operations/files.py ``put``:
# File, then Sha1File by _file_equal; ``directory``: Directory; pyinfra/operations/systemd.py ``service``:
# SystemdStatus, then SystemdEnabled when ``enabled`` is given, each with these arguments).
def put_reads(path: str) -> list[FactSpec]:
    """files.put of ``path`` (and rigkit.operations.files.secret_file, which runs it)."""
    return [FactSpec.of(File, path=path), FactSpec.of(Sha1File, path=path)]


def directory_reads(path: str) -> list[FactSpec]:
    """files.directory of ``path``."""
    return [FactSpec.of(Directory, path=path)]


def service_reads(unit: str, enabled: bool = True) -> list[FactSpec]:
    """systemd.service of ``unit`` (a system unit), with ``enabled`` given or not."""
    where = {"machine": None, "user_mode": False, "user_name": None, "services": (unit,)}
    return [FactSpec.of(SystemdStatus, **where)] + ([FactSpec.of(SystemdEnabled, **where)] if enabled else [])
