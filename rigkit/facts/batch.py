"""Several facts in one SSH round trip (FactSpec, FactBatch)."""

from __future__ import annotations

import secrets
import shlex
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import FactProcessError
from pyinfra.api.host import Host

from rigkit.facts.joined import Join, join_for


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
    a rig's CPU is shared by every fact it reads. Facts of one kind (paths' stat, files' SHA1, units' state,
    ports' listeners) share one subshell and one process (rigkit.facts.joined). A fact whose command fails, whose
    output its process() refuses, or that its join cannot answer for, is left out: facts_now then reads it alone,
    so pyinfra reports and fails the host exactly as it would have. No temporary directory: no output at all, and
    facts_now reads every fact alone.
    """

    def command(self, facts: tuple[FactSpec, ...]) -> str:
        # one instance per fact for command() and process(), as pyinfra uses (FileContents keeps state on it)
        self._facts = [(spec, spec.fact()) for spec in facts]
        # a marker the facts' own output cannot contain by accident
        self._marker = f"{BATCH_MARKER}{secrets.token_hex(6)}"
        # each entry: (its join or None, the indexes of the facts it reads); a join of one fact is the fact alone
        joined: dict[Join, list[int]] = {}
        self._entries: list[tuple[Optional[Join], list[int]]] = []
        texts = []
        for index, (spec, fact) in enumerate(self._facts):
            kwargs = dict(spec.kwargs)
            if fact.shell_executable:
                raise ValueError(f"{spec}: a fact with its own shell cannot join a batch")
            texts.append(_shell_text(fact.command(**kwargs)))  # also for a joined fact: command() keeps its state
            join = join_for(fact, kwargs)
            if join is not None and join in joined:
                joined[join].append(index)
                continue
            if join is not None:
                joined[join] = [index]
            self._entries.append((join, joined[join] if join is not None else [index]))
        self._entries = [(join if len(indexes) > 1 else None, indexes) for join, indexes in self._entries]
        lines = ["d=$(mktemp -d 2>/dev/null) || exit 0", "trap 'rm -rf \"$d\"' EXIT"]
        for entry, (join, indexes) in enumerate(self._entries):
            if join is None:
                spec, fact = self._facts[indexes[0]]
                text, needs = texts[indexes[0]], fact.requires_command(**dict(spec.kwargs))
            else:
                text = join.command(self._reads(join, indexes), self._marker)
                needs = join.requires_command
            # the subshell keeps a fact's own `exit` from ending the batch; $! lets `wait` give its status
            run = f'( {text}\n) >"$d/{entry}" 2>/dev/null & p{entry}=$!'
            if needs:
                run = f"p{entry}=; if command -v {shlex.quote(needs)} >/dev/null 2>&1; then {run}; fi"
            lines.append(run)
        # the newline ends an output whose last line has none; process() removes it again
        for entry in range(len(self._entries)):
            lines.append(
                f'if [ -n "$p{entry}" ]; then wait "$p{entry}"; s=$?; else s=missing; fi; '
                f'printf \'\\n{self._marker} %s\\n\' "$s" >>"$d/{entry}"'
            )
        if self._entries:
            lines.append("cat " + " ".join(f'"$d/{entry}"' for entry in range(len(self._entries))))
        return "\n".join(lines)

    def process(self, output: list[str]) -> dict[FactSpec, Any]:
        results: dict[FactSpec, Any] = {}
        lines: list[str] = []
        done = 0
        for line in output:
            if not line.startswith(self._marker + " "):
                lines.append(line)
                continue
            join, indexes = self._entries[done]
            done += 1
            if lines and lines[-1] == "":
                lines.pop()  # the newline printed before the marker
            status = line[len(self._marker) + 1 :]
            if join is None:
                self._process_one(indexes[0], status, lines, results)
            elif status == "missing":
                for index in indexes:
                    self._process_one(index, status, [], results)
            elif status == "0":
                split = join.split(self._reads(join, indexes), lines, self._marker)
                for position, own_lines in split.items():
                    self._process_one(indexes[position], status, own_lines, results)
            lines = []
        return results

    def _reads(self, join: Join, indexes: list[int]) -> list[dict]:
        return [join.read(self._facts[i][1], dict(self._facts[i][0].kwargs)) for i in indexes]

    def _process_one(self, index: int, status: str, lines: list[str], results: dict[FactSpec, Any]) -> None:
        spec, fact = self._facts[index]
        if status == "missing" or (status == "0" and not lines):
            results[spec] = fact.default()
        elif status == "0":
            try:
                results[spec] = fact.process(lines)
            except FactProcessError:
                pass


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
