"""One rig judged: a rig just deployed reads clean; a stopped or restarting container, an engine that does not answer,
a janitor down are unhealthy; leftover shared memory and restarts are warnings.

Each case runs the real script on a rig made on this machine (tests/status_sandbox.py).
"""

from __future__ import annotations

import threading
from socketserver import ThreadingUnixStreamServer

import pytest
from status_sandbox import IMAGE_1, Models, api_port, made_up_inspect, rig  # noqa: F401

from rigkit.serving.commands import rendering_for
from rigkit.status.report import exit_status
from rigkit.status.rig import OK, UNHEALTHY
from tests.facts.test_serving import CONTAINERS, StandInEngine


def test_a_rig_just_deployed_reads_clean(rig):
    status = rig.status()
    assert status.state == OK, (status.drift, status.unhealthy, status.warnings)
    assert status.drift == [] and status.unhealthy == []
    assert status.health == {"engine": "ok", "container": "ok", "api": "ok"}
    assert status.image == IMAGE_1
    assert (status.driver, status.cuda) == ("580.159.04", "13.0")
    assert status.ledger["kind"] == "deploy" and status.ledger["smoke"] == "pass"
    assert status.ledger["deployed_at"] == "2026-12-01T12:30:05+00:00"
    assert status.l2["store_bytes"] >= 4096 and status.l2["budget_bytes"] == 500_000_000
    assert exit_status([status]) == 0


def test_a_stopped_container_is_unhealthy_and_its_leftover_segments_are_named(rig):
    (rig.shm / "psm_3f2a1b").write_bytes(b"\0" * 1024)
    (rig.shm / "unrelated-app").write_bytes(b"\0")
    running = rig.status()
    assert running.shm_leftovers == [] and running.state == OK  # a running stack's segments are in use
    rig.inspect(made_up_inspect(IMAGE_1, rendering_for(rig.stack).container_env(), False, rig.labels))
    Models.served = []
    try:
        status = rig.status()
    finally:
        Models.served = ["tiny"]
    assert status.state == UNHEALTHY
    assert status.health["container"] == "rigkit-serving exited"
    assert status.health["api"].startswith("/v1/models lists []")
    assert status.shm_leftovers == [{"name": "psm_3f2a1b", "bytes": 1024}]
    assert exit_status([status]) == 1


@pytest.mark.parametrize(
    ("stopped", "running"),
    [
        # the H200 leak: native-tiered's CPU tier (/dev/shm/vllm_offload_<id>.mmap) stays after every stop
        ("vllm_offload_stopped.mmap", "vllm_offload_running.mmap"),
        # issue 43: every engine start left a multiprocessing semaphore that nothing reported or cleaned
        ("sem.mp-left1", "sem.mp-inuse"),
    ],
)
def test_a_stopped_engines_file_is_named_while_the_stack_runs_and_a_mapped_one_is_not(rig, stopped, running):
    """A file of STALE_SHM_GLOBS no process maps is reported while the stack runs too; one a process maps (a running
    engine's) never is, nor any other file of /dev/shm."""
    import mmap

    (rig.shm / stopped).write_bytes(b"\0" * 4096)
    (rig.shm / "someone-elses").write_bytes(b"\0" * 32)
    mapped = rig.shm / running
    mapped.write_bytes(b"\0" * 4096)
    with open(mapped, "r+b") as f, mmap.mmap(f.fileno(), 4096):
        status = rig.status()
    assert status.shm_leftovers == [{"name": stopped, "bytes": 4096}]
    assert status.state == OK and any("files of stopped engines" in w for w in status.warnings)


def test_a_restarting_container_is_unhealthy_and_restarts_are_a_warning(rig):
    inspected = made_up_inspect(IMAGE_1, rendering_for(rig.stack).container_env(), True, rig.labels)
    inspected[0]["RestartCount"] = 3
    rig.inspect(inspected)
    status = rig.status()
    assert status.state == OK and any("restarted 3 times" in w for w in status.warnings)
    inspected[0]["State"]["Status"] = "restarting"  # docker says Running while it restarts
    rig.inspect(inspected)
    assert rig.status().health["container"] == "rigkit-serving restarting"


def test_an_engine_that_does_not_answer_is_unhealthy(rig):
    rig.tool("docker", 'echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock." >&2; exit 1')
    status = rig.status()
    assert status.health["engine"].startswith("docker does not answer: Cannot connect")
    assert status.health["container"] == "unknown" and status.state == UNHEALTHY


def test_a_janitor_down_is_unhealthy(rig):
    rig.tool("systemctl", "echo inactive")
    status = rig.status()
    assert status.state == UNHEALTHY and any("janitor" in p for p in status.unhealthy)


def test_the_engine_and_its_containers_are_read_through_its_api(rig, tmp_path):
    """The engine section reads the engine through its API on the rig's socket, as the survey does: here a stand-in
    engine answering as a real Docker 20.10 did (tests/facts/test_serving.py), whose container is not the stubbed
    CLI's, so the image read is the API's."""
    path = tmp_path / "engine.sock"
    server = ThreadingUnixStreamServer(str(path), StandInEngine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    rig.docker_host = f"unix://{path}"
    try:
        status = rig.status()
    finally:
        server.shutdown()
        server.server_close()
    assert status.health["engine"] == "ok"
    assert status.image == CONTAINERS[0]["Config"]["Image"] != IMAGE_1
