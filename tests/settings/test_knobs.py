"""The knob registry: declarations, per-type validation, values that cannot reach .env."""

import math

import pytest

from rigkit.errors import ConfigError
from rigkit.settings.knobs import (
    KNOBS,
    KNOBS_BY_NAME,
    _text,
    controller_secret_variable,
    env_name,
    env_text,
    env_value_problem,
    gpu_indices,
    knob_for_env,
    redacted,
)
from rigkit.settings.variables import REDACTED, JsonObject, docs_table

STRING_ENV_KNOBS = [k.name for k in KNOBS if k.type in (str, JsonObject) and k.env]
NUMBER_KNOBS = [k.name for k in KNOBS if k.type in (int, float)]
INT_KNOBS = [k.name for k in KNOBS if k.type is int]
SCALAR_KNOBS = [k.name for k in KNOBS if k.type in (str, JsonObject, int, float, bool)]


def test_every_knob_declared_once_with_doc_and_type():
    names = [k.name for k in KNOBS]
    assert len(names) == len(set(names))
    envs = [k.env for k in KNOBS if k.env]
    assert len(envs) == len(set(envs))
    for knob in KNOBS:
        assert knob.doc and isinstance(knob.type, type), knob.name
        if knob.default is not None:
            assert knob.coerce(knob.default) == knob.default, knob.name


def test_no_env_var_that_vllm_reads_itself():
    assert not {"VLLM_PORT", "VLLM_HOST_IP"} & {k.env for k in KNOBS}


def test_the_four_lmcache_env_knobs_exist():
    envs = {k.env for k in KNOBS}
    assert {"LMCACHE_L1_GB", "LMCACHE_L2", "LMCACHE_L2_ADAPTER", "LMCACHE_CHUNK_SIZE"} <= envs


def test_issue_defaults():
    assert KNOBS_BY_NAME["ram_reserve_gb"].default == 28
    assert KNOBS_BY_NAME["ready_timeout_s"].default == 600
    assert KNOBS_BY_NAME["keep_images"].default == 2
    assert KNOBS_BY_NAME["gpu_free_fraction_min"].default == 0.8
    assert KNOBS_BY_NAME["bind_address"].default == "127.0.0.1"


@pytest.mark.parametrize("text", ["{", '{"type": "fs",}', '{"type": fs}'])
def test_malformed_l2_adapter_json_names_field_and_position(text):
    with pytest.raises(ConfigError) as caught:
        KNOBS_BY_NAME["l2_adapter_json"].coerce(text)
    assert caught.value.field == "l2_adapter_json"
    assert "column" in str(caught.value) and "char" in str(caught.value)


def test_l2_adapter_json_must_be_an_object():
    with pytest.raises(ConfigError, match="JSON object") as caught:
        KNOBS_BY_NAME["l2_adapter_json"].coerce('["fs"]')
    assert caught.value.field == "l2_adapter_json"
    assert KNOBS_BY_NAME["l2_adapter_json"].coerce('{"type":"fs","base_path":"/kv"}')


@pytest.mark.parametrize("name", STRING_ENV_KNOBS)
@pytest.mark.parametrize("bad", ["a\nb", "a\x00b", "a\rb"])
def test_newline_and_nul_refused_naming_the_knob(name, bad):
    with pytest.raises(ConfigError) as caught:
        KNOBS_BY_NAME[name].coerce(bad)
    assert caught.value.field == name


@pytest.mark.parametrize(
    "name, value",
    [
        ("restart_policy", "sometimes"),
        ("serving_port", 0),
        ("serving_port", 70000),
        ("serving_port", "http"),
        ("bind_address", "localhost"),
        ("gpu_mask", "0;1"),
        ("l2_path", "relative/dir"),
        ("l2_path", "/a:b"),
        ("l1_size_gb", 0),
        ("gpu_free_fraction_min", 1.5),
        ("allow_incubating", "maybe"),
        ("force", "sure"),
        ("serving_profile", "Bad Name"),
        ("keep_images", 0),
        ("model", ""),
        ("served_model_name", " "),
        ("ready_timeout_s", 0),
        ("gpu_free_fraction_min", -0.1),
        ("l2_budget_gb", 0),
    ],
)
def test_bad_values_refused_naming_the_knob(name, value):
    with pytest.raises(ConfigError) as caught:
        KNOBS_BY_NAME[name].coerce(value)
    assert caught.value.field == name


