"""The router in front of the rigs (roles/router.py): its workers, its command line and its systemd unit.

Pure decisions. The gateway is a host of the inventory group ROUTER_GROUP; every other host of the run is a
rig, and each rig is one worker: ``http://<address the gateway reaches its API at>:<serving_port>``.

vllm-router 0.1.17 reads its workers' API key only from ``--api-key`` (router_args.py; no environment
variable), and a command line is visible to every user in ``ps`` and in ``systemctl show``. So the unit runs
ROUTER_LAUNCHER (rigkit/files/router_launch.py), which reads the key from a 0600 file and hands it to the
router's own launcher in the same process: the key is in no unit file, no command line and no diff.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence
from urllib.parse import urlsplit

from rigkit.errors import ConfigError
from rigkit.paths import FILES_DIR, RIG_LIB_DIR
from rigkit.remote.tunnel import WILDCARD_ADDRESSES, is_loopback_bind, rig_local_url, ssh_address, url_host
from rigkit.settings.defaults import ROUTER_GROUP
from rigkit.settings.knobs import PORT_RANGE, controller_secret_variable
from rigkit.settings.variables import REDACTED
from rigkit.systemd import exec_command_line

ROUTER_VENV = "/opt/rigkit-router"
ROUTER_PYTHON = f"{ROUTER_VENV}/bin/python"
ROUTER_PIP = f"{ROUTER_VENV}/bin/pip"
ROUTER_UNIT = "rigkit-router.service"
ROUTER_UNIT_PATH = f"/etc/systemd/system/{ROUTER_UNIT}"
ROUTER_LAUNCHER_SOURCE = FILES_DIR / "router_launch.py"
ROUTER_LAUNCHER = f"{RIG_LIB_DIR}/router_launch.py"
ROUTER_FRONT_SOURCE = FILES_DIR / "router_front.py"
ROUTER_FRONT = f"{RIG_LIB_DIR}/router_front.py"
ROUTER_CHECK_SOURCE = FILES_DIR / "router_check.py"
ROUTER_CHECK = f"{RIG_LIB_DIR}/router_check.py"
ROUTER_CONFIG_DIR = "/etc/rigkit/router"
ROUTER_API_KEY_FILE = f"{ROUTER_CONFIG_DIR}/api_key"
# the router's own argv (JSON), read by ROUTER_FRONT at each router start: a config change rewrites it and reloads
ROUTER_ARGV_FILE = f"{ROUTER_CONFIG_DIR}/argv.json"
ROUTER_PACKAGE = "vllm-router"
# apt packages the gateway needs: a venv for the router (Debian's python3 has no venv module without it)
ROUTER_APT_PACKAGES = ["python3-venv"]

# The router waits at start until every worker answers /health (vllm-router's default is 600 s). The deploy
# runs the rigs' roles (release, smoke) before the router's, so the workers serve by the time it starts:
# a short bound makes a router started over a dead rig fail within a minute, and the role's own check
# (/list_workers against the declared workers) names what is missing.
ROUTER_WORKER_STARTUP_TIMEOUT_S = 60
ROUTER_WORKER_STARTUP_CHECK_INTERVAL_S = 2
# How long the role waits for the router's /health after a (re)start: the worker wait and ~1.2 s to be ready.
ROUTER_READY_TIMEOUT_S = ROUTER_WORKER_STARTUP_TIMEOUT_S + 30
# The router's own health checks of its workers (vllm-router 0.1.17 checks every 60 s and needs 3 failures by
# default: a dead rig kept getting requests for up to 3 minutes). A worker that stops answering /health is out of the
# routing within ROUTER_UNHEALTHY_WITHIN_S (each of the failing checks may wait its timeout) and back after
# ROUTER_HEALTH_SUCCESS_THRESHOLD passing checks, with no operator.
ROUTER_HEALTH_CHECK_INTERVAL_S = 2
ROUTER_HEALTH_CHECK_TIMEOUT_S = 2
ROUTER_HEALTH_FAILURE_THRESHOLD = 2
ROUTER_HEALTH_SUCCESS_THRESHOLD = 2
ROUTER_UNHEALTHY_WITHIN_S = ROUTER_HEALTH_FAILURE_THRESHOLD * (
    ROUTER_HEALTH_CHECK_INTERVAL_S + ROUTER_HEALTH_CHECK_TIMEOUT_S
)
# vllm-router's circuit breaker (per worker, on failed requests; 0.1.17 defaults: open after 10 failures, retry after
# 60 s, close after 3 successes) set from the health checks' figures: a rig that recovered was kept out of the
# routing 15-28 s after its health checks took it back. Open after as many failures as the health checks need to mark
# a worker down, within the span they take to do it; retry as soon as the health checks could take it back; close
# after as many successes as they need.
ROUTER_BREAKER_FAILURE_THRESHOLD = ROUTER_HEALTH_FAILURE_THRESHOLD
ROUTER_BREAKER_WINDOW_S = ROUTER_UNHEALTHY_WITHIN_S
ROUTER_BREAKER_TIMEOUT_S = ROUTER_HEALTH_SUCCESS_THRESHOLD * ROUTER_HEALTH_CHECK_INTERVAL_S
ROUTER_BREAKER_SUCCESS_THRESHOLD = ROUTER_HEALTH_SUCCESS_THRESHOLD
HEALTH_FLAGS = (
    "--health-check-interval-secs",
    str(ROUTER_HEALTH_CHECK_INTERVAL_S),
    "--health-check-timeout-secs",
    str(ROUTER_HEALTH_CHECK_TIMEOUT_S),
    "--health-failure-threshold",
    str(ROUTER_HEALTH_FAILURE_THRESHOLD),
    "--health-success-threshold",
    str(ROUTER_HEALTH_SUCCESS_THRESHOLD),
    "--cb-failure-threshold",
    str(ROUTER_BREAKER_FAILURE_THRESHOLD),
    "--cb-window-duration-secs",
    str(ROUTER_BREAKER_WINDOW_S),
    "--cb-timeout-duration-secs",
    str(ROUTER_BREAKER_TIMEOUT_S),
    "--cb-success-threshold",
    str(ROUTER_BREAKER_SUCCESS_THRESHOLD),
)
# How the front (ROUTER_FRONT) supervises the router: started again this long after it died (the unit's RestartSec
# before the front existed), stopped within ROUTER_STOP_TIMEOUT_S (vllm-router finishes what it serves on SIGTERM).
ROUTER_RESTART_DELAY_S = 2
ROUTER_STOP_TIMEOUT_S = 60


def front_argv(python: str, front: str, listen: str, argv_file: str) -> list[str]:
    """The router front's argv: it holds ``listen`` and runs the router from ``argv_file`` behind it (ROUTER_FRONT)."""
    return [
        python,
        front,
        "--listen",
        listen,
        "--argv-file",
        argv_file,
        "--restart-delay",
        str(ROUTER_RESTART_DELAY_S),
        "--ready-timeout",
        str(ROUTER_READY_TIMEOUT_S),
        "--stop-timeout",
        str(ROUTER_STOP_TIMEOUT_S),
    ]


