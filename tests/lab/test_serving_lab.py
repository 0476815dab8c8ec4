"""The serving stack end to end on real lab rigs: deploy by digest, no-op re-run, env passthrough.
Upgrade and rollback with the registry stopped: tests/lab/test_rollback_rendering_lab.py.

The API binds each rig's loopback, so the tests reach it as the controller does: through the SSH
tunnel (rigkit.remote.tunnel.serving_url) with the inventory's host data; a rig in its own network
namespace is reachable no other way. `deployed` (tests/lab/conftest.py) deploys once per session."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import requests
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Directory, File, Sha1File

from rigkit.facts.apt import AptHeldPackages
from rigkit.facts.batch import FactBatch, FactSpec, _shell_text
from rigkit.facts.serving import ENGINE_API_SCRIPT, ServingEngine
from rigkit.facts.surveyed import service_reads
from rigkit.files.l2_janitor import L2_JANITOR_UNIT
from rigkit.lab.pyinfra_output import parse_results
from rigkit.paths import RIG_STACK_DIR
from rigkit.remote.tunnel import serving_url
from rigkit.serving.ledger import LEDGER_PATH
from rigkit.serving.render import COMPOSE_FILE_NAME, CONTAINER_NAME, STACK_NAME
from rigkit.settings.knobs import KNOBS_BY_NAME

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

DEPLOYS = Path(__file__).parent / "deploys"

BIND_ADDRESS = KNOBS_BY_NAME["bind_address"].default


def grand_total(result):
    results = parse_results(result.stdout + result.stderr)  # captured, pyinfra writes the table to stderr
    assert "Grand total" in results, result.stdout[-3000:] + result.stderr[-3000:]
    return results["Grand total"]


def assert_ok(result):
    assert result.returncode == 0, f"pyinfra failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"


def serving_release(rig, rig_exec) -> str:
    labels = json.loads(rig_exec(rig, f"docker inspect --format '{{{{json .Config.Labels}}}}' {CONTAINER_NAME}").stdout)
    return labels.get("org.rigkit.release", "")


def models(rig, lab_host_data) -> list[str]:
    with serving_url(lab_host_data[rig.name], bind=BIND_ADDRESS, port=rig.serving_port) as url:
        response = requests.get(f"{url}/v1/models", timeout=10)
    response.raise_for_status()
    return [m["id"] for m in response.json()["data"]]


def ledger(rig, rig_exec) -> list[dict]:
    return json.loads(rig_exec(rig, f"cat {LEDGER_PATH}").stdout)["releases"]


def test_release_1_serves_on_every_rig(lab, deployed, rig_exec, lab_host_data):
    for rig in lab.rigs:
        assert models(rig, lab_host_data) == ["tiny"]
        assert serving_release(rig, rig_exec) == "1"
        entries = ledger(rig, rig_exec)
        assert entries[-1]["image"] == lab.serving_image["releases"]["1"]
        assert entries[-1]["smoke"] == "pass", entries[-1]


def test_second_run_changes_nothing(lab, deployed, run_pyinfra, rig_exec):
    before = {
        rig.name: rig_exec(rig, f"docker inspect --format '{{{{.Id}}}}' {CONTAINER_NAME}").stdout for rig in lab.rigs
    }
    result = run_pyinfra(deploy="deploy.py")
    assert_ok(result)
    total = grand_total(result)
    assert total.success == 0 and total.error == 0, result.stdout[-4000:]
    after = {
        rig.name: rig_exec(rig, f"docker inspect --format '{{{{.Id}}}}' {CONTAINER_NAME}").stdout for rig in lab.rigs
    }
    assert before == after  # same containers: nothing was restarted


def test_the_engine_api_and_the_docker_cli_read_the_engine_alike(lab, deployed, rig_exec):
    """ServingEngine reads a rig's engine through its API in one process, and through the docker CLI where the
    CLI would use a context: on a real engine with several tagged images, both read the same."""
    rig = lab.rigs[0]
    image = lab.serving_image["releases"]["1"]
    tags = ["rigkit-test/engine-read:a", "rigkit-test/engine-read:b"]
    rig_exec(rig, "; ".join(f"docker tag {image} {tag}" for tag in tags))
    # the same engine, named by a context: the CLI reads it, the API script leaves it
    rig_exec(rig, "docker context create rigkit-test --docker host=unix:///var/run/docker.sock >/dev/null")
    try:
        for pinned in (image, image[:-4] + "0000"):
            command = ServingEngine().command(image=pinned, stack=STACK_NAME)
            api = rig_exec(rig, f"python3 -c {shlex.quote(ENGINE_API_SCRIPT)} end {shlex.quote(pinned)} x=y")
            assert api.returncode == 0 and api.stdout  # the API path itself answers, no fallback
            by_api = ServingEngine().process(rig_exec(rig, command).stdout.splitlines())
            by_cli = ServingEngine().process(rig_exec(rig, f"DOCKER_CONTEXT=rigkit-test {command}").stdout.splitlines())
            print(f"{pinned[-8:]}: API {by_api['engine']}, {by_api['local_images']}, present {by_api['image_present']}")
            # an image's tags come in no fixed order from the CLI (a map in docker/cli's image formatter)
            assert sorted(by_api.pop("local_images")) == sorted(by_cli.pop("local_images"))
            assert by_api == by_cli
            assert by_api["image_present"] is (pinned == image) and by_api["stack_containers"]
    finally:
        rig_exec(rig, f"docker context rm -f rigkit-test >/dev/null; docker rmi {' '.join(tags)} >/dev/null")


def test_joined_facts_read_a_real_rig_as_each_fact_alone(lab, deployed, rig_exec):
    """One stat, one sha1sum, one systemctl and one dpkg-query for every path, unit and package fact
    (rigkit.facts.joined) give each fact what its own command gives on a real rig: systemd's real output (an alias,
    a unit that does not exist) and the rig's real dpkg database (its held docker packages) included."""
    rig = lab.rigs[0]
    units = ["docker.service", L2_JANITOR_UNIT, "rigkit-no-such.service", "dbus-org.freedesktop.hostname1.service"]
    stack = f"{RIG_STACK_DIR}/{COMPOSE_FILE_NAME}"
    paths = [RIG_STACK_DIR, stack, f"{RIG_STACK_DIR}/.env", "/etc/fstab", "/etc/os-release", "/rigkit-no-such-path"]
    specs = [spec for unit in units for spec in service_reads(unit)]
    specs += [FactSpec.of(fact, path=path) for path in paths for fact in (File, Directory, Sha1File)]
    specs += [FactSpec.of(DebPackages), FactSpec.of(AptHeldPackages)]
    batch = FactBatch()
    script = batch.command(facts=tuple(specs))
    assert script.count("systemctl show") == 1 and script.count("sha1sum") == 1 and script.count("dpkg-query -W") == 1

    joined = batch.process(rig_exec(rig, ["sh", "-c", script]).stdout.splitlines())

    alone = {}
    for spec in specs:
        fact = spec.fact()
        lines = rig_exec(rig, ["sh", "-c", _shell_text(fact.command(**dict(spec.kwargs)))]).stdout.splitlines()
        alone[spec] = fact.process(lines) if lines else fact.default()
    assert joined == alone
    print(f"{len(specs)} facts: {sum(1 for value in joined.values() if value)} found on {rig.name}")
    assert joined[service_reads("docker.service")[0]] == {"docker.service": True}
    assert joined[FactSpec.of(File, path=stack)]["size"] > 0
    assert "docker.io" in joined[FactSpec.of(AptHeldPackages)] and "docker.io" in joined[FactSpec.of(DebPackages)]


