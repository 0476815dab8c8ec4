"""The lab for every lab test: brought up once per session, torn down at the end.

Fixtures:
  lab           LabState (rigkit.lab.state): rigs, registry, ssh key, known_hosts, serving_image, engine.
                The full `rigkit lab up`; rigs from env RIGKIT_TEST_RIGS (default 3), the last
                RIGKIT_TEST_NETNS_RIGS of them (default 1) in their own network namespace, rig N on the
                Debian suite RIGKIT_TEST_DISTROS names N-th (default bookworm,trixie: rig2 is Debian 13
                with compose v2, the others Debian 12 with compose v1). Torn down at session end unless
                RIGKIT_KEEP_LAB=1.
  serving_image lab.serving_image, the record of rigkit.lab.serving_image.ensure_serving_image (releases
                "1" and "2" by digest); fails the test with the build error if the image could not be made.
  run_pyinfra   run_pyinfra(args=(), inventory=LAB_INVENTORY, deploy=None) -> CompletedProcess (.venv's pyinfra -y)
  rig_exec      rig_exec(rig, cmd, check=True) -> CompletedProcess (docker exec into the rig; str runs in bash)
  ssh_run       ssh_run(rig, cmd) -> (exit_status, stdout, stderr) over real SSH with the lab key
  rig_diagnostics rig_diagnostics(rig) -> str: containers, serving log tail, shm/disk/memory, host OOM lines
  rig_engine    rig_engine(rig): the rig's own Docker engine is started (systemctl start docker) and answers
  lab_rig_count the number of rigs the session asked for (lab_netns_rig_count: how many in their own netns)
  lab_host_data {rig name: host data} exactly as inventory/lab.py gives it to pyinfra (for rigkit.remote.tunnel)
  netns_rig     the last rig in its own network namespace (its API only through the SSH tunnel); skips
                when RIGKIT_TEST_NETNS_RIGS=0, fails when one was asked for and the lab has none
  deployed      release 1 of cpu-lab deployed by the real pipeline (`pyinfra -y inventory/lab.py deploy.py`)
                on every lab rig, once per session, asserted successful. RIGKIT_TEST_DEPLOY_LIMIT=rigN[,..]
                (development on a shared lab only) passes --limit; tests over every rig then fail.

A test marked `lab_down_last` runs after every other test of the session (it tears the lab down).
"""

from __future__ import annotations

import os
import runpy
import shlex
import subprocess
import time
from pathlib import Path
from typing import Optional, Sequence

import paramiko
import pytest

from rigkit.fleet.pyinfra_args import pyinfra_executable
from rigkit.lab.lab_model import stage_on_lab_rigs
from rigkit.lab.proc import print_progress
from rigkit.lab.rigs import unconvertible
from rigkit.lab.state import LabState, RigState, read_state_or_none
from rigkit.paths import REPO_ROOT

LAB_INVENTORY = REPO_ROOT / "inventory" / "lab.py"
DEPLOYS_DIR = Path(__file__).resolve().parent / "deploys"
DEFAULT_TEST_RIGS = 3
DEFAULT_TEST_NETNS_RIGS = 1
DEFAULT_TEST_DISTROS = "bookworm,trixie"
DEPLOY_TIMEOUT_S = 1800
RIG_ENGINE_TIMEOUT_S = 60.0


def requested_rig_count() -> int:
    return int(os.environ.get("RIGKIT_TEST_RIGS", DEFAULT_TEST_RIGS))


def requested_distros() -> list[str]:
    return [part for part in os.environ.get("RIGKIT_TEST_DISTROS", DEFAULT_TEST_DISTROS).split(",") if part]


def requested_netns_rig_count() -> int:
    return int(os.environ.get("RIGKIT_TEST_NETNS_RIGS", DEFAULT_TEST_NETNS_RIGS))


def inventory_host_data() -> dict[str, dict]:
    """The lab inventory's host data per rig, as pyinfra reads it (from the current lab state)."""
    return {name: data for name, data in runpy.run_path(str(LAB_INVENTORY))["lab"]}


def keep_lab() -> bool:
    return os.environ.get("RIGKIT_KEEP_LAB") == "1"


_model_staged: list[bool] = []


def stage_lab_model() -> None:
    """The lab's model (group_data/lab.py: model_source, model_store_path) staged onto every lab rig, once a session:
    a plain `pyinfra deploy.py` refuses a model that is not staged (staging is `rigkit deploy`'s or `rigkit stage`'s).
    Its store is on the rigs' own disk, so the tests that wipe a rig's NVMe or remove its engine keep it."""
    if _model_staged:
        return
    done = stage_on_lab_rigs(LAB_INVENTORY, REPO_ROOT)
    assert done.returncode == 0, f"staging the lab's model failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    _model_staged.append(True)


