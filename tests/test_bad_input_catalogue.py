"""The bad-input catalogue (docs/bad-input-catalogue.md): its rows point at tests that exist, and the rows
no other unit test covers are tested here (registry probe and port-in-use preflights, their facts)."""

from __future__ import annotations

import re
import socket
import subprocess

import pytest

from rigkit.errors import ConfigError
from rigkit.facts.docker import ManifestProbe
from rigkit.facts.server import PortListeners
from rigkit.paths import REPO_ROOT
from rigkit.preflight import HostFacts, preflight, refusals
from rigkit.settings.hostdata import rig_settings, settings_for_host
from rigkit.settings.sizing import GB

CATALOGUE = REPO_ROOT / "docs" / "bad-input-catalogue.md"
ISSUE_ROWS = (
    "tag",
    "digest",
    "RAM gate",
    "mem_limit",
    "shm",
    "NVMe path",
    "formatted",
    "adapter JSON",
    "unknown knob",
    "newline or NUL",
    "port",
    "incubating",
    "GPU profile",
    "SSH key",
    # issue 10: every value a user can set
    "NaN",
    "fraction",
    "None",
    "tuple",
    "empty model",
    "image reference",
    "tag and digest",
    "GPU twice",
    "system directory",
    "mount options",
    "ExecStart",
    "U+2028",
    "IPv6",
    "homoglyph",
    "as a dict",
    # issue 13: the engine settings
    "engine setting",
    "speculative config",
    "extra engine argument",
    "below `gpu_memory_utilization`",
    # issue 25: by class
    "number past its ceiling",
    "package repository URL",
    "apt version",
    "fstab source",
    "filesystem label",
    "IPv4-mapped",
    "address put in a URL",
    "Docker daemon option",
    "credential inside",
    "secret in a refusal",
    "allow-list",
    "max_model_len",
    "export spelled two ways",
    "profiles.yaml",
    "inventory with no hosts",
    "mistyped `--limit`",
    "more canaries",
    "plain pyinfra",
    # issue 43: commands that succeed at nothing, untyped inventory values, exposure, pins, vague refusals
    "not a `.py` file",
    "means nothing where it stands",
    "connection data rigkit reads itself",
    "two services of one machine",
    "wildcard address",
    "shared model under a system directory",
    "repository id with a space",
    "tampered file",
    'generic "write it on one line"',
    "unknown `--limit` host",
)
CPU_LAB = {
    "serving_profile": "cpu-lab",
    "serving_image": "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64,
    "serving_port": 8104,
}


def catalogue_rows() -> list[str]:
    return [line for line in CATALOGUE.read_text().splitlines() if line.startswith("| ") and "---" not in line][1:]


def test_every_issue_row_is_in_the_catalogue():
    rows = catalogue_rows()
    for needle in ISSUE_ROWS:
        assert any(needle.lower() in row.split("|")[1].lower() for row in rows), needle


def test_every_referenced_test_exists():
    for row in catalogue_rows():
        for reference in re.findall(r"`(tests/[^`]+)`", row):
            path, _, name = reference.partition("::")
            assert (REPO_ROOT / path).exists(), reference
            if name:
                function = name.split("[")[0]
                assert re.search(rf"^def {re.escape(function)}\(", (REPO_ROOT / path).read_text(), re.M), reference
                for case in re.findall(r"\[([^\]]+)\]", name):
                    assert f'"{case}"' in (REPO_ROOT / path).read_text(), reference


def facts(**changes) -> HostFacts:
    base = dict(
        meminfo={"MemAvailable": 20 * GB, "MemTotal": 24 * GB},
        l2_free_bytes=2 * GB,
        has_engine=True,
        compose_command="docker-compose",
        image_present=False,
        host_shm_bytes=2 * 2**30,
    )
    return HostFacts(**{**base, **changes})


def refusal(findings, check):
    (found,) = [f for f in refusals(findings) if f.check == check]
    return found


