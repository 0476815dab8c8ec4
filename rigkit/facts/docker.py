"""Facts about the Docker engine, its images, compose and the registry as the rig sees it."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from rigkit.facts import split_exit
from rigkit.remote.registry import PROBE_TIMEOUT_MARK, api_base, parse_reference


class DockerEngine(FactBase):
    """{"server_version": str|None, "error": str|None} from `docker info`; None without a docker CLI."""

    def requires_command(self, *args, **kwargs) -> str:
        return "docker"

    def command(self) -> str:
        return "docker info --format '{{.ServerVersion}}' 2>&1; echo \"exit=$?\""

    def process(self, output: list[str]) -> dict:
        lines, status = split_exit(output)
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
        return (
            f'docker run --rm --network host {run_args} {shlex.quote(image)} {container_command} 2>&1; echo "exit=$?"'
        )

    def process(self, output: list[str]) -> dict:
        lines, status = split_exit(output)
        return {"ok": status == 0, "output": "\n".join(lines)}


class DockerImagePresent(FactBase):
    """True when the image reference (repository@sha256:...) is in the rig's local store."""

    def requires_command(self, *args, **kwargs) -> str:
        return "docker"

    def command(self, image: str) -> str:
        return f"docker image inspect --format present {shlex.quote(image)} 2>/dev/null || echo absent"

    def process(self, output):
        return "".join(output).strip() == "present"


# Where the docker CLI finds its plugins when its config adds none (docker/cli cli-plugins/manager: the config
# directory's cli-plugins first, then manager_unix.go defaultSystemPluginDirs).
CLI_PLUGIN_DIRS = (
    "/usr/local/lib/docker/cli-plugins",
    "/usr/local/libexec/docker/cli-plugins",
    "/usr/lib/docker/cli-plugins",
    "/usr/libexec/docker/cli-plugins",
)


class ComposeCommand(FactBase):
    """``docker compose`` (v2 plugin) or ``docker-compose`` (v1), whichever the rig has, else None.

    The plugin is found as the docker CLI finds it, by its file in the CLI's plugin directories (the shell's
    builtins: no process), not by running ``docker compose version`` (the CLI and the plugin: ~25 ms of a rig's
    CPU at every survey); only a config that adds plugin directories (cliPluginsExtraDirs) has the CLI asked. A
    plugin file that does not run is found here and fails when the stack is released, naming compose's error."""

    def command(self) -> str:
        dirs = " ".join(['"${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"', *CLI_PLUGIN_DIRS])
        return (
            "if command -v docker >/dev/null 2>&1; then "
            f"for d in {dirs}; do if [ -x \"$d/docker-compose\" ]; then echo 'docker compose'; exit 0; fi; done; "
            'if grep -qs cliPluginsExtraDirs "${DOCKER_CONFIG:-$HOME/.docker}/config.json" '
            "&& docker compose version >/dev/null 2>&1; then echo 'docker compose'; exit 0; fi; fi; "
            "if command -v docker-compose >/dev/null 2>&1; then echo docker-compose; fi"
        )

    def process(self, output):
        text = "".join(output).strip()
        return text or None


# The probe's own bound, in seconds. docker's CLI bounds each try (dial 30 s, TLS handshake 10 s, the /v2/
# ping 15 s: cli/registry/client/endpoint.go), but not a registry that stalls once it answered headers;
# past this the probe says PROBE_TIMEOUT_MARK and the rig is refused as its registry hung.
MANIFEST_PROBE_TIMEOUT_S = 60


class ManifestProbe(FactBase):
    """Can the rig's engine see the image in its registry? None when it can, else the registry's answer
    (the CLI's last line, or rigkit.remote.registry.PROBE_TIMEOUT_MARK when it gave none in time).

    ``docker manifest inspect`` asks the registry with the rig's own credentials and network, without pulling.
    """

    def requires_command(self, *args, **kwargs) -> str:
        return "docker"

    def command(self, image: str) -> str:
        quoted = shlex.quote(image)
        # plain http only where docker itself allows it without configuration: loopback registries
        insecure = "--insecure " if api_base(parse_reference(image).registry).startswith("http://") else ""
        bound = MANIFEST_PROBE_TIMEOUT_S
        # coreutils timeout exits 124 when the bound ran out
        return (
            f"out=$(DOCKER_CLI_EXPERIMENTAL=enabled timeout {bound} docker manifest inspect {insecure}{quoted} "
            f"2>&1); status=$?; if [ $status -eq 0 ]; then echo available; elif [ $status -eq 124 ]; then "
            f"echo 'missing {PROBE_TIMEOUT_MARK}: no answer within {bound} s'; "
            f"else printf 'missing %s\\n' \"$(printf '%s' \"$out\" | tail -n 1)\"; fi"
        )

    def process(self, output):
        text = "\n".join(output).strip()
        # the whole output is stripped first: an empty answer is the bare word "missing"
        return None if text == "available" else (text.removeprefix("missing").strip() or "no answer")
