"""settings_for_host: host data -> Settings, every bad input refused naming its field."""

import pytest

from rigkit.errors import ConfigError
from rigkit.settings.defaults import ALL_VARIABLES
from rigkit.settings.hostdata import rig_settings, settings_for_host
from rigkit.settings.variables import Variable

LAB_IMAGE = "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64
LMCACHE_IMAGE = "lmcache/vllm-openai@sha256:" + "2" * 64
CPU_LAB = {
    "serving_profile": "cpu-lab",
    "serving_image": LAB_IMAGE,
    "serving_port": 8101,
    "ssh_hostname": "127.0.0.1",
    "ssh_port": 2201,
    "_sudo": False,
}
LMCACHE = {
    "serving_profile": "lmcache-mp",
    "allow_incubating": True,
    "serving_image": LMCACHE_IMAGE,
    "model": "Qwen/Qwen3-8B",
    "gpu_mask": "0,1",
}
NO_ROLES: list = []


def settings(data):
    return settings_for_host(data, variables=NO_ROLES)


def refused(data, variables=NO_ROLES) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        settings_for_host(data, variables=variables)
    return caught.value


def test_cpu_lab_settings():
    s = settings(CPU_LAB)
    assert s.profile.name == "cpu-lab" and s.image == LAB_IMAGE
    assert s.knobs["serving_port"] == 8101 and s.knobs["bind_address"] == "127.0.0.1"
    assert s.knobs["model"] == "/models/tiny" and s.knobs["served_model_name"] == "tiny"
    assert s.l1_gib == 0 and s.l2_active and s.gpu_ids == []
    assert s.knobs["mem_limit_gb"] == 6  # 0 L1 + 1 model + 5 headroom: what the lab measured working


def test_host_data_overrides_profile_defaults_and_derivations():
    s = settings({**LMCACHE, "l1_size_gb": 60, "l2_enabled": "1"})
    assert s.knobs["restart_policy"] == "no"  # the incubating profile's own default
    assert s.knobs["served_model_name"] == "Qwen/Qwen3-8B" and s.knobs["tensor_parallel_size"] == 2
    assert s.knobs["mem_limit_gb"] == 110
    assert s.l1_gib == 60 and s.l2_active and s.gpu_ids == [0, 1]
    assert settings({**LMCACHE, "restart_policy": "always"}).knobs["restart_policy"] == "always"


def test_knobs_hash_follows_every_value():
    base = settings(CPU_LAB).knobs_hash
    assert settings(CPU_LAB).knobs_hash == base
    assert settings({**CPU_LAB, "cpu_kvcache_space_gb": 2}).knobs_hash != base
    assert settings({**CPU_LAB, "serving_image": LAB_IMAGE.replace("1" * 64, "3" * 64)}).knobs_hash != base


def test_unknown_knob_refused_with_closest_name():
    error = refused({**CPU_LAB, "l1_size_gib": 60})
    assert error.field == "l1_size_gib" and "l1_size_gb" in error.fix


def test_role_variables_and_lab_keys_are_known():
    docker_version = Variable("docker_version", None, "pin", str)
    assert settings_for_host({**CPU_LAB, "docker_version": "20.10", "lab_rig": "rig1"}, variables=[docker_version])
    assert refused({**CPU_LAB, "docker_verison": "20.10"}, [docker_version]).fix.find("docker_version") >= 0


def test_every_declared_setting_is_accepted_by_default():
    data = {**CPU_LAB, **{v.name: v.default for v in ALL_VARIABLES if v.default is not None}}
    assert rig_settings(data).docker["docker_source"] == "docker-ce"
    assert rig_settings({**CPU_LAB, "validate_sessions": 5}).validation["validate_sessions"] == 5


def test_rig_settings_refuses_an_unknown_name_and_a_missing_profile_only_when_a_stack_is_needed():
    with pytest.raises(ConfigError, match="docker_verison"):
        rig_settings({**CPU_LAB, "docker_verison": "20.10"})
    assert rig_settings({"docker_version": "20.10"}, needs_stack=False).docker["docker_version"] == "20.10"
    with pytest.raises(ConfigError, match="serving_profile"):
        rig_settings({"docker_version": "20.10"})