@dataclass(frozen=True)
class Worker:
    """One rig behind the router."""

    rig: str
    url: str
    model: str  # the rig's served_model_name: what a request through the router names

    @classmethod
    def of(cls, value: "Worker | Mapping[str, str]") -> "Worker":
        return value if isinstance(value, Worker) else cls(**value)


def is_gateway(groups: Sequence[str]) -> bool:
    """A host of ROUTER_GROUP runs the router role only; every other host is a rig."""
    return ROUTER_GROUP in groups


def rig_address(name: str, data: Mapping[str, Any], bind_address: str) -> str:
    """The address the fleet knows rig ``name`` by: router_worker_address when declared, else the address its
    API binds when that is one address beyond loopback, else its SSH address. The router reaches the rig's API
    there (``worker_address``); the KV store allows it as the rig's source (rigkit.kv_store.store_sources)."""
    declared = data.get("router_worker_address")
    if declared:
        return str(declared)
    if bind_address not in WILDCARD_ADDRESSES and not is_loopback_bind(bind_address):
        return bind_address
    return ssh_address(name, data)


# pyinfra's name for the controller itself
CONTROLLER_HOST = "@local"


def refuse_router_on_controller(name: str, router: Mapping[str, Any]) -> None:
    """The router role on the controller installs vllm-router, a systemd unit and files under /etc and /usr/local on
    the machine running rigkit: refused unless its data says so in so many words (router_on_controller)."""
    if name == CONTROLLER_HOST and not router["router_on_controller"]:
        raise ConfigError(
            "router_on_controller",
            router["router_on_controller"],
            f"{CONTROLLER_HOST} is the controller itself: the router role would install vllm-router, "
            "its systemd unit and files under /etc and /usr/local on this machine",
            f"name the gateway by its SSH address, leave {CONTROLLER_HOST} out of this run (--limit the "
            f"rigs; a router you run yourself there is still drained through), or set "
            f"router_on_controller: true in {CONTROLLER_HOST}'s data",
        )


