"""Several facts of one kind read by one process in a FactBatch: every path's stat in one `stat`, every file's
SHA1 in one `sha1sum`, every unit's state in one `systemctl show`, every port's listeners in one Python, the
installed and the held packages in one `dpkg-query`.

Each fact read alone is a subshell and a process of its own (~3-9 ms of a rig's CPU, measured on a lab rig); a
rig's no-op reads eight paths, five file hashes and four unit states. A join runs the same tool with the same
arguments as each fact's own command, several at a time, and hands each fact the lines its own command would
have printed, for the fact's own ``process()`` to parse. A fact the join cannot answer for certain (its line is
missing, a line it cannot place) is left out, and the batch's caller reads it alone, as pyinfra would. A fact
whose arguments the join does not take (a ``~/`` path, a newline or backslash in it, several units, user mode)
is read in the batch on its own, as before.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Optional, Sequence

from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import LINUX_STAT_COMMAND, Directory, File, Link, Sha1File
from pyinfra.facts.systemd import SYSTEMD_UNIT_NAME_REGEX, SystemdEnabled, SystemdStatus

from rigkit.facts.apt import HOLDS_FIELDS, AptHeldPackages, dpkg_query
from rigkit.facts.server import PortListeners, listeners_command


class Join:
    """One kind of joinable fact: which reads (a fact's kwargs) it takes, its one command, and each read's own lines
    from that command's output, by the read's index ({index: lines}; an index left out is read alone)."""

    requires_command: Optional[str] = None

    def takes(self, fact: Any, kwargs: dict) -> bool:
        raise NotImplementedError

    def read(self, fact: Any, kwargs: dict) -> dict:
        """What command() and split() are given of one read: its arguments."""
        return kwargs

    def command(self, reads: Sequence[dict], separator: str) -> str:
        raise NotImplementedError

    def split(self, reads: Sequence[dict], lines: list[str], separator: str) -> dict[int, list[str]]:
        raise NotImplementedError


def _plain_path(path: Any, also_refused: str = "") -> bool:
    return (
        isinstance(path, str) and bool(path) and not path.startswith("~") and not set("\n" + also_refused) & set(path)
    )


def _existence_loop(paths: Sequence[str], test: str, directory: str = "1") -> str:
    """One line per path from the shell's own builtins (no process): "0" absent, ``directory`` a directory, else "1"."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    return (
        f'for p in {quoted}; do if ! {{ {test}; }}; then echo 0; elif [ -d "$p" ]; then echo {directory}; '
        "else echo 1; fi; done"
    )


def _unique(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(values))


class PathJoin(Join):
    """A join over paths: the shell's builtins print one flag per path (see _existence_loop), then the tool prints a
    line per path it read; ``lines_by_path`` places those, and a path whose flag is in ``no_output`` gets no
    lines, as its fact's own command prints none."""

    no_output: tuple[str, ...] = ("0",)

    def lines_by_path(self, tool_lines: list[str], separator: str, paths: list[str]) -> Optional[dict[str, list]]:
        raise NotImplementedError

    def split(self, reads, lines, separator):
        paths = _unique([read["path"] for read in reads])
        flags, tool_lines = lines[: len(paths)], lines[len(paths) :]
        if len(flags) != len(paths) or set(flags) - {"0", "1", "d"}:
            return {}
        by_path = self.lines_by_path(tool_lines, separator, paths)
        if by_path is None:
            return {}  # a line this join cannot place: every read alone
        flag_of = dict(zip(paths, flags))
        split = {}
        for index, read in enumerate(reads):
            if flag_of[read["path"]] in self.no_output:
                split[index] = []
            elif read["path"] in by_path:
                split[index] = by_path[read["path"]]
        return split


class StatJoin(PathJoin):
    """pyinfra's File, Directory and Link: one GNU ``stat`` with their format for every path. Each line starts with
    the path as given (``%n``) and the batch's separator, so a path stat could not read has no line, not another's."""

    FACTS = (File, Directory, Link)

    def takes(self, fact, kwargs):
        return type(fact) in self.FACTS and set(kwargs) == {"path"} and _plain_path(kwargs["path"])

    def command(self, reads, separator):
        paths = _unique([read["path"] for read in reads])
        stat_format = LINUX_STAT_COMMAND.split("'")[1]  # stat -c '<format>': the facts' own
        quoted = " ".join(shlex.quote(path) for path in paths)
        return (
            _existence_loop(paths, '[ -e "$p" ] || [ -L "$p" ]')
            + f"\nstat -c {shlex.quote('%n' + separator + stat_format)} -- {quoted} 2>/dev/null; true"
        )

    def lines_by_path(self, tool_lines, separator, paths):
        by_path: dict[str, list[str]] = {}
        for line in tool_lines:
            # the longest path asked for that the line starts with (a path may hold the separator's text itself)
            owners = [path for path in paths if line.startswith(path + separator)]
            if not owners:
                return None
            path = max(owners, key=len)
            if path in by_path:
                return None
            by_path[path] = [line[len(path) + len(separator) :]]
        return by_path


