"""Refusals name what the user wrote and give the fix for what is wrong (issue 43): a check's own fix, never the
generic one-line fix of another reason; a profile's list item where the user wrote it, not its merged index."""

from __future__ import annotations

import pytest

from rigkit.errors import ConfigError
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.knobs import KNOBS, ONE_LINE_FIX, env_value_problem
from rigkit.settings.profiles import parse_profiles
from rigkit.settings.variables import Refusal, Variable
from tests.settings.test_profiles import MINIMAL

IMAGE = "registry.local/vllm@sha256:" + "a" * 64
# Values each text knob's own check may refuse for its own reasons (none of them is one .env cannot carry).
BAD_TEXT = ["lmcache_mp", "Qwen/x", "a b", "/etc/x", "x:y", "not json", "a,a", "-", "0.0.0.0.0", "shared:/etc/x"]


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.type is str and k.check is not None], ids=lambda k: k.name)
def test_a_text_knob_gives_the_one_line_fix_only_for_what_one_line_cannot_carry(knob):
    for value in BAD_TEXT:
        try:
            knob.coerce(value)
        except ConfigError as refused:
            assert env_value_problem(value) is None
            assert refused.fix != ONE_LINE_FIX, (knob.name, value, str(refused))
            assert "fix:" not in refused.problem, str(refused)  # a fix is never folded into the problem
    with pytest.raises(ConfigError) as refused:
        knob.coerce("a${b}")
    if refused.value.problem == env_value_problem("a${b}"):  # refused for what .env cannot carry: that fix
        assert refused.value.fix == ONE_LINE_FIX, str(refused.value)


def test_a_near_miss_profile_is_answered_with_the_profile_it_misses():
    with pytest.raises(ConfigError) as refused:
        settings_for_host({"serving_profile": "lmcache_mp", "serving_image": IMAGE})
    assert refused.value.fix == "did you mean 'lmcache-mp'?", str(refused.value)


def test_an_unpinned_model_gets_the_resolve_model_fix_alone():
    with pytest.raises(ConfigError) as refused:
        settings_for_host({"serving_profile": "cpu-lab", "serving_image": IMAGE, "model_source": "Qwen/Qwen3-8B"})
    assert refused.value.fix.startswith("pin a commit: run `rigkit resolve-model Qwen/Qwen3-8B`")
    assert ONE_LINE_FIX not in str(refused.value)


@pytest.mark.parametrize("carries_fix", [True, False])
def test_a_check_refusal_carrying_its_fix_wins_over_the_checks_general_fix(carries_fix):
    def check(value):
        raise Refusal("bad", "the specific fix") if carries_fix else ValueError("bad")

    check.fix = "the general fix"
    with pytest.raises(ConfigError) as refused:
        Variable("x", None, "doc", str, check).coerce("v")
    assert refused.value.fix == ("the specific fix" if carries_fix else "the general fix")


# tests/settings/test_profiles.py's one profile, with an item of its own and one of common's in engine_args
PROFILES = MINIMAL.replace(
    "engine_args: [--enable-prefix-caching]", "engine_args: [--enable-prefix-caching, COMMON]"
).replace("    resources:", "    engine_args: [--enforce-eager, OWN]\n    resources:")


@pytest.mark.parametrize(
    "common, own, where",
    [
        ("--x", "7", "profiles.one.engine_args[1] = 7"),
        ("7", "--y", "common.engine_args[1] = 7"),
    ],
)
def test_a_bad_engine_args_item_is_named_where_the_user_wrote_it(common, own, where):
    with pytest.raises(ConfigError) as refused:
        parse_profiles(PROFILES.replace("COMMON", common).replace("OWN", own))
    assert refused.value.field == f"profiles.yaml: {where}", str(refused.value)