def test_values_coerced_by_type():
    assert KNOBS_BY_NAME["serving_port"].coerce("8101") == 8101
    assert KNOBS_BY_NAME["l2_enabled"].coerce("yes") is True
    assert KNOBS_BY_NAME["gpu_mask"].coerce("0,1") == "0,1"
    assert KNOBS_BY_NAME["restart_policy"].coerce("no") == "no"


@pytest.mark.parametrize(
    "text, ok",
    [
        ("plain value", True),
        ("with 'quote'", True),
        ("back\\slash", True),
        ("$dollar", True),
        ('{"type":"fs"}', True),
        ("${VAR}", False),
        ("it's $5", False),
        ('it\'s "quoted"', False),
        ("trailing\\", False),
        ('"leading" quote\'s', True),
    ],
)
def test_env_value_problem(text, ok):
    assert (env_value_problem(text) is None) is ok


def test_env_text():
    assert env_text(True) == "1" and env_text(False) == "0" and env_text(None) == "" and env_text(30) == "30"


def test_docs_table_lists_every_knob():
    table = docs_table(KNOBS)
    for knob in KNOBS:
        assert f"`{knob.name}`" in table


def test_every_none_default_says_whether_none_is_legal():
    for knob in KNOBS:
        if knob.default is None:
            assert knob.optional is not None, f"{knob.name}: say optional=True (derived/unset) or False (required)"


@pytest.mark.parametrize("name", [k.name for k in KNOBS if not k.none_allowed])
def test_none_refused_where_it_means_nothing(name):
    with pytest.raises(ConfigError) as caught:
        KNOBS_BY_NAME[name].coerce(None)
    assert caught.value.field == name


@pytest.mark.parametrize("name", NUMBER_KNOBS)
@pytest.mark.parametrize("value", [math.nan, math.inf, "nan"])
def test_every_number_knob_refuses_non_finite(name, value):
    with pytest.raises(ConfigError, match="finite") as caught:
        KNOBS_BY_NAME[name].coerce(value)
    assert caught.value.field == name


@pytest.mark.parametrize("name", INT_KNOBS)
def test_every_integer_knob_refuses_a_fraction(name):
    with pytest.raises(ConfigError, match="fraction") as caught:
        KNOBS_BY_NAME[name].coerce(300.7)
    assert caught.value.field == name


@pytest.mark.parametrize("name", SCALAR_KNOBS)
@pytest.mark.parametrize("value", [("x",), ["x"]])
def test_every_scalar_knob_refuses_tuples_and_lists(name, value):
    with pytest.raises(ConfigError) as caught:
        KNOBS_BY_NAME[name].coerce(value)
    assert caught.value.field == name


@pytest.mark.parametrize("name", [k.name for k in KNOBS if k.type is str])
def test_every_text_knob_refuses_over_long_text(name):
    with pytest.raises(ConfigError, match="characters") as caught:
        KNOBS_BY_NAME[name].coerce("a" * 200_000)
    assert caught.value.field == name


def test_ports_span_the_whole_tcp_range():
    port = KNOBS_BY_NAME["serving_port"]
    assert port.coerce(1) == 1 and port.coerce(80) == 80 and port.coerce(65535) == 65535


def test_bind_address_may_be_ipv6():
    assert KNOBS_BY_NAME["bind_address"].coerce("::1") == "::1"