def test_digest_the_registry_does_not_serve():
    settings = settings_for_host(CPU_LAB, variables=[])
    answer = "no such manifest: 127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64
    found = refusal(preflight(settings, facts(image_probe_error=answer)), "image")
    assert found.field == "serving_image" and found.value == settings.image
    assert "no such manifest" in found.message and "rigkit resolve 127.0.0.1:5000/rigkit/vllm-cpu-tiny:TAG" in found.fix
    # an image the rig already has needs no registry at all (rollback with the registry down)
    assert not refusals(preflight(settings, facts(image_present=True, image_probe_error=answer)))


def test_port_in_use_by_something_else():
    settings = settings_for_host(CPU_LAB, variables=[])
    ours = "a" * 64
    other = {"pid": 4242, "containers": [], "command": "python3"}
    found = refusal(preflight(settings, facts(port_listeners=[other], stack_container_ids=(ours[:12],))), "port")
    assert found.field == "serving_port" and found.value == 8104
    assert "pid 4242 (python3)" in found.message and "serving_port" in found.fix
    outsider = refusal(preflight(settings, facts(port_listeners=[{"pid": None, "containers": []}])), "port")
    assert "outside the rig's view" in outsider.message


def test_port_held_by_our_own_stack_or_free_is_fine():
    settings = settings_for_host(CPU_LAB, variables=[])
    ours = "b" * 64
    listener = {"pid": 7, "containers": [ours], "command": "python"}
    assert not refusals(preflight(settings, facts(port_listeners=[listener], stack_container_ids=(ours[:12],))))
    assert not refusals(preflight(settings, facts(port_listeners=[])))
    # a stopped stack container does not own the port: its id is not passed as ours
    assert refusals(preflight(settings, facts(port_listeners=[listener], stack_container_ids=())))


def test_port_listeners_fact_finds_a_real_listener_on_this_machine():
    """The fact's script runs here for real: a socket this test opens on loopback is found with our pid."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        fact = PortListeners()
        command = fact.command(port)
        output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
        listeners = fact.process(output.splitlines())
    finally:
        server.close()
    import os

    assert [listener["pid"] for listener in listeners] == [os.getpid()]
    free = subprocess.run(["sh", "-c", PortListeners().command(port)], capture_output=True, text=True).stdout
    assert PortListeners().process(free.splitlines()) == []


def test_manifest_probe_reads_the_engine_answer():
    probe = ManifestProbe()
    assert probe.process(["available"]) is None
    assert probe.process(["missing no such manifest: r@sha256:ab"]) == "no such manifest: r@sha256:ab"
    assert "--insecure" in probe.command("127.0.0.1:5000/r@sha256:" + "1" * 64)
    assert "--insecure" not in probe.command("ghcr.io/x/y@sha256:" + "1" * 64)


STORY_RIG = {
    "serving_profile": "lmcache-mp",
    "allow_incubating": True,
    "gpus": 2,
    "model": "Qwen/Qwen3.6-27B-FP8",
    "serving_image": "lmcache/vllm-openai@sha256:" + "0" * 64,
    "tensor_parallel_size": 2,
    "l1_size_gb": 60,
    "mem_limit_gb": 110,
    "speculative_config": {"method": "mtp", "num_speculative_tokens": 3},
}


@pytest.mark.parametrize(
    "field, value, fix",
    [
        ("kv_cache_dtype", "int8", "int8_per_token_head"),
        ("gpu_memory_utilization", 1.2, "above 0 and at most 1"),
        (
            "speculative_config",
            '{"method": "mtp", "num_speculative_tokens": 3,}',
            "speculative decoding as a JSON object",
        ),
        ("extra_engine_args", ["--tensor-parallel-size", "4"], "set the knob that renders it"),
        ("extra_engine_args", ["--max-model", "4096"], "set the knob that renders it"),
    ],
)
def test_a_bad_engine_setting_stops_the_run_before_any_host(field, value, fix):
    # rig_settings is what deploy.py builds while pyinfra prepares: a refusal there stops the run with one line
    with pytest.raises(ConfigError) as caught:
        rig_settings({**STORY_RIG, field: value})
    line = str(caught.value)
    assert caught.value.field == field and line.startswith(f"{field}=") and fix in caught.value.fix
    assert (repr(value) if field != "extra_engine_args" else repr(value[0])) in line
