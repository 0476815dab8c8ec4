"""Variable.coerce: every value a user can set becomes the declared type exactly, or is refused naming the field."""

import math

import pytest

from rigkit.errors import ConfigError
from rigkit.settings.variables import (
    MAX_TEXT_LENGTH,
    REDACTED,
    JsonObject,
    Variable,
    _to_container,
    check_of,
    closest_name,
    docs_table,
    one_of,
    refuse_unknown,
)

SIZE = Variable("size_gb", 30, "a size in GB", int)
FRACTION = Variable("fraction", 0.8, "a fraction", float)
NAME = Variable("name", None, "a name", str, optional=False)
MASK = Variable("mask", "", "indices (empty = all)", str, allow_empty=True)
DERIVED = Variable("derived_gb", None, "derived when unset", int, optional=True)
FLAG = Variable("flag", False, "a switch", bool)
ADAPTER = Variable("adapter", None, "a JSON object", JsonObject, optional=True)
ARGS = Variable("args", [], "more arguments", list)
TOKEN = Variable("token", None, "a credential", str, optional=True, secret=True)


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


def test_the_fix_for_none_names_the_type_and_the_default():
    error = refused(SIZE, None)
    assert error.problem == "no value (None) given, and this setting is never derived"
    assert error.fix == "set size_gb to an integer, or leave it out for the default 30"


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


# Each refusal word for word: the message is what the user reads to fix the value.
@pytest.mark.parametrize(
    "variable, value, problem",
    [
        (SIZE, "sixty", "not a number"),
        (SIZE, True, "expected an integer, got a boolean"),
        (SIZE, 60.5, "a fraction: an integer setting is never rounded"),
        (SIZE, ("x",), "expected an integer, got a tuple (a trailing comma in Python group data makes one)"),
        (SIZE, b"x", "expected an integer, got a bytes"),
        (SIZE, [1], "expected an integer, got a list"),
        (FRACTION, False, "expected a number, got a boolean"),
        (FRACTION, 10**400, "too large for a number"),
        (FRACTION, {"a": 1}, "expected a number, got a dict"),
        (FLAG, "maybe", "not a boolean (true/false, yes/no, on/off or 1/0)"),
        (
            NAME,
            1.5,
            "expected text, got a float (on the command line write it as a JSON string: --data name='\"...\"')",
        ),
        (NAME, "", "empty: this setting needs a value"),
        (NAME, "a\udc80b", "holds a lone surrogate, which no UTF-8 file can carry"),
        (ADAPTER, '{"a": NaN}', "NaN is not a finite number and not JSON"),
        (ADAPTER, '["fs"]', "must be a JSON object ({...}), got list"),
        (ARGS, 3, "expected a list, got an int"),
        (ARGS, "--flag", "expected a list, got a str"),
        (ARGS, object(), "expected a list, got an object"),
    ],
)
def test_refusal_says_what_is_wrong(variable, value, problem):
    assert refused(variable, value).problem == problem


def test_a_dict_that_json_cannot_write_is_refused_saying_why():
    assert refused(ADAPTER, {"a": math.nan}).problem.startswith("cannot be written as JSON (Out of range float")


def test_a_list_setting_takes_only_a_list_as_it_is():
    value = ["--enable-chunked-prefill"]
    assert ARGS.coerce(value) is value
    # the converter itself, built here (CONVERTERS builds it at import, out of the mutation check's reach)
    assert _to_container(list)(value) is value
    with pytest.raises(ValueError, match=r"^expected a mapping, got a list$"):
        _to_container(dict)(value)


@pytest.mark.parametrize(
    "variable, fix",
    [
        (SIZE, "set size_gb to an integer, e.g. 30"),
        (FLAG, "set flag to a boolean, e.g. False"),
        (NAME, "set name to text"),  # no default: no example
        (MASK, "set mask to text"),  # an empty default is no example
        (ARGS, "set args to a list"),
        (Variable("password", "hunter2hunter2", "a credential", str, secret=True), "set password to text"),
    ],
)
def test_the_fix_gives_the_type_and_the_default_as_example_unless_secret(variable, fix):
    assert refused(variable, object()).fix == fix


def test_the_fix_for_a_required_value_without_default_offers_no_default():
    assert refused(NAME, None).fix == "set name to text"


def test_a_secret_is_redacted_unless_unset_or_empty():
    assert TOKEN.shown("hf_abc") == REDACTED
    assert TOKEN.shown("") == "" and TOKEN.shown(None) is None
    assert NAME.shown("visible") == "visible"


def restart_policy() -> Variable:
    # made in each test, not at import: a check built at import is out of the mutation check's reach
    return Variable("restart", "no", "a policy", str, one_of(("no", "always", "on-failure")))


@pytest.mark.parametrize(
    "value, problem",
    [
        ("alway", "must be one of no, always, on-failure (did you mean 'always'?)"),
        ("sometimes", "must be one of no, always, on-failure"),
    ],
)
def test_one_of_refuses_naming_the_choices_and_the_near_miss(value, problem):
    error = refused(restart_policy(), value)
    assert error.problem == problem and error.fix == "write one of no, always, on-failure"


def test_one_of_refuses_a_non_text_value_without_guessing():
    check = one_of(("1", "2"))
    with pytest.raises(ValueError, match=r"^must be one of 1, 2$"):
        check(3)


def _too_short(value: str):
    return "shorter than 8 characters" if len(value) < 8 else None


def test_check_of_refuses_with_the_problem_and_its_fix():
    variable = Variable("password", None, "a credential", str, check_of(_too_short, "export a longer one"))
    assert variable.coerce("long enough") == "long enough"
    error = refused(variable, "short")
    assert (error.problem, error.fix) == ("shorter than 8 characters", "export a longer one")


def test_check_of_without_a_fix_falls_back_to_the_type():
    variable = Variable("password", None, "a credential", str, check_of(_too_short))
    assert refused(variable, "short").fix == "set password to text"


def test_unknown_name_without_a_near_miss_lists_the_valid_names():
    with pytest.raises(ConfigError) as caught:
        refuse_unknown(["replay"], ["serving_port", "l2_format"], "host data")
    error = caught.value
    assert (error.problem, error.fix) == ("unknown setting in host data", "valid names: l2_format, serving_port")


def test_unknown_name_lists_every_non_ascii_character_and_an_unnamed_one():
    with pytest.raises(ConfigError) as caught:
        refuse_unknown(["l1_s\u0456ze\ue000_gb\u0456"], ["l1_size_gb"], "host data")
    assert caught.value.problem == (
        "unknown setting in host data (it contains the non-ASCII \\u0456 (CYRILLIC SMALL LETTER "
        "BYELORUSSIAN-UKRAINIAN I), \\ue000 (unnamed))"
    )


def test_docs_table_rows_show_default_and_secret():
    table = docs_table([SIZE, NAME, TOKEN])
    assert table == (
        "| name | default | meaning |\n"
        "|---|---|---|\n"
        "| `size_gb` | `30` | a size in GB |\n"
        "| `name` |  | a name |\n"
        "| `token` |  | **secret** (never shown; from the controller's environment): a credential |"
    )