class Sha1Join(PathJoin):
    """pyinfra's Sha1File: one ``sha1sum`` for every file. GNU sha1sum prints "<hash>  <name>" per file it read, in
    the order given; a name with a backslash or a newline would be escaped, so such a path is not joined. A directory
    (each of the fact's tools refuses one) gets no hash, as alone."""

    def takes(self, fact, kwargs):
        return type(fact) is Sha1File and set(kwargs) == {"path"} and _plain_path(kwargs["path"], also_refused="\\")

    def command(self, reads, separator):
        paths = _unique([read["path"] for read in reads])
        files = " ".join(shlex.quote(path) for path in paths)
        return _existence_loop(paths, '[ -e "$p" ]', directory="d") + f"\nsha1sum -- {files} 2>/dev/null; true"

    # `test -e` fails, or every hash tool of the fact refuses a directory: its own command prints nothing
    no_output = ("0", "d")

    def lines_by_path(self, tool_lines, separator, paths):
        return {line[42:]: [line] for line in tool_lines if re.match(r"[0-9a-f]{40} [ *]", line)}


SYSTEMD_LOCAL = {"user_mode": False, "machine": None, "user_name": None}


class SystemdJoin(Join):
    """pyinfra's SystemdStatus and SystemdEnabled of one system unit each: one ``systemctl show`` with both their
    properties for every unit. systemctl prints one block per unit given, in that order, blocks separated by an
    empty line; each read gets its unit's block (a block count that differs: every read alone)."""

    requires_command = "systemctl"

    def takes(self, fact, kwargs):
        if type(fact) not in (SystemdStatus, SystemdEnabled):
            return False
        if any(kwargs.get(key, default) != default for key, default in SYSTEMD_LOCAL.items()):
            return False
        return self._unit(kwargs.get("services")) is not None

    @staticmethod
    def _unit(services: Any) -> Optional[str]:
        if isinstance(services, (list, tuple)) and len(services) == 1:
            services = services[0]
        if isinstance(services, str) and re.fullmatch(SYSTEMD_UNIT_NAME_REGEX, services):
            return services
        return None

    def command(self, reads, separator):
        units = _unique([self._unit(read["services"]) for read in reads])
        properties = " ".join(f"--property {fact.state_key}" for fact in (SystemdStatus, SystemdEnabled))
        return f"systemctl show --all --property Id {properties} {' '.join(shlex.quote(u) for u in units)}"

    def split(self, reads, lines, separator):
        units = _unique([self._unit(read["services"]) for read in reads])
        blocks: list[list[str]] = [[]]
        for line in lines:
            if line.strip():
                blocks[-1].append(line)
            elif blocks[-1]:
                blocks.append([])
        if not blocks[-1]:
            blocks.pop()
        if len(blocks) != len(units):
            return {}
        by_unit = dict(zip(units, blocks))
        return {index: by_unit[self._unit(read["services"])] for index, read in enumerate(reads)}


class ListenersJoin(Join):
    """rigkit's PortListeners: one Python process for every port of the stack (its start is ~12 ms of a rig's CPU;
    an LMCache stack listens on three ports), which prints a JSON line a port, in the order given."""

    def takes(self, fact, kwargs):
        return type(fact) is PortListeners and set(kwargs) == {"port"} and isinstance(kwargs["port"], int)

    def command(self, reads, separator):
        return listeners_command(_unique([read["port"] for read in reads]))

    def split(self, reads, lines, separator):
        ports = _unique([read["port"] for read in reads])
        if len(lines) != len(ports):
            return {}
        by_port = dict(zip(ports, lines))
        return {index: [by_port[read["port"]]] for index, read in enumerate(reads)}


class DpkgJoin(Join):
    """pyinfra's DebPackages (``dpkg -l``) and rigkit's AptHeldPackages (dpkg-query and awk): one dpkg-query of every
    package's status, name, architecture and version, both read dpkg's database. DebPackages gets the lines of
    ``dpkg -l`` its pattern reads (status, name, version, then more text), AptHeldPackages every package's line
    of its own query."""

    requires_command = "dpkg-query"
    FACTS = (DebPackages, AptHeldPackages)

    def takes(self, fact, kwargs):
        return type(fact) in self.FACTS and not kwargs

    def read(self, fact, kwargs):
        return {"fact": type(fact)}

    def command(self, reads, separator):
        return dpkg_query((*HOLDS_FIELDS, "Version"))

    def split(self, reads, lines, separator):
        rows = [line.split("|") for line in lines if line]
        if not rows or any(len(row) != 4 for row in rows):
            return {}
        own = {
            DebPackages: [f"{status} {name} {version} {arch}" for status, name, arch, version in rows],
            AptHeldPackages: ["|".join(row[:3]) for row in rows],
        }
        return {index: own[read["fact"]] for index, read in enumerate(reads)}


JOINS: tuple[Join, ...] = (StatJoin(), Sha1Join(), SystemdJoin(), ListenersJoin(), DpkgJoin())


def join_for(fact: Any, kwargs: dict) -> Optional[Join]:
    """The join that reads this fact with others of its kind, or None: it is read on its own."""
    return next((join for join in JOINS if join.takes(fact, kwargs)), None)