def test_settings_for_another_image_keep_every_other_setting():
    rig = rig_settings({**CPU_LAB, "serving_port": 8123})
    other = LAB_IMAGE.replace("1" * 64, "3" * 64)
    rollback = rig.for_image(other)
    assert rollback.stack.image == other and rollback.stack.knobs["serving_port"] == 8123
    assert rollback.sections == rig.sections


def test_a_secret_comes_from_the_controller_environment_unless_host_data_sets_it(monkeypatch):
    monkeypatch.setenv("RIGKIT_HF_TOKEN", "hf_from_the_environment")
    assert settings(CPU_LAB).knobs["hf_token"] == "hf_from_the_environment"
    assert settings({**CPU_LAB, "hf_token": "hf_from_data"}).knobs["hf_token"] == "hf_from_data"
    monkeypatch.delenv("RIGKIT_HF_TOKEN")
    assert settings(CPU_LAB).knobs["hf_token"] is None


def test_a_retired_knob_is_refused_with_the_reason_it_went():
    error = refused({**CPU_LAB, "shm_size_gb": 64})
    assert error.field == "shm_size_gb" and "ipc: host" in error.problem and "remove shm_size_gb" in error.fix


def test_tag_image_refused_with_digest_form_and_resolve_hint():
    error = refused({**CPU_LAB, "serving_image": "127.0.0.1:5000/rigkit/vllm-cpu-tiny:release-1"})
    assert error.field == "serving_image"
    assert "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:<64 hex>" in error.fix and "rigkit resolve" in error.fix


def test_profile_without_image_needs_serving_image():
    data = {k: v for k, v in CPU_LAB.items() if k != "serving_image"}
    error = refused(data)
    assert error.field == "serving_image" and "rigkit resolve 127.0.0.1:5000/rigkit/vllm-cpu-tiny:TAG" in error.fix


def test_incubating_profile_needs_opt_in():
    error = refused({**LMCACHE, "allow_incubating": False})
    assert error.field == "serving_profile" and "allow_incubating" in error.fix


def test_profile_must_be_chosen_and_exist():
    assert refused({"serving_image": LAB_IMAGE}).field == "serving_profile"
    error = refused({**CPU_LAB, "serving_profile": "cpu-labs"})
    assert error.field == "serving_profile" and "cpu-lab" in error.fix


def test_malformed_l2_adapter_json_refused():
    error = refused({**LMCACHE, "l2_adapter_json": '{"type": "fs", "base_path": }'})
    assert error.field == "l2_adapter_json" and "column" in error.problem


@pytest.mark.parametrize("field", ["served_model_name", "model", "l2_path", "hf_token"])
def test_newline_in_a_value_refused(field):
    error = refused({**CPU_LAB, field: "/x\ny"})
    assert error.field == field


def test_secret_never_echoed():
    error = refused({**CPU_LAB, "hf_token": "hf_secret\nvalue"})
    assert "hf_secret" not in str(error)


def test_mem_limit_below_l1_plus_model_refused():
    error = refused({**LMCACHE, "l1_size_gb": 60, "mem_limit_gb": 70})
    assert error.field == "mem_limit_gb" and "110" in error.fix


def test_gpu_mask_smaller_than_the_profile_needs():
    from rigkit.settings.profiles import load_profiles

    profiles = load_profiles()
    bigger = profiles["native-offload"].model_copy(
        update={"resources": profiles["native-offload"].resources.model_copy(update={"gpus": 2})}
    )
    with pytest.raises(ConfigError) as caught:
        settings_for_host(
            {
                "serving_profile": "native-offload",
                "serving_image": "vllm/vllm-openai@sha256:" + "4" * 64,
                "model": "m",
                "gpu_mask": "0",
            },
            profiles={"native-offload": bigger},
            variables=NO_ROLES,
        )
    assert caught.value.field == "gpu_mask"


def test_model_required_when_the_profile_has_none():
    data = {k: v for k, v in LMCACHE.items() if k != "model"}
    assert refused(data).field == "model"


@pytest.mark.parametrize(
    "field, value",
    [
        ("model", ("Qwen/Qwen3-8B",)),
        ("l1_size_gb", None),
        ("serving_port", None),
        ("l1_size_gb", 60.7),
        ("l2_budget_gb", float("nan")),
        ("served_model_name", ""),
        ("serving_profile", None),
    ],
)
def test_bad_values_refused_before_any_host(field, value):
    error = refused({**LMCACHE, field: value})
    assert error.field == field


