"""The engine knobs (rigkit/settings/knobs.py ENGINE_FLAGS, extra_engine_args): validated before any host is touched,
rendered as one vLLM flag each only when set, every extra argument reaching vLLM as exactly one argv element."""

import json

import pytest
from engine_argv import flags, launched_argv, needs_compose

from rigkit.errors import ConfigError
from rigkit.preflight import HostFacts, preflight, refusals
from rigkit.serving.render import entrypoint_script, render_compose, render_env
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.knobs import ENGINE_FLAGS, HASHED_ONLY_WHEN_SET, KNOBS_BY_NAME
from rigkit.settings.profiles import ab_pair, load_profiles

IMAGES = {
    "cpu-lab": "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64,
    "lmcache-mp": "lmcache/vllm-openai@sha256:" + "2" * 64,
    "native-offload": "vllm/vllm-openai@sha256:" + "3" * 64,
}
# A value bash, compose and YAML would each mangle if it were pasted in: spaces, both quotes, `$`, `${`, `;`, `\`,
# and a command substitution that leaves a file behind if bash ever runs it.
HOSTILE_ARG = """--override-generation-config={"stop": ["it's $HOME; ${PATH} \\"q\\" $(touch injected) `x`"]}"""
EVERY_ENGINE_SETTING = {
    "speculative_config": {"method": "mtp", "num_speculative_tokens": 3},
    "kv_cache_dtype": "int8_per_token_head",
    "gpu_memory_utilization": 0.92,
    "max_num_seqs": 8,
    "mamba_cache_mode": "align",
    "quantization": "fp8",
    "trust_remote_code": True,
    "max_num_batched_tokens": 1584,
    "max_model_len": 262144,
    "extra_engine_args": ["--enable-chunked-prefill", HOSTILE_ARG],
}


def settings(profile: str, **knobs):
    data = {
        "serving_profile": profile,
        "serving_image": IMAGES.get(profile, IMAGES["lmcache-mp"]),
        "allow_incubating": True,
        "model": "/models/tiny" if profile == "cpu-lab" else "Qwen/Qwen3-8B",
    }
    return settings_for_host({**data, **knobs}, variables=[])


@needs_compose
def test_every_engine_setting_reaches_vllm_as_its_flag(tmp_path):
    argv = launched_argv(tmp_path, settings("native-offload", **EVERY_ENGINE_SETTING))["vllm"]
    assert argv[:2] == ["serve", "Qwen/Qwen3-8B"]
    got = flags(argv[2:])
    assert got["--speculative-config"] == '{"method":"mtp","num_speculative_tokens":3}'
    assert got["--kv-cache-dtype"] == "int8_per_token_head" and got["--gpu-memory-utilization"] == "0.92"
    assert got["--max-num-seqs"] == "8" and got["--mamba-cache-mode"] == "align" and got["--quantization"] == "fp8"
    assert got["--trust-remote-code"] is True and got["--enable-chunked-prefill"] is True


@needs_compose
def test_an_extra_argument_reaches_vllm_as_exactly_one_argv_element(tmp_path):
    argv = launched_argv(tmp_path, settings("lmcache-mp", **EVERY_ENGINE_SETTING), programs=("vllm", "lmcache"))
    assert argv["vllm"].count(HOSTILE_ARG) == 1
    assert argv["vllm"][argv["vllm"].index("--enable-chunked-prefill") + 1] == HOSTILE_ARG
    assert not (tmp_path / "injected").exists()  # bash ran nothing inside it


def test_a_speculative_config_as_a_dict_or_as_json_text_renders_the_same():
    as_dict = settings("native-offload", speculative_config={"method": "mtp", "num_speculative_tokens": 3})
    as_text = settings("native-offload", speculative_config='{"method":"mtp","num_speculative_tokens":3}')
    assert entrypoint_script(as_dict) == entrypoint_script(as_text)


def test_trust_remote_code_false_renders_no_flag():
    assert "--trust-remote-code" not in entrypoint_script(settings("native-offload", trust_remote_code=False))
    assert "--trust-remote-code" in entrypoint_script(settings("native-offload", trust_remote_code=True))


@pytest.mark.parametrize("profile", ["cpu-lab", "lmcache-mp", "native-offload"])
def test_engine_knobs_left_unset_change_no_rendering_and_no_knobs_hash(profile):
    # A rig deployed before these knobs existed must stay "No Change": same compose, .env and knobs hash.
    plain = settings(profile)
    defaults = settings(profile, **{name: KNOBS_BY_NAME[name].default for name in HASHED_ONLY_WHEN_SET})
    assert render_compose(defaults) == render_compose(plain) and render_env(defaults) == render_env(plain)
    assert defaults.knobs_hash == plain.knobs_hash
    assert not any(flag in render_compose(plain) for flag in ENGINE_FLAGS.values())


def test_a_cpu_lab_rig_keeps_the_knobs_hash_it_was_deployed_with():
    # recorded by tests/roles/serving/cpu-lab-fresh.json before the engine knobs existed
    recorded = settings_for_host(
        {
            "serving_profile": "cpu-lab",
            "serving_port": 8101,
            "num_gpu_blocks_override": 72,
            "serving_image": "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "3f" * 32,
            "gpus": 0,
        }
    )
    assert recorded.knobs_hash == "956cc1a7ea596131"


@pytest.mark.parametrize(
    "name, value", [(name, value) for name, value in EVERY_ENGINE_SETTING.items() if name in HASHED_ONLY_WHEN_SET]
)
def test_each_engine_knob_set_changes_the_knobs_hash(name, value):
    assert settings("native-offload", **{name: value}).knobs_hash != settings("native-offload").knobs_hash