def worker_address(name: str, data: Mapping[str, Any], bind_address: str) -> str:
    """Where the gateway reaches rig ``name``'s API: its ``rig_address``. A rig bound to its own loopback is
    reachable only from its own network namespace: that is fine when its SSH address is a loopback address too
    (the gateway shares the host, as in the lab), refused otherwise."""
    address = rig_address(name, data, bind_address)
    if data.get("router_worker_address") or not is_loopback_bind(bind_address) or is_loopback_bind(address):
        return address
    raise ConfigError(
        f"{name}.bind_address",
        bind_address,
        f"the rig's API listens on its own loopback, which the router cannot reach at {address}",
        "set bind_address to an address the gateway reaches (0.0.0.0 behind the API firewall), "
        f"or router_worker_address for {name}, or leave {name} out of the router's inventory",
    )


def worker_url(address: str, port: int) -> str:
    return f"http://{url_host(address)}:{port}"


def workers(rigs: Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any]]]) -> list[Worker]:
    """The router's workers: rig name -> (host data, the rig's validated knobs), in inventory order.
    ConfigError when there is none, or two rigs give the same URL (the router would list it once)."""
    if not rigs:
        raise ConfigError(
            "inventory",
            None,
            f"the run has a gateway (group {ROUTER_GROUP}) but no rig to route to",
            f"add the rigs to the same inventory as the hosts of group {ROUTER_GROUP}",
        )
    found: dict[str, str] = {}
    out = []
    for name, (data, knobs) in rigs.items():
        url = worker_url(worker_address(name, data, knobs["bind_address"]), knobs["serving_port"])
        if url in found:
            raise ConfigError(
                f"{name}.serving_port",
                knobs["serving_port"],
                f"{name} and {found[url]} both reach the router as {url}",
                "give each rig on one address its own serving_port, or set router_worker_address",
            )
        found[url] = name
        out.append(Worker(name, url, knobs["served_model_name"]))
    return out


def pip_find_links(value: Optional[str]) -> Optional[str]:
    """router_pip_find_links checked: an http(s) URL or an absolute directory, nothing a shell would read."""
    if value is None:
        return None
    scheme = urlsplit(value).scheme
    if not (scheme in ("http", "https") or (not scheme and value.startswith("/"))):
        raise ConfigError(
            "router_pip_find_links",
            value,
            "is neither an http(s) URL nor an absolute directory",
            "set it to the wheelhouse's URL (http://HOST:PORT/) or its absolute path on the gateway",
        )
    if any(char.isspace() or char in "'\"\\`$;&|<>(){}*?!#" for char in value):
        raise ConfigError(
            "router_pip_find_links",
            value,
            "holds a blank or a shell character",
            "give the wheelhouse a plain URL or path",
        )
    return value


def pip_install_args(find_links: Optional[str]) -> Optional[str]:
    """pip's extra arguments: a wheelhouse means no package index at all (an offline gateway installs the same)."""
    return None if find_links is None else f"--no-index --find-links {find_links}"