def run_pyinfra(
    args: Sequence[str] = (),
    inventory: Path | str = LAB_INVENTORY,
    deploy: Path | str | None = None,
    timeout: float = 900,
) -> subprocess.CompletedProcess:
    if deploy is not None:
        stage_lab_model()
    cmd = [pyinfra_executable(), "-y", *args, str(inventory)]
    if deploy is not None:
        cmd.append(str(deploy))
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def rig_exec(
    rig: RigState, cmd: str | Sequence[str], check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess:
    argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    result = subprocess.run(["docker", "exec", rig.container, *argv], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{rig.name}: {shlex.join(argv)} exited {result.returncode}:\n"
            f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        )
    return result


def ssh_client(rig: RigState, state: LabState) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(state.known_hosts)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())  # the lab's known_hosts must be right
    client.connect(
        rig.ssh_host,
        port=rig.ssh_port,
        username="root",
        key_filename=state.ssh_key,
        allow_agent=False,
        look_for_keys=False,
        timeout=10,
    )
    return client


def ssh_run(rig: RigState, state: LabState, cmd: str, timeout: float = 60) -> tuple[int, str, str]:
    client = ssh_client(rig, state)
    try:
        _, stdout, stderr = client.exec_command(cmd, timeout=timeout)
        status = stdout.channel.recv_exit_status()
        return status, stdout.read().decode(), stderr.read().decode()
    finally:
        client.close()


STACK_BACK_TIMEOUT_S = 300.0


def rig_diagnostics(rig: RigState) -> str:
    """What a failed wait on a rig's stack needs in the test report: the rig's containers, the serving
    container's log tail, shm/disk/memory on the rig, the host kernel's OOM lines."""
    from rigkit.serving.render import COMPOSE_PROJECT

    probes = {
        "containers": "docker ps -a --format '{{.Names}} {{.Status}}'",
        "serving log": f"docker ps -aq --filter label=com.docker.compose.project={COMPOSE_PROJECT} "
        "| head -1 | xargs -r docker logs --tail 40 2>&1",
        "shm/disk": "df -h /dev/shm / /var/lib/docker 2>&1; ls /dev/shm | head -20",
        "memory": "free -m",
        "listening": "ss -ltn 2>/dev/null || true",
    }
    parts = []
    for title, cmd in probes.items():
        try:
            result = rig_exec(rig, cmd, check=False, timeout=60)
            parts.append(f"--- {rig.name} {title}:\n{result.stdout[-3000:]}{result.stderr[-500:]}")
        except (subprocess.SubprocessError, OSError) as exc:
            parts.append(f"--- {rig.name} {title}: {exc}")
    oom = subprocess.run(
        "dmesg 2>/dev/null | grep -iE 'oom|killed process' | tail -5", shell=True, capture_output=True, text=True
    )
    parts.append(f"--- host kernel OOM lines:\n{oom.stdout}")
    return "\n".join(parts)


def assert_stack_comes_back(rig: RigState) -> None:
    """After a rig restart, a stack rigkit deployed there serves again by itself, as after a host reboot
    (the L2 disk mounts from fstab, the engine restarts its containers). No stack on the rig: nothing to do."""
    from rigkit.remote.client import ServingClient
    from rigkit.remote.tunnel import serving_url
    from rigkit.serving.render import CONTAINER_NAME

    if rig_exec(rig, f"docker ps -aq --filter name={CONTAINER_NAME}", check=False).stdout.strip() == "":
        return
    with serving_url(
        inventory_host_data()[rig.name], bind="127.0.0.1", port=rig.serving_port, inventory_name=rig.name
    ) as url:
        ServingClient(url).wait_ready(timeout_s=STACK_BACK_TIMEOUT_S)


def start_rig_engine(rig: RigState) -> None:
    rig_exec(rig, "systemctl start docker")
    deadline = time.monotonic() + RIG_ENGINE_TIMEOUT_S
    while rig_exec(rig, "docker info >/dev/null 2>&1", check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{rig.name}: its docker engine did not answer within {RIG_ENGINE_TIMEOUT_S} s: "
                + rig_exec(rig, "journalctl -u docker --no-pager | tail -20", check=False).stdout
            )
        time.sleep(0.5)


def pytest_configure(config):
    config.addinivalue_line("markers", "lab_down_last: tears the lab down; runs after every other test")


