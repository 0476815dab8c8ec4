"""Several facts in one SSH round trip (FactSpec, FactBatch)."""

from __future__ import annotations

import secrets
import shlex
from dataclasses import dataclass
from typing import Any, Iterable

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import FactProcessError
from pyinfra.api.host import Host


@dataclass(frozen=True)
class FactSpec:
    """One fact and its arguments, as ``host.get_fact(fact, **kwargs)`` would read it."""

    fact: type
    kwargs: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, fact: type, **kwargs: Any) -> "FactSpec":
        return cls(fact, tuple(sorted(kwargs.items())))

    def __str__(self) -> str:
        arguments = ", ".join(f"{key}={value}" for key, value in self.kwargs)
        return f"{self.fact.__name__}({arguments})"


BATCH_MARKER = "__rigkit_fact_done__"


def _shell_text(command: Any) -> str:
    return command.get_raw_value() if isinstance(command, StringCommand) else str(command)


class FactBatch(FactBase):
    """Several facts read in one SSH round trip: {FactSpec: value}, each value what ``host.get_fact`` returns.

    The facts' commands run side by side on the host, each in its own subshell with its output in a temporary
    directory; then each output gets a marker line carrying its exit status ("missing" when the command the fact
    requires is absent: its default, as pyinfra gives) and one ``cat`` prints them in order. Only the subshells
    and the facts' own commands are processes (the status, the marker and the order are the shell's builtins):
    a rig's CPU is shared by every fact it reads. A fact whose command fails, or whose output its process()
    refuses, is left out: facts_now then reads it alone, so pyinfra reports and fails the host exactly as it
    would have. No temporary directory: no output at all, and facts_now reads every fact alone.
    """

    def command(self, facts: tuple[FactSpec, ...]) -> str:
        # one instance per fact for command() and process(), as pyinfra uses (FileContents keeps state on it)
        self._facts = [(spec, spec.fact()) for spec in facts]
        # a marker the facts' own output cannot contain by accident
        self._marker = f"{BATCH_MARKER}{secrets.token_hex(6)}"
        lines = ["d=$(mktemp -d 2>/dev/null) || exit 0", "trap 'rm -rf \"$d\"' EXIT"]
        for index, (spec, fact) in enumerate(self._facts):
            kwargs = dict(spec.kwargs)
            if fact.shell_executable:
                raise ValueError(f"{spec}: a fact with its own shell cannot join a batch")
            # the subshell keeps a fact's own `exit` from ending the batch; $! lets `wait` give its status
            run = f'( {_shell_text(fact.command(**kwargs))}\n) >"$d/{index}" 2>/dev/null & p{index}=$!'
            needs = fact.requires_command(**kwargs)
            if needs:
                run = f"p{index}=; if command -v {shlex.quote(needs)} >/dev/null 2>&1; then {run}; fi"
            lines.append(run)
        # the newline ends an output whose last line has none; process() removes it again
        for index in range(len(self._facts)):
            lines.append(
                f'if [ -n "$p{index}" ]; then wait "$p{index}"; s=$?; else s=missing; fi; '
                f'printf \'\\n{self._marker} %s\\n\' "$s" >>"$d/{index}"'
            )
        if self._facts:
            lines.append("cat " + " ".join(f'"$d/{index}"' for index in range(len(self._facts))))
        return "\n".join(lines)

    def process(self, output: list[str]) -> dict[FactSpec, Any]:
        results: dict[FactSpec, Any] = {}
        lines: list[str] = []
        done = 0
        for line in output:
            if not line.startswith(self._marker + " "):
                lines.append(line)
                continue
            spec, fact = self._facts[done]
            done += 1
            if lines and lines[-1] == "":
                lines.pop()  # the newline printed before the marker
            status = line[len(self._marker) + 1 :]
            if status == "missing" or (status == "0" and not lines):
                results[spec] = fact.default()
            elif status == "0":
                try:
                    results[spec] = fact.process(lines)
                except FactProcessError:
                    pass
            lines = []
        return results


def facts_now(host: Host, specs: Iterable[FactSpec]) -> dict[FactSpec, Any]:
    """Each fact as ``host.get_fact`` reads it now (never from memory), several in one round trip."""
    specs = tuple(dict.fromkeys(specs))
    values = dict(host.get_fact(FactBatch, facts=specs) or {}) if len(specs) > 1 else {}
    return each_missing_alone(host, specs, values)


def each_missing_alone(host: Host, specs: Iterable[FactSpec], values: dict[FactSpec, Any]) -> dict[FactSpec, Any]:
    """``values`` (a batch's) with every fact it lacks read on its own, so pyinfra reports and fails the host
    exactly as it would have (a batch that failed as a whole: every fact alone)."""
    values = dict(values)
    for spec in specs:
        if spec not in values:
            values[spec] = host.get_fact(spec.fact, **dict(spec.kwargs))
    return values
