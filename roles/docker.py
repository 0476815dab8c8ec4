"""docker: a pinned, held Docker engine with compose, and rigkit's daemon options.

Ensures
- the engine from ``docker_source``: "docker-ce" (Docker's apt repository, its key under
  /etc/apt/keyrings and ``signed-by``; docker-ce, cli, containerd, buildx, compose plugin) or
  "distro" (the distribution's docker.io and compose package: ``docker-compose`` v1 on Debian 12,
  ``docker-cli`` + ``docker-compose`` v2 on Debian 13, ``docker-compose-v2`` on Ubuntu); version pins
  honoured, packages held;
- /etc/docker/daemon.json holds ``docker_daemon_options`` merged into whatever else is there
  (keys rigkit does not declare are never removed); the engine restarts only when the file changed;
- the engine is enabled and running; ``docker_users`` are in the docker group.
Verifies that the engine answers and runs a container (see ``docker_verify_image``). On a rig where this role
changes nothing, the engine answered ``docker info`` as the deploy was prepared and no container would be run
(none declared, no local image), the check would only repeat that answer: it runs only after a change.
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api.deploy import deploy
from pyinfra.facts.deb import DebArch, DebPackages
from pyinfra.facts.files import FileContents
from pyinfra.facts.server import Users
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

from rigkit.distro import DOCKER_SUPPORTED_OS, TargetOS, target_os
from rigkit.errors import PreflightError
from rigkit.facts.apt import AptHeldPackages
from rigkit.facts.batch import FactSpec
from rigkit.facts.surveyed import directory_reads, service_reads
from rigkit.operations.apt import APT_KEYRINGS_DIR, apt_source_line, packages_held, packages_installed, pinned
from rigkit.operations.docker import docker_engine_verified, json_file_merged
from rigkit.settings.hostdata import RigSettings
from rigkit.survey import RigState
from roles import Run

DAEMON_JSON = "/etc/docker/daemon.json"
DOCKER_SERVICE = "docker.service"
DOCKER_KEYRING = f"{APT_KEYRINGS_DIR}/docker.asc"
DOCKER_SOURCE_LIST = "/etc/apt/sources.list.d/docker.list"


def engine_packages(os: TargetOS, settings: dict) -> list[str]:
    """apt package specs for the chosen source, with the declared pins."""
    engine_version, compose_version = settings["docker_version"], settings["docker_compose_version"]
    if settings["docker_source"] == "docker-ce":
        return [
            *pinned(["docker-ce", "docker-ce-cli"], engine_version),
            "containerd.io",
            "docker-buildx-plugin",
            *pinned(["docker-compose-plugin"], compose_version),
        ]
    compose = "docker-compose" if os.id == "debian" else "docker-compose-v2"
    # Debian 13 builds the CLI from the engine's source as its own package, at the engine's version
    engine = ["docker.io", "docker-cli"] if (os.id, os.version) == ("debian", "13") else ["docker.io"]
    return [*pinned(engine, engine_version), *pinned([compose], compose_version)]


def check_users(users: list[str]) -> None:
    """Refuse, before any change, a docker_users entry that is not a user on the host."""
    if not users:
        return
    existing = host.get_fact(Users)
    for user in users:
        if user not in existing:
            raise PreflightError(
                "docker_users",
                user,
                "no such user on the host",
                "create the user first, or remove it from docker_users",
            )


def engine_check_repeats(state: RigState, verify_image: str | None) -> bool:
    """True when the engine check would only repeat what the survey already saw: ``docker info`` answered
    and no container would run (none declared, no local image to pick)."""
    answered = state.engine is not None and not state.engine["error"]
    return answered and not verify_image and not state.local_images


def operation_reads(rig: RigSettings) -> list[FactSpec]:
    """What this role's operations read on a rig that is already right (docker-ce's repository files are
    read as they run)."""
    return [
        *directory_reads("/etc/docker"),
        FactSpec.of(FileContents, path=DAEMON_JSON),
        FactSpec.of(DebPackages),
        FactSpec.of(AptHeldPackages),
        *service_reads(DOCKER_SERVICE),
    ]


@deploy("docker")
def docker(rig: RigSettings, run: Run) -> None:
    settings = rig.docker
    run.engine_provisioned = True
    state = run.rig_state(rig)
    os = target_os(state.os_release, "docker", DOCKER_SUPPORTED_OS)
    check_users(settings["docker_users"])

    if settings["docker_source"] == "docker-ce":
        files.directory(name="apt keyrings directory", path=APT_KEYRINGS_DIR, mode="755")
        repo = f"{settings['docker_apt_url']}/{os.id}"
        files.download(name="Docker's apt signing key", src=f"{repo}/gpg", dest=DOCKER_KEYRING, mode="644")
        source = apt_source_line(repo, os.codename, "stable", DOCKER_KEYRING, host.get_fact(DebArch))
        files.put(name="Docker's apt repository", src=StringIO(source), dest=DOCKER_SOURCE_LIST, mode="644")

    # daemon.json first: a fresh engine then starts with it (no default bridge, ever, in the lab).
    files.directory(name="/etc/docker", path="/etc/docker", mode="755")
    daemon = json_file_merged(
        name="Merge rigkit's options into daemon.json", path=DAEMON_JSON, options=settings["docker_daemon_options"]
    )
    install = packages_installed(name="Install the Docker engine", packages=engine_packages(os, settings))
    packages_held(name="Hold the Docker engine packages", packages=engine_packages(os, settings))
    started = systemd.service(
        name="Docker engine enabled and running", service=DOCKER_SERVICE, running=True, enabled=True
    )
    # An install, an upgrade or a start already reads the new file: restart only a running engine.
    restart = systemd.service(
        name="Restart the engine for the new daemon.json",
        service=DOCKER_SERVICE,
        restarted=True,
        _if=[daemon.did_change, install.did_not_change, started.did_not_change],
    )

    for user in settings["docker_users"]:
        server.user(name=f"{user} in the docker group", user=user, groups=["docker"], append=True, ensure_home=False)

    only_after_a_change = (
        {"_if": any_changed(daemon, install, started, restart)}
        if engine_check_repeats(state, settings["docker_verify_image"])
        else {}
    )
    docker_engine_verified(
        name="Verify the engine answers and runs a container",
        image=settings["docker_verify_image"],
        image_field="docker_verify_image",
        **only_after_a_change,
    )
