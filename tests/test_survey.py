"""The rig survey (rigkit.survey): one round trip, each field what its fact reads alone, read once per run."""

from __future__ import annotations

import json
from pathlib import Path

from rigkit.facts.batch import FactBatch
from rigkit.settings.hostdata import rig_settings
from rigkit.settings.model_source import store_stamp
from rigkit.survey import NO_ENGINE, NOT_READ, SERVING_ENGINE, RigState, read_rig_state, state_from, survey_specs
from roles import Run

CPU_LAB = {
    "serving_profile": "cpu-lab",
    "model": "/models/tiny",
    "serving_port": 8101,
    "serving_image": "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64,
}
GPU_RIG = {
    "serving_profile": "native-offload",
    "model": "Qwen/Qwen3-8B",
    "gpus": 2,
    "l2_device": "/dev/nvme1n1",
    "serving_image": "vllm/vllm-openai@sha256:" + "2" * 64,
}


def counting(host, monkeypatch) -> list:
    reads: list = []
    real = host.get_fact

    def get_fact(fact, **kwargs):
        reads.append(fact)
        return real(fact, **kwargs)

    monkeypatch.setattr(host, "get_fact", get_fact)
    return reads


def test_the_survey_is_one_round_trip_and_each_field_is_what_its_fact_reads_alone(local_host, monkeypatch):
    settings = rig_settings(CPU_LAB)
    reads = counting(local_host, monkeypatch)
    state = read_rig_state(local_host, settings)
    assert reads == [FactBatch]
    alone = {
        field: local_host.get_fact(spec.fact, **dict(spec.kwargs)) for field, spec in survey_specs(settings).items()
    }
    assert state.os_release == alone["os_release"]["release_meta"] and state.os_release["ID"]
    assert state.meminfo.keys() == alone["meminfo"].keys() and state.meminfo["MemTotal"] == alone["meminfo"]["MemTotal"]
    for field in ("shm_bytes", "docker_cli", "compose_command"):
        assert getattr(state, field) == (alone[field] or type(getattr(state, field))()), field
    engine = alone[SERVING_ENGINE] or NO_ENGINE
    assert (state.engine, state.stack_containers) == (engine["engine"], engine["stack_containers"])
    # the engine lists images created in the same second in no fixed order (a shared engine tags several at once)
    assert sorted(state.local_images) == sorted(engine["local_images"])


def test_what_nothing_declared_asks_for_is_not_read():
    lab, gpu = survey_specs(rig_settings(CPU_LAB)), survey_specs(rig_settings(GPU_RIG))
    assert not {"l2_device", "l2_mount", "nvidia_smi", "gpu_memory", "pci_gpus"} & lab.keys()
    assert "l2_free_bytes" in lab and "l2_free_bytes" not in gpu  # cpu-lab's store is on L2; native-offload has none
    assert {"l2_device", "l2_mount", "nvidia_smi", "gpu_memory", "pci_gpus"} <= gpu.keys()
    assert dict(gpu["l2_device"].kwargs) == {"device": "/dev/nvme1n1"}
    provisioning_only = survey_specs(rig_settings({"docker_version": "26.1.5"}, needs_stack=False))
    assert dict(provisioning_only[SERVING_ENGINE].kwargs)["image"] is None  # no image to look for
    assert "port_listeners" not in provisioning_only


def test_unread_fields_hold_the_absent_value_and_an_image_needs_a_docker_cli():
    values = {
        "os_release": {"release_meta": {"ID": "debian"}},
        "meminfo": {},
        "shm_bytes": None,
        "docker_cli": None,
        SERVING_ENGINE: {**NO_ENGINE, "image_present": True},
        "compose_command": None,
    }
    state = state_from(values)
    assert isinstance(state, RigState) and state.os_release == {"ID": "debian"}
    assert state.image_present is False  # no docker CLI: nothing is in an image store
    assert state.pci_gpus == NOT_READ["pci_gpus"] and state.l2_device is None and state.local_images == []


def test_a_run_reads_the_survey_once(local_host, monkeypatch):
    settings, run = rig_settings(CPU_LAB), Run()
    reads = counting(local_host, monkeypatch)
    first = run.rig_state(settings)
    assert run.rig_state(settings) is first
    assert reads == [FactBatch]


def test_every_port_the_stack_listens_on_is_surveyed_in_the_same_round_trip():
    lmcache = {
        "serving_profile": "lmcache-mp",
        "allow_incubating": True,
        "model": "m",
        "gpus": 1,
        "serving_image": "lmcache/vllm-openai@sha256:" + "2" * 64,
        "lmcache_http_port": 9090,
    }
    specs = survey_specs(rig_settings(lmcache))
    assert dict(specs["port_listeners"].kwargs) == {"port": 8000}
    assert dict(specs["stack_port:lmcache_port"].kwargs) == {"port": 5555}
    assert dict(specs["stack_port:lmcache_http_port"].kwargs) == {"port": 9090}
    assert not any(key.startswith("stack_port:") for key in survey_specs(rig_settings(CPU_LAB)))
    values = {
        "os_release": {},
        "meminfo": {},
        "shm_bytes": None,
        "docker_cli": None,
        SERVING_ENGINE: None,
        "compose_command": None,
        "stack_port:lmcache_http_port": [{"pid": 7, "containers": [], "command": "nginx"}],
    }
    assert state_from(values).stack_port_listeners == {
        "lmcache_http_port": [{"pid": 7, "containers": [], "command": "nginx"}]
    }


def test_a_staged_model_source_is_read_in_the_survey_not_in_a_round_trip_of_its_own(local_host, monkeypatch, tmp_path):
    source = "controller:/srv/models/tiny@" + "b" * 64
    data = {**CPU_LAB, "model_source": source, "model_store_path": str(tmp_path)}
    data.pop("model")
    settings = rig_settings(data)
    stack = settings.declared_stack
    spec = survey_specs(settings)["staged_model"]
    assert dict(spec.kwargs) == {
        "revision_dir": stack.model_dir,
        "stamp": store_stamp(str(tmp_path), stack.model_source),
    }
    reads = counting(local_host, monkeypatch)
    assert read_rig_state(local_host, settings).staged_model is None  # nothing staged there
    Path(stack.model_dir).mkdir(parents=True)
    Path(store_stamp(str(tmp_path), stack.model_source)).write_text(json.dumps({"manifest": "m", "files": {"a": 1}}))
    assert read_rig_state(local_host, settings).staged_model == {"manifest": "m", "files": 1}
    assert reads == [FactBatch, FactBatch]
    assert "staged_model" not in survey_specs(rig_settings(CPU_LAB))  # vLLM loads `model` itself
