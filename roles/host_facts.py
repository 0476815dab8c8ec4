"""Facts the provisioning roles read from a host (pyinfra's own cover the rest).

Commands that may fail on a healthy host (a tool reporting an error, a device that is not
there) end with ``echo "exit=$?"`` or a guard, so a failure becomes data the role can name
in its error instead of a fact error that hides it.
"""

from __future__ import annotations

import secrets
import shlex
from dataclasses import dataclass
from typing import Any, Optional

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import FactProcessError

from rigkit.nvidia_smi import DRIVER_VERSION_FILE, parse_csv_table, parse_driver_version

EXISTS_MARKER = "__rigkit_file_exists__"


def _split_exit(output: list[str]) -> tuple[list[str], int]:
    """Separate the trailing ``exit=N`` line our commands print from the tool's own output."""
    lines = list(output)
    if lines and lines[-1].startswith("exit="):
        return lines[:-1], int(lines[-1][len("exit="):] or 1)
    return lines, 1


class FileText(FactBase):
    """The text of a file, "" for an empty one, None when it does not exist."""

    reads_file = True  # the operation tests derive this fact from the case's file contents

    def command(self, path: str) -> str:
        quoted = shlex.quote(path)
        return f"if [ -f {quoted} ]; then echo {EXISTS_MARKER}; cat {quoted}; fi"

    def process(self, output: list[str]) -> Optional[str]:
        if not output or output[0] != EXISTS_MARKER:
            return None
        return "\n".join(output[1:])


class AptHeldPackages(FactBase):
    """Names of the packages `apt-mark hold` protects from upgrades."""

    default = set

    def requires_command(self, *args, **kwargs) -> str:
        return "apt-mark"

    def command(self) -> str:
        return "apt-mark showhold"

    def process(self, output: list[str]) -> set[str]:
        return {line.strip() for line in output if line.strip()}


class LoadedKernelModules(FactBase):
    """Names of the kernel modules loaded right now (/proc/modules)."""

    default = set

    def command(self) -> str:
        return "cat /proc/modules 2>/dev/null || true"

    def process(self, output: list[str]) -> set[str]:
        return {line.split()[0] for line in output if line.strip()}


class NvidiaModuleVersion(FactBase):
    """Version of the loaded nvidia kernel module (e.g. "580.95.05"), None when not loaded."""

    def command(self) -> str:
        return f"cat {DRIVER_VERSION_FILE} 2>/dev/null || true"

    def process(self, output: list[str]) -> Optional[str]:
        return parse_driver_version("\n".join(output))


class NvidiaSmiGpus(FactBase):
    """GPUs as nvidia-smi reports them: {"gpus": [{"uuid", "driver_version"}], "error": str|None}.

    None when nvidia-smi is not installed. A driver/library mismatch (installed but not yet
    loaded) comes back as ``error`` with nvidia-smi's own message.
    """

    def requires_command(self, *args, **kwargs) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        return 'nvidia-smi --query-gpu=uuid,driver_version --format=csv 2>&1; echo "exit=$?"'

    def process(self, output: list[str]) -> dict:
        lines, status = _split_exit(output)
        if status != 0:
            return {"gpus": [], "error": " ".join(line.strip() for line in lines) or f"exit {status}"}
        return {"gpus": parse_query_gpus(lines), "error": None}


def parse_query_gpus(lines: list[str]) -> list[dict]:
    """uuid and driver_version of each GPU in a ``nvidia-smi --query-gpu=... --format=csv`` answer."""
    return [{"uuid": row["uuid"], "driver_version": row["driver_version"]}
            for row in parse_csv_table("\n".join(lines)) if "uuid" in row and "driver_version" in row]


class DockerEngine(FactBase):
    """{"server_version": str|None, "error": str|None} from `docker info`; None without a docker CLI."""

    def requires_command(self, *args, **kwargs) -> str:
        return "docker"

    def command(self) -> str:
        return "docker info --format '{{.ServerVersion}}' 2>&1; echo \"exit=$?\""

    def process(self, output: list[str]) -> dict:
        lines, status = _split_exit(output)
        text = " ".join(line.strip() for line in lines).strip()
        if status != 0 or not text:
            return {"server_version": None, "error": text or f"exit {status}"}
        return {"server_version": text, "error": None}


class DockerLocalImages(FactBase):
    """Tagged images already in the engine's store ("repo:tag"), newest first."""

    default = list

    def requires_command(self, *args, **kwargs) -> str:
        return "docker"

    def command(self) -> str:
        return "docker image ls --format '{{.Repository}}:{{.Tag}}' 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip() and "<none>" not in line]


