"""The engine gates (rigkit.preflight.engine): Docker engine and compose, the image, the stack's ports."""

import pytest

from rigkit.preflight import Finding, engine_checks, refusals
from rigkit.preflight.engine import check_port
from rigkit.settings.hostdata import settings_for_host
from tests.preflight.common import CPU_LAB, IMAGE, LMCACHE, facts, run


def test_engine_and_compose_required():
    (engine,) = refusals(run(LMCACHE, has_engine=False))
    assert engine.field == "docker"
    (compose,) = refusals(run({**LMCACHE, "force": True}, compose_command=None))
    assert compose.field == "compose"


def test_image_must_be_present_or_pullable():
    assert refusals(run(LMCACHE, image_present=True, registry_reachable=False)) == []
    (image,) = refusals(run(LMCACHE, image_present=False, registry_reachable=False))
    assert image.field == "serving_image"


def test_lmcache_ports_are_preflighted_like_serving_port():
    nginx = [{"pid": 4242, "containers": [], "command": "nginx"}]
    (port,) = refusals(
        run(LMCACHE, port_listeners=[], stack_port_listeners={"lmcache_port": [], "lmcache_http_port": nginx})
    )
    assert (port.check, port.field, port.value) == ("port", "lmcache_http_port", 8080)
    assert "pid 4242 (nginx)" in port.message and "set lmcache_http_port to a free port" in port.fix
    # held by rigkit's own stack (the release replaces it): fine
    ours = [{"pid": 1, "containers": ["ab" * 32], "command": "python3"}]
    assert not refusals(
        run(
            LMCACHE,
            port_listeners=[],
            stack_container_ids=("abab",),
            stack_port_listeners={"lmcache_port": ours, "lmcache_http_port": ours},
        )
    )


# --- every finding word for word: level, field, value, the message with its numbers, the fix, forceable --------
# (an operator reads these before anything changed on the rig: a wrong number, field or fix is a wrong answer)


WORD_FOR_WORD = [
    # id, gate, data, the gate's arguments after the settings, its findings
    (
        "engine: none",
        engine_checks,
        LMCACHE,
        (facts(has_engine=False, compose_command=None),),
        [
            Finding(
                "refuse", "engine", "docker", None, "no Docker engine answers on the rig", "run the docker role first"
            ),
            Finding("ok", "image", "serving_image", IMAGE, "image will be pulled by digest"),
        ],
    ),
    (
        "engine: no compose; image on the rig",
        engine_checks,
        LMCACHE,
        (facts(compose_command=None, image_present=True, registry_reachable=False),),
        [
            Finding(
                "refuse",
                "engine",
                "compose",
                None,
                "neither `docker compose` nor `docker-compose`",
                "install the compose plugin (the docker role does)",
            ),
            Finding("ok", "image", "serving_image", IMAGE, "image already on the rig"),
        ],
    ),
    (
        "image: the registry does not serve the digest",
        engine_checks,
        LMCACHE,
        (facts(compose_command="docker-compose", image_probe_error="manifest unknown"),),
        [
            Finding("ok", "engine", "compose", "docker-compose", "docker and docker-compose present"),
            Finding(
                "refuse",
                "image",
                "serving_image",
                IMAGE,
                "registry docker.io answered that it does not serve this digest; the image is not on the rig "
                "(docker: manifest unknown)",
                "check the digest (`rigkit resolve lmcache/vllm-openai:TAG` prints the current one) and that the "
                "image was pushed to docker.io; a private repository answers the same to a rig without credentials "
                "(docker login on the rig)",
            ),
        ],
    ),
    (
        "image: not on the rig, registry unreachable",
        engine_checks,
        LMCACHE,
        (facts(registry_reachable=False),),
        [
            Finding("ok", "engine", "compose", "docker compose", "docker and docker compose present"),
            Finding(
                "refuse",
                "image",
                "serving_image",
                IMAGE,
                "image not on the rig and its registry is unreachable",
                "bring the registry back or deploy a digest the rig keeps (rollback)",
            ),
        ],
    ),
    (
        "port: every port free",
        check_port,
        LMCACHE,
        (facts(port_listeners=[], stack_port_listeners={"lmcache_port": [], "lmcache_http_port": []}),),
        [
            Finding("ok", "port", "serving_port", 8000, "port 8000 free or held by rigkit's stack"),
            Finding("ok", "port", "lmcache_port", 5555, "port 5555 free or held by rigkit's stack"),
            Finding("ok", "port", "lmcache_http_port", 8080, "port 8080 free or held by rigkit's stack"),
        ],
    ),
    (
        "port: two foreign listeners, one outside the rig's view",
        check_port,
        CPU_LAB,
        (
            facts(
                port_listeners=[
                    {"pid": 4242, "containers": [], "command": "nginx"},
                    {"pid": None, "containers": [], "command": None},
                ]
            ),
        ),
        [
            Finding(
                "refuse",
                "port",
                "serving_port",
                8000,
                "TCP port 8000 on the rig is already in use by pid 4242 (nginx), a process outside the rig's view",
                "stop what listens there (`ss -ltnp 'sport = :8000'` on the rig) or set serving_port to a free port",
            )
        ],
    ),
]


@pytest.mark.parametrize(
    "gate,data,args,expected", [case[1:] for case in WORD_FOR_WORD], ids=[case[0] for case in WORD_FOR_WORD]
)
def test_each_finding_word_for_word(gate, data, args, expected):
    assert gate(settings_for_host(data, variables=[]), *args) == expected