def api_key(router: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """router_api_key from host data, else the controller's RIGKIT_ROUTER_API_KEY (off every command line)."""
    key = router["router_api_key"] or environ.get(controller_secret_variable("router_api_key")) or None
    if key is not None and (any(char.isspace() for char in key) or "\x00" in key):
        raise ConfigError(
            "router_api_key", REDACTED, "holds a blank, a newline or a NUL", "use a key of visible characters only"
        )
    return key


def router_url(router: Mapping[str, Any]) -> str:
    """The router's base URL as a process on the gateway reaches it."""
    return rig_local_url(router["router_bind_address"], router["router_port"])


def refuse_shared_port(router: Mapping[str, Any]) -> None:
    port = router["router_port"]
    if router["router_metrics_port"] == port:
        raise ConfigError(
            "router_metrics_port",
            router["router_metrics_port"],
            "is router_port too: the router would fail at start",
            f"set router_metrics_port to another port, e.g. {port + 1 if port < PORT_RANGE[1] else port - 1}",
        )


def command_line(router: Mapping[str, Any], workers_: Sequence[Worker], with_api_key: bool) -> list[str]:
    """The router's argv (ROUTER_ARGV_FILE): the launcher (which adds --api-key from ROUTER_API_KEY_FILE), then
    vllm-router's flags. No --host/--port: the front appends its loopback port (it holds router_port itself)."""
    refuse_shared_port(router)
    argv = [ROUTER_PYTHON, ROUTER_LAUNCHER]
    if with_api_key:
        argv += ["--api-key-file", ROUTER_API_KEY_FILE]
    argv += [
        "--prometheus-host",
        router["router_bind_address"],
        "--prometheus-port",
        str(router["router_metrics_port"]),
        "--policy",
        router["router_policy"],
        "--worker-startup-timeout-secs",
        str(ROUTER_WORKER_STARTUP_TIMEOUT_S),
        "--worker-startup-check-interval",
        str(ROUTER_WORKER_STARTUP_CHECK_INTERVAL_S),
        *HEALTH_FLAGS,
        "--worker-urls",
        *[worker.url for worker in workers_],
    ]
    return argv


def argv_file_text(router: Mapping[str, Any], workers_: Sequence[Worker], with_api_key: bool) -> str:
    """ROUTER_ARGV_FILE: the router's argv as JSON, one item a line (a diff names what changed)."""
    return json.dumps(command_line(router, workers_, with_api_key), indent=0) + "\n"


def front_listen(router: Mapping[str, Any]) -> str:
    host = router["router_bind_address"]
    return f"[{host}]:{router['router_port']}" if ":" in host else f"{host}:{router['router_port']}"


def unit_text(router: Mapping[str, Any]) -> str:
    """rigkit-router.service: the front on router_port, running the router behind it (ROUTER_FRONT). A reload
    (SIGHUP) restarts the router from ROUTER_ARGV_FILE while the front holds the port: no client is refused."""
    refuse_shared_port(router)
    try:
        exec_start = exec_command_line(front_argv(ROUTER_PYTHON, ROUTER_FRONT, front_listen(router), ROUTER_ARGV_FILE))
    except ValueError as exc:
        raise ConfigError(
            "router_bind_address", router["router_bind_address"], str(exc), "give plain addresses and URLs"
        ) from None
    return (
        f"[Unit]\nDescription=rigkit router: vllm-router {router['router_version']} behind its front on "
        f"{front_listen(router)}\nAfter=network-online.target\nWants=network-online.target\n\n"
        "[Service]\n"
        f"ExecStart={exec_start}\n"
        "ExecReload=/bin/kill -HUP $MAINPID\n"
        f"Restart=always\nRestartSec={ROUTER_RESTART_DELAY_S}\nTimeoutStopSec={ROUTER_STOP_TIMEOUT_S + 10}\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )


def worker_mismatch(declared: Sequence[Worker], listed: Sequence[str]) -> Optional[str]:
    """What differs between the declared workers and the router's /list_workers; None when they agree."""
    wanted = {worker.url: worker.rig for worker in declared}
    missing = [f"{rig} ({url})" for url, rig in wanted.items() if url not in listed]
    extra = [url for url in listed if url not in wanted]
    parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
        [f"not declared {', '.join(extra)}"] if extra else []
    )
    return "; ".join(parts) or None
