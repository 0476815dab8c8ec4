"""The knob registry: declarations, per-type validation, values that cannot reach .env."""

import math

import pytest

from rigkit.errors import ConfigError
from rigkit.settings.knobs import KNOBS, KNOBS_BY_NAME, env_text, env_value_problem
from rigkit.settings.variables import JsonObject, docs_table

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
