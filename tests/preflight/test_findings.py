"""What every gate reads and answers (rigkit.preflight.findings): HostFacts and Finding."""

from dataclasses import fields as dataclass_fields
from dataclasses import replace

import pytest

from rigkit.preflight.findings import Finding, HostFacts
from rigkit.survey import RigState
from tests.preflight.common import MIB


@pytest.mark.parametrize(
    "finding,text",
    [
        (Finding("refuse", "ram", "f", 1, "too little", "free memory"), "[refuse] ram: too little. Fix: free memory"),
        (Finding("warn", "l2", "f", 1, "little", "a larger disk"), "[warn] l2: little. Fix: a larger disk"),
        (Finding("refuse", "engine", "f", 1, "no engine"), "[refuse] engine: no engine."),  # no fix: none printed
        (Finding("ok", "ram", "f", 1, "enough", "never shown"), "[ok] ram: enough."),  # a pass needs no fix
    ],
    ids=["refusal", "warning", "refusal without a fix", "pass"],
)
def test_a_finding_reads_as_one_line(finding, text):
    assert str(finding) == text


def test_facts_from_the_rig_survey():
    """HostFacts.from_state: each gate's fact from the survey field that holds it (roles/preflight.py and
    roles/serving.py build the gates' facts this way)."""
    listeners = [{"pid": 7, "containers": [], "command": "nginx"}]
    stack_listeners = {"lmcache_port": [], "lmcache_http_port": listeners}
    state = RigState(
        **{
            **{field.name: None for field in dataclass_fields(RigState)},
            "meminfo": {"MemAvailable": 5, "MemTotal": 6},
            "shm_bytes": 64 * MIB,
            "shm_free": {"free_bytes": 1, "offload_bytes": 2},
            "l2_free_bytes": 123,
            "nvidia_smi_cli": "/usr/bin/nvidia-smi",
            "gpu_memory": ["0, 1, 2", "1, 3, 4"],
            "docker_cli": "/usr/bin/docker",
            "compose_command": "docker compose",
            "image_present": True,
            "port_listeners": listeners,
            "stack_port_listeners": stack_listeners,
            "stack_containers": [{"id": "aa", "running": True}, {"id": "bb", "running": False}],
        }
    )
    assert HostFacts.from_state(state) == HostFacts(
        meminfo={"MemAvailable": 5, "MemTotal": 6},
        l2_free_bytes=123,
        gpu_memory_csv="0, 1, 2\n1, 3, 4",
        has_engine=True,
        compose_command="docker compose",
        image_present=True,
        registry_reachable=None,
        host_shm_bytes=64 * MIB,
        host_shm_free={"free_bytes": 1, "offload_bytes": 2},
        image_probe_error=None,
        port_listeners=listeners,
        stack_port_listeners=stack_listeners,
        stack_container_ids=("aa",),
    )
    # no nvidia-smi: no GPU table (a stale one is not read); no docker CLI: no engine
    bare = replace(state, nvidia_smi_cli=None, docker_cli=None, image_present=False)
    facts_of_bare = HostFacts.from_state(bare)
    assert (facts_of_bare.gpu_memory_csv, facts_of_bare.has_engine, facts_of_bare.image_present) == (None, False, False)
    # a gate that reads a fact differently overrides it, the others stay the survey's
    overridden = HostFacts.from_state(state, gpu_memory_csv=None, l2_free_bytes=None, image_probe_error="denied")
    assert overridden == replace(
        HostFacts.from_state(state), gpu_memory_csv=None, l2_free_bytes=None, image_probe_error="denied"
    )