def test_l2_adapter_json_from_a_dict_as_pyinfra_data_gives_it():
    s = settings({**LMCACHE, "l2_adapter_json": {"type": "fs", "base_path": "/kv-store"}})
    assert s.knobs["l2_adapter_json"] == '{"type":"fs","base_path":"/kv-store"}'


def test_unknown_name_with_a_homoglyph_is_escaped_and_gets_the_real_name():
    error = refused({**CPU_LAB, "l1_s\u0456ze_gb": 60}, ALL_VARIABLES)
    assert str(error).isascii() and "l1_s\\u0456ze_gb" in str(error)
    assert error.fix == "did you mean 'l1_size_gb'?"


def test_an_unrelated_unknown_name_gets_no_false_suggestion():
    error = refused({**CPU_LAB, "driver_sessions": 3}, ALL_VARIABLES)  # ratio 0.69 to validate_sessions
    assert "did you mean" not in error.fix and "nvidia_ctk_version" in error.fix  # listed, not suggested


@pytest.mark.parametrize("token", [("hf_secret",), ["hf_secret"], "hf_secret" * 1000])
def test_secret_never_echoed_whatever_its_type(token):
    assert "hf_secret" not in str(refused({**CPU_LAB, "hf_token": token}))


def test_a_gpu_mask_naming_a_gpu_twice_is_refused():
    error = refused({**LMCACHE, "gpu_mask": "0,0"})
    assert error.field == "gpu_mask" and "GPU 0 more than once" in error.problem


@pytest.mark.parametrize("mask, tensor_parallel", [("0", 2), ("0,1", 4)])
def test_tensor_parallel_wider_than_the_mask_is_refused(mask, tensor_parallel):
    error = refused({**LMCACHE, "gpu_mask": mask, "tensor_parallel_size": tensor_parallel})
    assert error.field == "tensor_parallel_size" and f"at most {len(mask.split(','))}" in error.fix


def test_tensor_parallel_within_the_mask_is_fine():
    assert settings({**LMCACHE, "gpu_mask": "0,1", "tensor_parallel_size": 1}).knobs["tensor_parallel_size"] == 1
    assert settings({**LMCACHE, "gpu_mask": "2,3"}).knobs["tensor_parallel_size"] == 2


@pytest.mark.parametrize("value", [0, -1])
def test_tensor_parallel_is_at_least_one(value):
    assert refused({**LMCACHE, "tensor_parallel_size": value}).field == "tensor_parallel_size"


def test_declared_gpus_bound_the_mask_and_tensor_parallel():
    from rigkit.settings.defaults import GPUS

    data = {k: v for k, v in LMCACHE.items() if k != "gpu_mask"}
    assert refused({**data, "gpus": 2, "gpu_mask": "1,2"}, [GPUS]).field == "gpu_mask"
    assert refused({**data, "gpus": 2, "tensor_parallel_size": 4}, [GPUS]).field == "tensor_parallel_size"
    assert settings_for_host({**data, "gpus": 2, "tensor_parallel_size": 2}, variables=[GPUS])


def test_a_bare_digest_is_completed_with_the_profiles_repository():
    error = refused({**CPU_LAB, "serving_image": "sha256:" + "1" * 64})
    assert error.field == "serving_image"
    assert error.fix == "put the repository before it: 127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64


def test_lmcache_ports_clashing_with_serving_port_refused_before_any_host_is_touched():
    # LMCache's HTTP API defaults to 8080, a common choice for serving_port too (host networking: one wins)
    error = refused({**LMCACHE, "serving_port": 8080})
    assert (error.field, error.value) == ("lmcache_http_port", 8080)
    assert "is serving_port too" in error.problem and "set lmcache_http_port to another port, e.g. 8081" in error.fix
    error = refused({**LMCACHE, "lmcache_port": 9000, "lmcache_http_port": 9000})
    assert error.field == "lmcache_http_port" and "is lmcache_port too" in error.problem
    # a profile without LMCache does not listen there: serving_port 8080 is fine
    assert settings({**CPU_LAB, "serving_port": 8080}).listen_ports == {"serving_port": 8080}
    assert settings(LMCACHE).listen_ports == {"serving_port": 8000, "lmcache_port": 5555, "lmcache_http_port": 8080}