def test_l2_adapter_json_given_as_a_dict_by_pyinfra_data():
    value = KNOBS_BY_NAME["l2_adapter_json"].coerce({"type": "fs", "base_path": "/kv-store"})
    assert value == '{"type":"fs","base_path":"/kv-store"}'
    with pytest.raises(ConfigError) as caught:  # what .env cannot carry is refused for a dict too
        KNOBS_BY_NAME["l2_adapter_json"].coerce({"path": "${HOME}"})
    assert caught.value.field == "l2_adapter_json"


ONE_LINE_FIX = "write it on one line, without NUL, '${' or both a quote and '$'"
# each check's own fix, never the one-line one (issue 43: that is for what .env cannot carry only)
BIND_SOURCE_FIX = "write an absolute, normalised directory of its own without ':', e.g. /mnt/rigkit-l2"
GPU_MASK_FIX = "write each GPU index once, separated by commas, e.g. 0,1 (empty = every GPU)"
PROFILE_NAME_FIX = "write a profile name from profiles.yaml, e.g. cpu-lab"
IMAGE_FIX = "write the image as REPO@sha256:<64 hex> (`rigkit resolve IMAGE:TAG` prints it)"
MIXED_QUOTING = "contains both a quote or backslash and '$', which no .env quoting keeps for both compose versions"
BAD_END = "ends with '\"' or a backslash and also contains a quote or backslash"
ENGINE_FIX = (
    "write a list of strings, one argument each, each flag in full, and set rigkit's own flags through their knobs"
)
SILENT = "(vLLM would silently take one of the two values)"
SPECULATIVE_FIX = 'write speculative decoding as a JSON object, e.g. {"method": "mtp", "num_speculative_tokens": 3}'
FRACTION_FIX = "write a fraction above 0 and at most 1, e.g. 0.92"


