"""The preflight role on a real deployed rig: bad input only the host can reveal is refused before any role
changes the rig.

Each refused run also asks for a daemon.json option the docker role would merge (a dry run shows it would
change the rig): the refusal must come before the docker role, so the rig's daemon.json, engine, stack
files, ledger, fstab, mounts and containers are what they were, and pyinfra ran nothing but the refusal.
The foreign listener is a real `python3 -m http.server` inside the rig, on a port of the shared loopback.
"""

from __future__ import annotations

import json
import runpy
import socket
import subprocess

import pytest

from rigkit.fleet.pyinfra_args import pyinfra_executable
from rigkit.paths import REPO_ROOT
from rigkit.settings.defaults import L2_DISK_VARIABLES

pytestmark = [pytest.mark.lab]

LAB_INVENTORY = REPO_ROOT / "inventory" / "lab.py"
REFUSAL_STEP = "preflight | Preflight refused before any change"
# "info" is dockerd's default level: the key changes daemon.json (so the docker role would act) but were it
# ever merged, the engine would behave as before.
EXTRA_DAEMON_OPTION = {"log-level": "info"}
FOREIGN_PORT_OFFSET = 600  # above every lab rig's serving port (the catalogue test uses +500)

L2_MOUNT_POINT = next(v.default for v in L2_DISK_VARIABLES if v.name == "l2_mount_point")
# What any role would change: files (daemon.json, fstab, the stack, the ledger, the janitor unit), the engine
# (a restart changes its pid), containers (a restart changes StartedAt), images, the L2 mount.
SNAPSHOT = (
    "cd / && sha256sum etc/docker/daemon.json etc/fstab etc/rigkit/stack/* etc/rigkit/stack/.env "
    "var/lib/rigkit/ledger.json var/lib/rigkit/release.sha256 "
    "etc/systemd/system/rigkit-l2-janitor.service 2>&1; "
    "systemctl show -p MainPID -p ActiveEnterTimestamp docker; "
    "docker inspect --format '{{.Id}} {{.Image}} {{.State.StartedAt}}' $(docker ps -aq) 2>&1 | sort; "
    f"docker images -q --no-trunc | sort; findmnt -n -o SOURCE,OPTIONS {L2_MOUNT_POINT}"
)


def daemon_change_arg() -> str:
    lab_options = runpy.run_path(str(REPO_ROOT / "group_data" / "lab.py"))["docker_daemon_options"]
    return "docker_daemon_options=" + json.dumps({**lab_options, **EXTRA_DAEMON_OPTION})


def pyinfra(args: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    """pyinfra on the lab inventory; without -y (a --dry run with -y skips change detection)."""
    return subprocess.run(
        [pyinfra_executable(), *args, str(LAB_INVENTORY), "deploy.py"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def detected_change(output: str, operation: str) -> list[str]:
    """The Change and Conditional Change cells of ``operation`` in a --dry run's "Detected changes" table."""
    table = output.split("--> Detected changes:", 1)[1]
    (row,) = [line for line in table.splitlines() if operation in line]
    return row.split(operation, 1)[1].split()[:2]


@pytest.fixture(scope="module")
def rig(lab, deployed, rig_exec):
    """A deployed host-network rig on which the daemon.json option alone would change something."""
    rigs = [r for r in lab.rigs if not r.netns]
    if not rigs:
        pytest.skip("needs a host-network rig")
    rig = rigs[0]
    dry = pyinfra(["--dry", "--limit", rig.name, "--data", daemon_change_arg()])
    assert dry.returncode == 0, dry.stdout[-4000:] + dry.stderr[-2000:]
    assert detected_change(dry.stdout + dry.stderr, "docker | Merge rigkit's options into daemon.json") == [
        "1",
        f"({rig.name})",
    ]
    return rig


def started_operations(output: str) -> list[str]:
    marker = "--> Starting operation:"
    return [line.split(marker, 1)[1].strip() for line in output.splitlines() if marker in line]


def stack_models(rig, rig_exec) -> list[str]:
    url = f"http://127.0.0.1:{rig.serving_port}/v1/models"
    out = rig_exec(
        rig,
        f"python3 -c 'import json,urllib.request; "
        f'print(json.dumps([m["id"] for m in json.load(urllib.request.urlopen("{url}"))["data"]]))\'',
    )
    return json.loads(out.stdout)


def free_port(port: int) -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))  # OSError: taken on the shared loopback; the test cannot use it
    return port


def start_foreign_listener(rig, rig_exec, port: int) -> int:
    """A real process that is not rigkit's stack listening on ``port`` inside the rig; its pid."""
    pid = int(rig_exec(rig, f"nohup python3 -m http.server --bind 127.0.0.1 {port} >/dev/null 2>&1 & echo $!").stdout)
    rig_exec(
        rig, f"for i in $(seq 100); do grep -q ':{port:04X} .* 0A ' /proc/net/tcp && exit 0; sleep 0.1; done; exit 1"
    )
    return pid


@pytest.mark.parametrize("case", ["ram-gate", "port-in-use"])
def test_refused_before_any_role_changes_the_rig(rig, rig_exec, run_pyinfra, case):
    listener = None
    if case == "ram-gate":  # cpu-lab has no L1: the reserve alone is over what the rig has free
        data, field, expected = ["ram_reserve_gb=4000"], "ram_reserve_gb=4000", "MemAvailable"
    else:
        port = free_port(rig.serving_port + FOREIGN_PORT_OFFSET)
        listener = start_foreign_listener(rig, rig_exec, port)
        data, field, expected = [f"serving_port={port}"], f"serving_port={port}", f"in use by pid {listener} (python3)"
    before = rig_exec(rig, SNAPSHOT, check=False).stdout
    try:
        result = pyinfra(
            [
                "-y",
                "--limit",
                rig.name,
                "--data",
                daemon_change_arg(),
                *[arg for item in data for arg in ("--data", item)],
            ]
        )
    finally:
        if listener is not None:
            rig_exec(rig, f"kill {listener}", check=False)
    output = result.stdout + result.stderr
    try:
        assert result.returncode != 0, output[-4000:]
        assert field in output and expected in output and "Fix:" in output, output[-4000:]
        # the only operation pyinfra started is the refusal, and it ran nothing on the rig
        assert started_operations(output) == [REFUSAL_STEP], output[-4000:]
        assert f"[{rig.name}] Error: executed 0 commands" in output and f"[{rig.name}] Success" not in output
        assert rig_exec(rig, SNAPSHOT, check=False).stdout == before
        assert stack_models(rig, rig_exec) == ["tiny"]
    except AssertionError:
        run_pyinfra(["--limit", rig.name], deploy="deploy.py")  # re-converge the rig for the tests after this one
        raise
