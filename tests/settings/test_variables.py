"""Variable.coerce: every value a user can set becomes the declared type exactly, or is refused naming the field."""

import math

import pytest

from rigkit.errors import ConfigError
from rigkit.settings.variables import MAX_TEXT_LENGTH, JsonObject, Variable, closest_name, refuse_unknown

SIZE = Variable("size_gb", 30, "a size in GB", int)
FRACTION = Variable("fraction", 0.8, "a fraction", float)
NAME = Variable("name", None, "a name", str, optional=False)
MASK = Variable("mask", "", "indices (empty = all)", str, allow_empty=True)
DERIVED = Variable("derived_gb", None, "derived when unset", int, optional=True)
FLAG = Variable("flag", False, "a switch", bool)
ADAPTER = Variable("adapter", None, "a JSON object", JsonObject, optional=True)


def refused(variable: Variable, value) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        variable.coerce(value)
    assert caught.value.field == variable.name
    return caught.value


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "nan", "NaN", "inf", "-Infinity", "1e999"])
@pytest.mark.parametrize("variable", [SIZE, FRACTION])
def test_numbers_must_be_finite(variable, value):
    assert "finite" in refused(variable, value).problem


def test_number_too_large_for_a_float_is_refused():
    assert "too large" in refused(FRACTION, 10**400).problem


@pytest.mark.parametrize("value", [60.7, "60.7", 0.5, "1e-3"])
def test_an_integer_given_a_fraction_is_refused_not_truncated(value):
    assert "fraction" in refused(SIZE, value).problem


@pytest.mark.parametrize(
    "value, expected", [(60, 60), (60.0, 60), ("60", 60), (" 60 ", 60), ("60.0", 60), ("1e2", 100), ("-3", -3)]
)
def test_integers_written_exactly(value, expected):
    converted = SIZE.coerce(value)
    assert converted == expected and type(converted) is int


@pytest.mark.parametrize("value", ["sixty", "6_0", "\u0666\u0660", "", "0x10", "60 GB"])
def test_numbers_as_text_in_ascii_digits_only(value):
    refused(SIZE, value)
    refused(FRACTION, value)


def test_floats_accept_numbers_and_their_text():
    assert FRACTION.coerce(1) == 1.0 and FRACTION.coerce("0.25") == 0.25 and FRACTION.coerce(".5") == 0.5


@pytest.mark.parametrize("variable", [SIZE, FRACTION, NAME, FLAG])
def test_none_refused_unless_declared(variable):
    error = refused(variable, None)
    assert "None" in error.problem and variable.name in error.fix


def test_none_legal_where_the_declaration_says_so():
    assert DERIVED.coerce(None) is None and ADAPTER.coerce(None) is None
    # not declared either way: a None default is the declared value (role variables: "None = newest")
    assert Variable("version", None, "None = newest").coerce(None) is None
    assert refused(Variable("port", 8000, "a port", int, optional=False), None)


def test_the_fix_for_none_names_the_default():
    assert "default 30" in refused(SIZE, None).fix


@pytest.mark.parametrize(
    "value, what", [(("x",), "trailing comma"), (["x"], "list"), ({"x": 1}, "dict"), (b"x", "bytes"), ({"x"}, "set")]
)
@pytest.mark.parametrize("variable", [NAME, SIZE, FRACTION, FLAG])
def test_wrong_python_types_refused_for_scalars(variable, value, what):
    error = refused(variable, value)
    assert what in error.problem or variable is FLAG


def test_text_accepts_what_pyinfra_data_makes_of_digits():
    assert NAME.coerce(123) == "123" and MASK.coerce(0) == "0"
    for value in (1.5, True):  # --data name=1.5 / name=true: the fix says how to pass it as text
        assert "JSON string" in refused(NAME, value).problem


@pytest.mark.parametrize("value", ["", " ", "\t"])
def test_required_text_is_not_blank(value):
    assert "empty" in refused(NAME, value).problem


def test_empty_text_only_where_declared():
    assert MASK.coerce("") == ""


def test_text_length_is_bounded():
    assert NAME.coerce("x" * MAX_TEXT_LENGTH) == "x" * MAX_TEXT_LENGTH
    error = refused(NAME, "x" * 200_000)
    assert "200000 characters" in error.problem and len(str(error)) < 1000


def test_lone_surrogate_refused():
    assert "surrogate" in refused(NAME, "a\udc80b").problem


@pytest.mark.parametrize("value, expected", [(True, True), (1, True), (0, False), ("yes", True), ("Off", False)])
def test_booleans(value, expected):
    assert FLAG.coerce(value) is expected


@pytest.mark.parametrize("value", [2, -1, 1.0, "maybe", ""])
def test_not_booleans(value):
    refused(FLAG, value)


def test_bool_is_not_a_number():
    refused(SIZE, True)
    refused(FRACTION, False)


def test_json_object_from_a_dict_or_its_text():
    assert (
        ADAPTER.coerce({"type": "fs", "path": "/kv \u00e9\U0001f600"}) == '{"type":"fs","path":"/kv \u00e9\U0001f600"}'
    )
    text = '{ "type": "fs" }'
    assert ADAPTER.coerce(text) == text  # kept exactly as written
    assert type(ADAPTER.coerce(text)) is str


@pytest.mark.parametrize("value", ['{"a": NaN}', '{"a": Infinity}', {"a": math.nan}, '["fs"]', "{", ["fs"], 3])
def test_json_object_refusals(value):
    refused(ADAPTER, value)


def test_check_runs_on_the_converted_value():
    def even(value):
        if value % 2:
            raise ValueError("must be even")

    variable = Variable("count", 2, "an even count", int, even)
    assert variable.coerce("4.0") == 4
    assert refused(variable, "3").problem == "must be even"


@pytest.mark.parametrize(
    "typo, expected",
    [
        ("l1_size_gib", "l1_size_gb"),
        ("l1_s\u0456ze_gb", "l1_size_gb"),
        ("L1_SIZE_GB", "l1_size_gb"),
        ("serving_prot", "serving_port"),
        ("modle", "model"),
        ("keep_image", "keep_images"),
    ],
)
def test_suggestions_are_near_misses(typo, expected):
    known = [
        "l1_size_gb",
        "model_size_gb",
        "serving_port",
        "serving_profile",
        "model",
        "keep_images",
        "nvidia_ctk_version",
        "nvidia_driver_version",
    ]
    assert closest_name(typo, known) == expected


@pytest.mark.parametrize("name", ["validate_sessions", "validate_soak_sesions", "replay", "port"])
def test_no_suggestion_for_an_unrelated_name(name):
    known = ["nvidia_ctk_version", "nvidia_driver_version", "restart_policy", "serving_port", "l2_format"]
    assert closest_name(name, known) is None


def test_unknown_name_with_a_homoglyph_is_shown_escaped():
    with pytest.raises(ConfigError) as caught:
        refuse_unknown(["l1_s\u0456ze_gb"], ["l1_size_gb"], "host data")
    message = str(caught.value)
    assert message.isascii()
    assert "l1_s\\u0456ze_gb" in message and "CYRILLIC" in message and "did you mean 'l1_size_gb'?" in message
    assert caught.value.field == "l1_s\u0456ze_gb"


def _refuse_everything(value):
    raise ValueError(f"bad {value}")


def test_every_message_shows_non_ascii_escaped():
    error = refused(Variable("name", None, "a name", str, _refuse_everything), "caf\u00e9")
    assert str(error).isascii() and "caf\\xe9" in str(error)