@needs_compose
@pytest.mark.parametrize("base", ["lmcache-mp", "native-offload"])
def test_the_ab_baseline_keeps_every_engine_setting_and_drops_only_the_connector(tmp_path, base):
    with_connector, baseline = ab_pair(load_profiles(), base)
    on = settings(with_connector.name, **EVERY_ENGINE_SETTING)
    off = settings(baseline.name, **EVERY_ENGINE_SETTING)
    (tmp_path / "on").mkdir()
    (tmp_path / "off").mkdir()
    on_flags = flags(launched_argv(tmp_path / "on", on, programs=("vllm",))["vllm"][2:])
    off_flags = flags(launched_argv(tmp_path / "off", off, programs=("vllm",))["vllm"][2:])
    assert (
        json.loads(on_flags.pop("--kv-transfer-config"))["kv_connector"]
        == with_connector.connector.kv_transfer_config["kv_connector"]
    )
    assert on_flags == off_flags
    assert off_flags["--kv-cache-dtype"] == "int8_per_token_head" and off_flags["--trust-remote-code"] is True
    assert off_flags["--override-generation-config"] == HOSTILE_ARG.split("=", 1)[1]


BAD_ENGINE_VALUES = [
    ("kv_cache_dtype", "int8", "int8_per_token_head"),  # the story's "int8" is not a vLLM name
    ("kv_cache_dtype", "fp16", "float16"),
    ("gpu_memory_utilization", 0, "above 0 and at most 1"),
    ("gpu_memory_utilization", 92, "above 0 and at most 1"),
    ("max_num_seqs", 0, "between 1 and"),
    ("mamba_cache_mode", "aligned", "all, align, none"),
    ("quantization", "fp9", "gptq_marlin"),
    ("speculative_config", '{"method": "mtp", "num_speculative_tokens": 3', "line 1 column"),
    ("speculative_config", "[3]", "JSON object"),
    ("speculative_config", {"num_speculative_tokens": 3}, '"method"'),
    ("speculative_config", {"method": "mtp", "num_speculative_tokens": 0}, "at least 1"),
    ("speculative_config", {"method": "mtp", "num_speculative_tokens": "3"}, "whole number"),
    ("trust_remote_code", "maybe", "boolean"),
    ("extra_engine_args", "--enable-chunked-prefill", "list"),
    ("extra_engine_args", ["--enable-chunked-prefill", 8], "must be a string"),
    ("extra_engine_args", ["--kv-cache-dtype=fp8"], "set kv_cache_dtype instead"),
    ("extra_engine_args", ["-q", "fp8"], "set quantization instead"),
]


@pytest.mark.parametrize("name, value, fix_or_problem", BAD_ENGINE_VALUES)
def test_a_bad_engine_value_is_refused_naming_the_field_the_value_and_the_fix(name, value, fix_or_problem):
    with pytest.raises(ConfigError) as caught:
        settings("native-offload", **{name: value})
    error = caught.value
    assert error.field == name and error.value == value and error.fix
    assert fix_or_problem in f"{error.problem} {error.fix}"


@pytest.mark.parametrize(
    "arg, flag",
    [
        ("--max_model_len=8192", "--max-model-len"),
        ("--tensor-parallel-size", "--tensor-parallel-size"),
        ("-tp", "--tensor-parallel-size"),
        ("--port", "--port"),
    ],
)
def test_an_extra_argument_setting_a_flag_the_profile_renders_is_refused(arg, flag):
    with pytest.raises(ConfigError) as caught:
        settings("native-offload", extra_engine_args=[arg, "2"])
    assert caught.value.field == "extra_engine_args" and caught.value.value == arg
    assert flag in caught.value.problem and "knob" in caught.value.fix


@pytest.mark.parametrize("profile", ["native-offload", "prefix-only"])
def test_an_extra_kv_transfer_config_is_refused_even_on_a_baseline(profile):
    with pytest.raises(ConfigError) as caught:
        settings(profile, extra_engine_args=['--kv-transfer-config={"kv_connector":"LMCacheMPConnector"}'])
    assert caught.value.field == "extra_engine_args" and "profile" in caught.value.fix


def test_the_gpu_gate_rises_to_the_memory_vllm_will_ask_for():
    # two GPUs held at 85 % free by another process: enough for rigkit's 80 % gate, not for vLLM at 0.92
    facts = HostFacts(
        meminfo={"MemAvailable": 2000 * 10**9, "MemTotal": 2000 * 10**9},
        gpu_memory_csv="0, 85000, 100000\n1, 85000, 100000\n",
        l2_free_bytes=900 * 10**9,
        has_engine=True,
        compose_command="docker compose",
        image_present=True,
        host_shm_bytes=128 * 2**30,
    )

    def gpu_refusals(**knobs):
        return [f for f in refusals(preflight(settings("native-offload", **knobs), facts)) if f.check == "gpu"]

    assert gpu_refusals(gpu_memory_utilization=0.85) == []
    for force in (False, True):  # vLLM refuses to start below its utilisation: force cannot help
        found = gpu_refusals(gpu_memory_utilization=0.92, force=force)
        assert [(f.field, f.value) for f in found] == [("gpu_memory_utilization", 0.92)] * 2
        assert "vLLM would not start" in found[0].message
        assert "lower gpu_memory_utilization to at most 0.85" in found[0].fix
        unset = gpu_refusals(force=force)  # vLLM's own default, 0.92, is the same bar
        assert [(f.field, f.value) for f in unset] == [("gpu_memory_utilization", 0.92)] * 2
        assert "set gpu_memory_utilization to at most 0.85" in unset[0].fix
    assert gpu_refusals(gpu_memory_utilization=0.5, gpu_free_fraction_min=0.9)[0].field == "gpu_free_fraction_min"