class DockerRunCheck(FactBase):
    """Runs a throwaway container (``--rm``, host network) and reports {"ok", "output"}.

    A check, not a change: the container is removed and nothing on the host is altered.
    """

    def requires_command(self, *args, **kwargs) -> str:
        return "docker"

    def command(self, image: str, run_args: str = "", container_command: str = "true") -> str:
        return (f"docker run --rm --network host {run_args} {shlex.quote(image)} {container_command} 2>&1; "
                'echo "exit=$?"')

    def process(self, output: list[str]) -> dict:
        lines, status = _split_exit(output)
        return {"ok": status == 0, "output": "\n".join(lines)}


class BlockDeviceProbe(FactBase):
    """What is on a block device, read from the device itself (``blkid -p``, no udev cache).

    {"path": resolved /dev path, "TYPE", "LABEL", "UUID", "PTTYPE" (when present)},
    or None when the path is not a block device.
    """

    def command(self, device: str) -> str:
        quoted = shlex.quote(device)
        return (f"if [ -b {quoted} ]; then echo path=$(readlink -f {quoted}); "
                f"blkid -p -o export {quoted} 2>/dev/null; true; fi")

    def process(self, output: list[str]) -> Optional[dict]:
        probe = {}
        for line in output:
            key, sep, value = line.partition("=")
            if sep:
                probe[key.strip()] = value.strip()
        return probe if "path" in probe else None


class BlockDeviceList(FactBase):
    """`lsblk` one line per disk and partition ("PATH SIZE TYPE"), for error messages."""

    default = list

    def command(self) -> str:
        return "lsblk -n -o PATH,SIZE,TYPE,FSTYPE 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str]:
        return [" ".join(line.split()) for line in output if line.strip()]


class MountedFilesystem(FactBase):
    """What is mounted at a path: {"source", "fstype", "options": [..]}, or None."""

    def command(self, mount_point: str) -> str:
        return (f"findmnt -n -o SOURCE,FSTYPE,OPTIONS --mountpoint {shlex.quote(mount_point)} "
                "2>/dev/null || true")

    def process(self, output: list[str]) -> Optional[dict]:
        fields = " ".join(output).split()
        if len(fields) < 3:
            return None
        return {"source": fields[0], "fstype": fields[1], "options": fields[2].split(",")}


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

    The facts' commands run side by side on the host (each in its own subshell, its output in a temporary
    directory), then print in order, each followed by a marker line carrying its exit status, or "missing"
    when the command the fact requires is absent (its default, as pyinfra gives). A fact whose command
    fails, or whose output its process() refuses, is left out: roles._common.facts_now then reads it alone,
    so pyinfra reports and fails the host exactly as it would have. No temporary directory: no output at
    all, and facts_now reads every fact alone.
    """

    def command(self, facts: tuple[FactSpec, ...]) -> str:
        # one instance per fact for command() and process(), as pyinfra uses (FileContents keeps state on it)
        self._facts = [(spec, spec.fact()) for spec in facts]
        # a marker the facts' own output cannot contain by accident
        self._marker = f"{BATCH_MARKER}{secrets.token_hex(6)}"
        lines = ['d=$(mktemp -d 2>/dev/null) || exit 0', "trap 'rm -rf \"$d\"' EXIT"]
        for index, (spec, fact) in enumerate(self._facts):
            kwargs = dict(spec.kwargs)
            if fact.shell_executable:
                raise ValueError(f"{spec}: a fact with its own shell cannot join a batch")
            run = f"( {_shell_text(fact.command(**kwargs))}\n) >\"$d/{index}\" 2>/dev/null; s=$?"
            needs = fact.requires_command(**kwargs)
            if needs:
                run = f"if command -v {shlex.quote(needs)} >/dev/null 2>&1; then {run}; else s=missing; fi"
            lines.append(f"{{ {run}; echo \"$s\" >\"$d/{index}.status\"; }} &")
        lines.append("wait")
        # the newline ends an output whose last line has none; process() removes it again
        indexes = " ".join(str(index) for index in range(len(self._facts)))
        lines.append(f"for i in {indexes}; do cat \"$d/$i\"; "
                     f"printf '\\n{self._marker} %s\\n' \"$(cat \"$d/$i.status\")\"; done")
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
            status = line[len(self._marker) + 1:]
            if status == "missing" or (status == "0" and not lines):
                results[spec] = fact.default()
            elif status == "0":
                try:
                    results[spec] = fact.process(lines)
                except FactProcessError:
                    pass
            lines = []
        return results