def pytest_collection_modifyitems(session, config, items):
    last = [item for item in items if item.get_closest_marker("lab_down_last")]
    items[:] = [item for item in items if item not in last] + last


_serving_image_error: list[str] = []


def refuse_wrong_shape(existing: Optional[LabState]) -> None:
    """Fail the session before any rig changes when the lab up cannot give this session's shape: a rig asked to
    have its own network namespace exists on host networking (never converted; netns_rig would fail later)."""
    if existing is None:
        return
    host_network = unconvertible(existing.rigs, requested_rig_count(), requested_netns_rig_count())
    if host_network:
        pytest.fail(
            f"the lab up has {', '.join(host_network)} on host networking, and this session asks for the last "
            f"{requested_netns_rig_count()} of {requested_rig_count()} rigs in their own network namespace "
            "(RIGKIT_TEST_NETNS_RIGS; `lab up` never converts a rig): nothing was changed. Fix: run "
            "`rigkit lab down` (keeps the cache) and run again, or set RIGKIT_TEST_NETNS_RIGS=0 for a session "
            "that needs no netns rig",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def lab() -> LabState:
    from rigkit.lab.cli import ensure_serving, lab_down, lab_up

    if os.geteuid() != 0:
        pytest.skip("the lab needs root (engine, loop devices, privileged rigs)")
    refuse_wrong_shape(read_state_or_none())  # before lab_up recreates any rig
    state = lab_up(
        requested_rig_count(),
        progress=print_progress,
        serving_image=False,
        netns_rigs=requested_netns_rig_count(),
        distros=requested_distros(),
    )
    # The serving image takes minutes when cold and may fail on its own: a failure there fails the
    # tests that need it (fixture `serving_image`), not every lab test.
    try:
        ensure_serving(state, print_progress)
        if not state.serving_image:
            raise RuntimeError("rigkit.lab.serving_image is not available")
    except Exception as exc:  # reported by the `serving_image` fixture
        _serving_image_error.append(f"{type(exc).__name__}: {exc}")
    yield state
    if not keep_lab():
        lab_down(progress=print_progress)


@pytest.fixture(scope="session")
def serving_image(lab: LabState) -> dict:
    if not lab.serving_image:
        pytest.fail(f"the lab has no serving image: {_serving_image_error or 'not built'}")
    return lab.serving_image


@pytest.fixture(scope="session")
def lab_rig_count() -> int:
    return requested_rig_count()


@pytest.fixture(scope="session")
def lab_netns_rig_count() -> int:
    return requested_netns_rig_count()


@pytest.fixture(scope="session")
def lab_host_data(lab) -> dict[str, dict]:
    return inventory_host_data()


@pytest.fixture(scope="session")
def netns_rig(lab) -> RigState:
    own = [rig for rig in lab.rigs if rig.netns]
    if own:
        return own[-1]
    if requested_netns_rig_count() == 0:
        pytest.skip("RIGKIT_TEST_NETNS_RIGS=0: no rig in its own network namespace")
    pytest.fail(
        f"RIGKIT_TEST_NETNS_RIGS={requested_netns_rig_count()} but no lab rig has its own network namespace: "
        "the rigs already ran on host networking (`lab up` never converts a rig); `rigkit lab down` first"
    )


@pytest.fixture(scope="session")
def deployed(lab, serving_image) -> subprocess.CompletedProcess:
    """Release 1 of cpu-lab on every lab rig, deployed once per session by the real pipeline (deploy.py)."""
    limit = os.environ.get("RIGKIT_TEST_DEPLOY_LIMIT")
    result = run_pyinfra(args=["--limit", limit] if limit else [], deploy="deploy.py", timeout=DEPLOY_TIMEOUT_S)
    assert result.returncode == 0, f"pyinfra failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="session", name="run_pyinfra")
def run_pyinfra_fixture(lab):
    return run_pyinfra


@pytest.fixture(scope="session", name="rig_exec")
def rig_exec_fixture(lab):
    return rig_exec


@pytest.fixture(scope="session", name="ssh_run")
def ssh_run_fixture(lab):
    return lambda rig, cmd, timeout=60: ssh_run(rig, lab, cmd, timeout)


@pytest.fixture(scope="session", name="assert_stack_comes_back")
def assert_stack_comes_back_fixture(lab):
    return assert_stack_comes_back


@pytest.fixture(scope="session", name="rig_diagnostics")
def rig_diagnostics_fixture(lab):
    return rig_diagnostics


@pytest.fixture(scope="session", name="rig_engine")
def rig_engine_fixture(lab):
    return start_rig_engine
