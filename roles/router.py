"""router: vllm-router on the gateway, pinned, under systemd, in front of the rigs of the inventory.

Ensures
- python3-venv (apt) and a venv at ROUTER_VENV holding vllm-router ``router_version`` (from the wheelhouse
  ``router_pip_find_links`` with --no-index when it is set);
- the launcher and check helpers; the workers' API key (``router_api_key``, or the controller's
  RIGKIT_ROUTER_API_KEY) in a 0600 file the launcher reads, never on a command line or in a diff;
- the front (ROUTER_FRONT) holding router_port and the router's argv (ROUTER_ARGV_FILE: policy, workers, health
  checks and breaker); the unit rigkit-router.service runs the front, enabled and running. A changed install,
  launcher, key or argv is a reload (the front restarts the router behind the port it holds: no client is refused);
  only a changed unit or front restarts the unit.
Verifies that /health answers within ROUTER_READY_TIMEOUT_S and /list_workers is exactly the declared workers;
after a change, one chat completion through the router is answered (smoke, from the controller).
"""

from __future__ import annotations

from io import StringIO
from typing import Mapping, Sequence

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, pip, python, systemd
from pyinfra.operations.util import any_changed

from rigkit.errors import RigkitError
from rigkit.operations import refusing_step
from rigkit.operations.apt import packages_installed
from rigkit.operations.files import secret_file
from rigkit.operations.router import router_verified
from rigkit.paths import RIG_LIB_DIR
from rigkit.remote.tunnel import serving_url
from rigkit.router import (
    ROUTER_API_KEY_FILE,
    ROUTER_APT_PACKAGES,
    ROUTER_ARGV_FILE,
    ROUTER_CHECK,
    ROUTER_CHECK_SOURCE,
    ROUTER_CONFIG_DIR,
    ROUTER_FRONT,
    ROUTER_FRONT_SOURCE,
    ROUTER_LAUNCHER,
    ROUTER_LAUNCHER_SOURCE,
    ROUTER_PACKAGE,
    ROUTER_PIP,
    ROUTER_READY_TIMEOUT_S,
    ROUTER_UNIT,
    ROUTER_UNIT_PATH,
    ROUTER_VENV,
    Worker,
    api_key,
    argv_file_text,
    pip_find_links,
    pip_install_args,
    router_url,
    unit_text,
)
from rigkit.serving.smoke import check_router
from rigkit.settings.hostdata import RigSettings
from roles import Run


def smoke_through_router(router: Mapping, data: Mapping, model: str) -> None:
    """A chat completion through the router (from the controller, through the gateway's SSH tunnel when the
    router binds the gateway's loopback) is answered."""
    with serving_url(data, router["router_bind_address"], router["router_port"], host.name) as url:
        checks = check_router(url, model)
    failed = [check for check in checks if not check.ok]
    if failed:
        raise RigkitError(
            "router",
            url,
            f"smoke through the router failed: {failed[0].detail}",
            "see `journalctl -u rigkit-router` on the gateway and the rigs' smoke",
        )


@deploy("router")
def router(settings: RigSettings, run: Run, workers: Sequence[Worker | Mapping[str, str]] = ()) -> None:
    config = settings.router
    workers = [Worker.of(worker) for worker in workers]
    find_links = pip_find_links(config["router_pip_find_links"])
    key = api_key(config)

    packages_installed(name="python3-venv for the router", packages=ROUTER_APT_PACKAGES)
    pip.venv(name="The router's venv", path=ROUTER_VENV, python="python3")
    install = pip.packages(
        name=f"vllm-router {config['router_version']}",
        packages=[f"{ROUTER_PACKAGE}=={config['router_version']}"],
        pip=ROUTER_PIP,
        extra_install_args=pip_install_args(find_links),
    )
    files.directory(name="rigkit helper directory", path=RIG_LIB_DIR)
    files.directory(name="router configuration directory", path=ROUTER_CONFIG_DIR, mode="700")
    launcher, front = (
        files.put(name=name, src=str(source), dest=dest, mode="644", create_remote_dir=False)
        for name, source, dest in (
            ("Router launcher", ROUTER_LAUNCHER_SOURCE, ROUTER_LAUNCHER),
            ("Router front (holds the port across router restarts)", ROUTER_FRONT_SOURCE, ROUTER_FRONT),
        )
    )
    files.put(
        name="Router check helper", src=str(ROUTER_CHECK_SOURCE), dest=ROUTER_CHECK, mode="755", create_remote_dir=False
    )
    if key is not None:
        key_file = secret_file(name="The workers' API key (0600)", text=key + "\n", dest=ROUTER_API_KEY_FILE)
    else:
        key_file = files.file(name="No API key file", path=ROUTER_API_KEY_FILE, present=False)
    argv = files.put(
        name="Router arguments",
        src=StringIO(argv_file_text(config, workers, with_api_key=key is not None)),
        dest=ROUTER_ARGV_FILE,
        mode="600",
        create_remote_dir=False,
    )
    unit = files.put(
        name="Router unit",
        src=StringIO(unit_text(config)),
        dest=ROUTER_UNIT_PATH,
        mode="644",
        create_remote_dir=False,
    )
    systemd.daemon_reload(name="systemd reads the router unit", _if=unit.did_change)
    started = systemd.service(name="Router enabled and running", service=ROUTER_UNIT, running=True, enabled=True)
    # A start already reads everything new. A running front restarts only for its own unit or code; anything else
    # is a reload: the front restarts the router behind the port it holds.
    restarted = systemd.service(
        name="Router front restarted for its new unit or code",
        service=ROUTER_UNIT,
        restarted=True,
        _if=[any_changed(unit, front), started.did_not_change],
    )
    reloaded = systemd.service(
        name="Router restarted behind its front for its new install, arguments or key (no client refused)",
        service=ROUTER_UNIT,
        reloaded=True,
        _if=[any_changed(install, launcher, key_file, argv), started.did_not_change, restarted.did_not_change],
    )
    router_verified(
        name="Router answers and lists the rigs",
        url=router_url(config),
        workers=workers,
        timeout_s=ROUTER_READY_TIMEOUT_S,
    )
    python.call(
        name="Smoke through the router",
        function=refusing_step(smoke_through_router),
        _if=any_changed(install, launcher, key_file, argv, unit, front, started, restarted, reloaded),
        router=config,
        data=dict(settings.data),
        model=workers[0].model if workers else "",
    )
