"""One deploy.py run converges a rig with no Docker at all (the promise: one command per fleet).

The lab's rig image ships docker.io + docker-compose, so every other lab test starts with an engine. Here
one host-network rig loses its Docker the way a fresh host lacks it: the stack is taken down, then
docker.io, docker-compose and everything apt installed only for them are removed and purged (the
engine's image store under /var/lib/docker is kept, so the release image need not be pulled again).
A single deploy.py run must then install the engine (docker role), pass the engine checks it could not
make while the deploy was prepared, release the stack and record a passing smoke; a second run changes
nothing. The rig ends serving release 1 with the lab's group data, as `deployed` left it.
"""

from __future__ import annotations

import json

import pytest
import requests

from rigkit.lab import rig_image
from rigkit.lab.pyinfra_output import parse_results
from rigkit.paths import RIG_STACK_DIR
from rigkit.remote.tunnel import serving_url
from rigkit.serving.ledger import LEDGER_PATH
from rigkit.serving.render import COMPOSE_PROJECT, CONTAINER_NAME
from rigkit.settings.knobs import KNOBS_BY_NAME

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

FRESH_RIG = "rig2"  # on host networking: its apt reaches the Debian mirror as the host does (Debian 13 in the suite)
DEPLOY_TIMEOUT_S = 1800


def engine_packages(rig) -> tuple[str, ...]:
    """What the rig image installed for the engine (rigkit/lab/rig_image.py): Debian 13 adds docker-cli."""
    return ("docker.io", "docker-compose") + rig_image.EXTRA_PACKAGES[rig.distro]


def remove_docker(rig) -> str:
    """Remove (prerm saves the engine's "nuke" script into /var/lib/docker), drop that script so the purge
    keeps the image store, then purge every package left with its configuration ("rc"): no trace of them."""
    packages = " ".join(engine_packages(rig))
    down = f"{COMPOSE_PROJECT} down --remove-orphans"
    return (
        f"cd {RIG_STACK_DIR} && {{ docker compose -p {down} || docker-compose -p {down}; }}; "
        "systemctl stop docker.socket docker.service containerd.service; "
        f"apt-mark unhold {packages} >/dev/null; "
        f"DEBIAN_FRONTEND=noninteractive apt-get remove -y -q --autoremove {packages} && "
        "rm -f /var/lib/docker/nuke-graph-directory.sh && "
        "dpkg --purge $(dpkg -l | awk '/^rc/ {print $2}')"
    )


def grand_total(result):
    results = parse_results(result.stdout + result.stderr)  # captured: pyinfra writes the table to stderr
    assert "Grand total" in results, result.stdout[-3000:] + result.stderr[-3000:]
    return results["Grand total"]


def deploy_rig(run_pyinfra, rig):
    result = run_pyinfra(args=["--limit", rig.name], deploy="deploy.py", timeout=DEPLOY_TIMEOUT_S)
    assert result.returncode == 0, f"pyinfra failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    return result


def served_models(rig, lab_host_data) -> list[str]:
    with serving_url(lab_host_data[rig.name], bind=KNOBS_BY_NAME["bind_address"].default, port=rig.serving_port) as url:
        response = requests.get(f"{url}/v1/models", timeout=10)
    response.raise_for_status()
    return [model["id"] for model in response.json()["data"]]


def release_label(rig, rig_exec) -> str:
    labels = rig_exec(rig, f"docker inspect --format '{{{{json .Config.Labels}}}}' {CONTAINER_NAME}").stdout
    return json.loads(labels).get("org.rigkit.release", "")


def ledger(rig, rig_exec) -> list[dict]:
    return json.loads(rig_exec(rig, f"cat {LEDGER_PATH}").stdout)["releases"]


def has_engine(rig, rig_exec) -> bool:
    return rig_exec(rig, "command -v docker && docker info >/dev/null 2>&1", check=False).returncode == 0


@pytest.fixture
def fresh_rig(lab, deployed, run_pyinfra, rig_exec):
    """rig2 with its Docker removed; afterwards it serves release 1 again whatever the test did."""
    rig = next(rig for rig in lab.rigs if rig.name == FRESH_RIG)
    assert not rig.netns, f"{rig.name} must share the host network (apt reaches the mirror there)"
    assert release_label(rig, rig_exec) == "1", "the session's deploy left another release on the rig"
    rig_exec(rig, remove_docker(rig), timeout=600)
    yield rig
    if (
        has_engine(rig, rig_exec)
        and rig_exec(rig, f"docker ps -q --filter name={CONTAINER_NAME}", check=False).stdout.strip()
    ):
        return
    # the test failed half way: give the rig back its engine (as the rig image had it) and converge it
    rig_exec(
        rig,
        f"DEBIAN_FRONTEND=noninteractive apt-get install -y -q {' '.join(engine_packages(rig))}",
        check=False,
        timeout=900,
    )
    deploy_rig(run_pyinfra, rig)


def test_one_deploy_converges_a_rig_without_docker(lab, fresh_rig, run_pyinfra, rig_exec, lab_host_data):
    rig = fresh_rig
    assert not has_engine(rig, rig_exec), rig_exec(rig, "command -v docker", check=False).stdout
    installed = rig_exec(
        rig,
        f"dpkg-query -W -f '${{Package}} ${{db:Status-Status}}\\n' "
        f"{' '.join(engine_packages(rig))} containerd runc 2>/dev/null",
        check=False,
    ).stdout
    assert " installed" not in installed, installed
    entries_before = len(ledger(rig, rig_exec))

    first = grand_total(deploy_rig(run_pyinfra, rig))
    assert first.error == 0 and first.success > 0

    assert has_engine(rig, rig_exec)
    assert set(engine_packages(rig)) <= set(rig_exec(rig, "apt-mark showhold").stdout.split())
    assert "bridge" not in rig_exec(rig, "docker network ls --format '{{.Driver}}'").stdout.split()
    assert served_models(rig, lab_host_data) == ["tiny"]
    assert release_label(rig, rig_exec) == "1"
    entries = ledger(rig, rig_exec)
    assert len(entries) == entries_before + 1, entries[entries_before - 1 :]
    assert entries[-1]["image"] == lab.serving_image["releases"]["1"]
    assert entries[-1]["smoke"] == "pass", entries[-1]

    container = rig_exec(rig, f"docker inspect --format '{{{{.Id}}}}' {CONTAINER_NAME}").stdout
    second = grand_total(deploy_rig(run_pyinfra, rig))
    assert (second.success, second.error) == (0, 0), second
    assert rig_exec(rig, f"docker inspect --format '{{{{.Id}}}}' {CONTAINER_NAME}").stdout == container