# Each validator's refusal word for word (problem and fix): the message is what the user reads to fix the value.
@pytest.mark.parametrize(
    "name, value, problem, fix",
    [
        ("model", "a\nb", "contains a newline", ONE_LINE_FIX),
        ("model", "a\rb", "contains a carriage return", ONE_LINE_FIX),
        ("model", "a\x00b", "contains a NUL byte", ONE_LINE_FIX),
        ("model", "${HOME}/m", "contains '${', which compose would expand", ONE_LINE_FIX),
        ("model", "it's $5", MIXED_QUOTING, ONE_LINE_FIX),
        ("model", "a\\b$c", MIXED_QUOTING, ONE_LINE_FIX),
        ("model", 'it\'s "q"', BAD_END, ONE_LINE_FIX),
        ("model", "a\\b\\", BAD_END, ONE_LINE_FIX),
        ("model", "a'b\\", BAD_END, ONE_LINE_FIX),
        ("l2_path", "/a:b", "must not contain ':' (compose volume syntax)", BIND_SOURCE_FIX),
        ("l2_path", "relative/dir", "must be an absolute host path", BIND_SOURCE_FIX),
        ("gpu_mask", "0;1", "must be GPU indices separated by commas, e.g. 0,1 (empty = every GPU)", GPU_MASK_FIX),
        ("gpu_mask", "0,", "must be GPU indices separated by commas, e.g. 0,1 (empty = every GPU)", GPU_MASK_FIX),
        ("gpu_mask", "a0", "must be GPU indices separated by commas, e.g. 0,1 (empty = every GPU)", GPU_MASK_FIX),
        (
            "gpu_mask",
            "2,1,0,2,1",
            "names GPU 1, 2 more than once: each GPU is one tensor-parallel rank, so a repeat would run two ranks "
            "on one GPU",
            GPU_MASK_FIX,
        ),
        ("serving_profile", "bad name", "must be a profile name from profiles.yaml", PROFILE_NAME_FIX),
        ("serving_profile", "-lead", "must be a profile name from profiles.yaml", PROFILE_NAME_FIX),
        ("serving_profile", "a/b", "must be a profile name from profiles.yaml", PROFILE_NAME_FIX),
        ("serving_image", "repo/vllm@sha256:1 2", "must not contain whitespace", IMAGE_FIX),
        ("serving_image", "repo/vllm\t", "must not contain whitespace", IMAGE_FIX),
        ("gpu_memory_utilization", 0, "must be a fraction above 0 and at most 1, e.g. 0.92", FRACTION_FIX),
        ("gpu_memory_utilization", 1.01, "must be a fraction above 0 and at most 1, e.g. 0.92", FRACTION_FIX),
        (
            "speculative_config",
            {"num_speculative_tokens": 3},
            'names neither a "method" (e.g. "mtp", "ngram", "eagle3") nor a draft "model"',
            SPECULATIVE_FIX,
        ),
        (
            "speculative_config",
            {"method": "", "model": ""},
            'names neither a "method" (e.g. "mtp", "ngram", "eagle3") nor a draft "model"',
            SPECULATIVE_FIX,
        ),
        (
            "speculative_config",
            {"method": "mtp", "num_speculative_tokens": 0},
            '"num_speculative_tokens" must be a whole number of at least 1, got 0',
            SPECULATIVE_FIX,
        ),
        (
            "speculative_config",
            {"model": "draft", "num_speculative_tokens": True},
            '"num_speculative_tokens" must be a whole number of at least 1, got True',
            SPECULATIVE_FIX,
        ),
        (
            "speculative_config",
            {"method": "mtp", "num_speculative_tokens": "3"},
            "\"num_speculative_tokens\" must be a whole number of at least 1, got '3'",
            SPECULATIVE_FIX,
        ),
        (
            "speculative_config",
            {"method": "mtp", "num_speculative_tokens": 2.0},
            '"num_speculative_tokens" must be a whole number of at least 1, got 2.0',
            SPECULATIVE_FIX,
        ),
        ("extra_engine_args", ["--ok", 1], "item 1 is int 1: each argument must be a string", ENGINE_FIX),
        (
            "extra_engine_args",
            ["--ok", "a\x00b"],
            "item 1 contains a NUL byte, which no program argument can carry",
            ENGINE_FIX,
        ),
        (
            "extra_engine_args",
            ["--enable-chunked-prefill", "--max_num_seqs=8"],
            f"item 1 ('--max_num_seqs=8') sets --max-num-seqs, which the max_num_seqs knob renders {SILENT}: "
            "set max_num_seqs instead",
            ENGINE_FIX,
        ),
        (
            "extra_engine_args",
            ["-q", "fp8"],
            f"item 0 ('-q') sets --quantization (as -q), which the quantization knob renders {SILENT}: "
            "set quantization instead",
            ENGINE_FIX,
        ),
        (
            "extra_engine_args",
            ["-qfp8"],
            f"item 0 ('-qfp8') sets --quantization (as -q), which the quantization knob renders {SILENT}: "
            "set quantization instead",
            ENGINE_FIX,
        ),
        (
            "extra_engine_args",
            ["--ma", "8"],
            "item 0 ('--ma') abbreviates --mamba-cache-mode or --max-num-seqs, which the max_num_seqs or "
            "mamba_cache_mode knob renders (vLLM takes a prefix that fits one flag as that flag, and stops on one "
            "that fits several): set max_num_seqs or mamba_cache_mode instead",
            ENGINE_FIX,
        ),
        (
            "extra_engine_args",
            ["--speculative-config.method", "mtp"],
            "item 0 ('--speculative-config.method') sets --speculative-config, which the speculative_config knob "
            f"renders {SILENT}: set speculative_config instead",
            ENGINE_FIX,
        ),
        (
            "model_source",
            "org/name",
            "a hub repository without a revision: the hub serves whatever its main branch holds that day",
            "pin a commit: run `rigkit resolve-model org/name` and use what it prints (org/name@<40-hex commit>)",
        ),
        (
            "kv_store_password",
            "short",
            "has 5 characters, fewer than 16 (valkey never slows down guessing)",
            "export a longer password without quotes, backslashes or whitespace in RIGKIT_KV_STORE_PASSWORD",
        ),
    ],
)
def test_a_bad_knob_value_is_refused_saying_why_and_how_to_fix_it(name, value, problem, fix):
    with pytest.raises(ConfigError) as caught:
        KNOBS_BY_NAME[name].coerce(value)
    assert (caught.value.field, caught.value.problem, caught.value.fix) == (name, problem, fix)