def test_held_packages_are_read_as_apt_mark_names_them(lab, deployed, rig_exec):
    """AptHeldPackages reads dpkg's database, not apt: on a real rig it names what `apt-mark showhold` names, a
    Multi-Arch: same library held by hand included."""
    rig = lab.rigs[0]
    rig_exec(rig, "apt-mark hold libc6 >/dev/null")
    try:
        fact = AptHeldPackages()
        ours = fact.process(rig_exec(rig, ["sh", "-c", fact.command()]).stdout.splitlines())
        apts = set(rig_exec(rig, "apt-mark showhold").stdout.split())
    finally:
        rig_exec(rig, "apt-mark unhold libc6 >/dev/null")
    print(f"held on {rig.name}: {sorted(ours)}")
    assert ours == apts and "libc6" in ours


def test_a_file_changed_after_the_survey_is_put_right(lab, deployed, run_pyinfra, rig_exec):
    """The survey is read while the deploy is prepared; the file is changed after it, before the operations run:
    they read the rig as they run, upload the rendered compose.yml again, and leave the stack running."""
    rig = lab.rigs[0]
    compose = f"{RIG_STACK_DIR}/{COMPOSE_FILE_NAME}"
    rendered = rig_exec(rig, f"sha1sum < {compose}").stdout
    container = rig_exec(rig, f"docker inspect --format '{{{{.Id}}}}' {CONTAINER_NAME}").stdout
    result = run_pyinfra(args=["--limit", rig.name], deploy=DEPLOYS / "change_after_survey.py")
    assert_ok(result)
    assert parse_results(result.stdout + result.stderr)["serving | Render compose.yml"].success == 1
    assert grand_total(result).success == 1, result.stdout[-4000:]
    assert rig_exec(rig, f"sha1sum < {compose}").stdout == rendered
    assert rig_exec(rig, f"docker inspect --format '{{{{.Id}}}}' {CONTAINER_NAME}").stdout == container
    again = run_pyinfra(args=["--limit", rig.name], deploy="deploy.py")
    assert_ok(again)
    assert grand_total(again).success == 0, again.stdout[-4000:]


def test_declared_knobs_reach_the_container(lab, deployed, rig_exec):
    rig = lab.rigs[0]
    env = dict(
        line.split("=", 1)
        for line in rig_exec(rig, f"docker exec {CONTAINER_NAME} env").stdout.splitlines()
        if "=" in line
    )
    assert env["RIGKIT_SERVING_PORT"] == str(rig.serving_port)
    assert env["RIGKIT_SERVED_MODEL_NAME"] == "tiny"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    mode = rig_exec(rig, "stat -c %a /etc/rigkit/stack/.env").stdout.strip()
    assert mode == "600"