def test_an_adapter_holding_a_credential_is_refused_without_showing_it():
    with pytest.raises(ConfigError) as caught:
        KNOBS_BY_NAME["l2_adapter_json"].coerce('{"type": "valkey", "password": "hunter2"}')
    error = caught.value
    assert error.value == REDACTED and "hunter2" not in str(error)
    assert error.problem == (
        "holds a credential at password: it would be readable in ps on the rig, its status and its card; a Valkey "
        "store's password is kv_store_password (l2_kv_store_address renders the adapter)"
    )
    assert error.fix.startswith('write one JSON object without credentials, e.g. {"type": "fs"')


@pytest.mark.parametrize(
    "name, value",
    [
        ("gpu_mask", ""),
        ("gpu_mask", "0"),
        ("gpu_mask", "0,1,10"),
        ("serving_profile", "lmcache-mp"),
        ("serving_profile", "0"),
        ("model", "it's fine"),
        ("model", "$5 but no quote"),
        ("model", '"quoted" at the start'),
        ("gpu_memory_utilization", 1),
        ("gpu_memory_utilization", 0.01),
        ("speculative_config", {"model": "org/draft"}),
        ("speculative_config", {"method": "ngram", "num_speculative_tokens": 1}),
        ("extra_engine_args", []),
        ("extra_engine_args", ["--enable-chunked-prefill", "max_num_seqs", "--max-num-seqs-extra=1"]),
        ("l2_path", "/var/lib/rigkit/kv"),
    ],
)
def test_a_good_knob_value_is_taken(name, value):
    assert KNOBS_BY_NAME[name].coerce(value) is not None


def test_gpu_indices_of_a_mask():
    assert gpu_indices("0,2,10") == [0, 2, 10] and gpu_indices("") == []


def test_a_secret_env_value_is_redacted_and_others_are_not():
    assert redacted("HF_TOKEN", "hf_abc") == REDACTED
    assert redacted("RIGKIT_KV_STORE_PASSWORD", "p" * 20) == REDACTED
    assert redacted("RIGKIT_MODEL", "org/model") == "org/model"


def test_env_name_of_a_knob_or_a_key_error_saying_why():
    assert env_name("model") == "RIGKIT_MODEL" and env_name("hf_token") == "HF_TOKEN"
    with pytest.raises(KeyError, match="force has no env var"):
        env_name("force")
    with pytest.raises(KeyError):
        env_name("no_such_knob")


def test_knob_for_env_or_the_env_itself():
    assert knob_for_env("HF_TOKEN") == "hf_token" and knob_for_env("LMCACHE_L1_GB") == "l1_size_gb"
    assert knob_for_env("LMCACHE_FIXED") == "LMCACHE_FIXED"


def test_a_secret_knob_is_read_from_its_controller_variable():
    assert controller_secret_variable("hf_token") == "RIGKIT_HF_TOKEN"


def test_a_text_check_refuses_what_compose_cannot_carry_before_its_own_check():
    # built here, not at import (KNOBS builds its checks at import, out of the mutation check's reach)
    seen = []
    check = _text(seen.append)
    check("fine")
    with pytest.raises(ValueError, match=r"^contains a newline$"):
        check("a\nb")
    assert seen == ["fine"]
    # a check without its own fix gets Variable's general one, never the one-line fix of another reason
    assert check.fix == "" and _text().fix == ONE_LINE_FIX
    _text()("fine")


def test_a_text_check_takes_its_own_checks_fix():
    def checked(value):
        pass

    checked.fix = "write what the check wants"
    assert _text(checked).fix == "write what the check wants"
