"""Property: every legal value of every string knob that .env carries is read back exactly by rigkit's own
.env reader (rigkit.serving.ledger.parse_dotenv) and by compose v1's parser (python-dotenv, as docker-compose reads
the project .env: interpolation on). Compose v2's reader is checked elsewhere."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rigkit.errors import ConfigError
from rigkit.serving.ledger import parse_dotenv
from rigkit.serving.render import render_env
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.knobs import KNOBS
from rigkit.settings.variables import JsonObject

# Debian's docker-compose (v1) runs on the system python and its python3-dotenv.
SYSTEM_DIST_PACKAGES = Path("/usr/lib/python3/dist-packages")
PROFILE = {
    "serving_profile": "lmcache-mp",
    "allow_incubating": True,
    "serving_image": "lmcache/vllm-openai@sha256:" + "2" * 64,
    "model": "m",
    "l2_enabled": True,
}
STRING_ENV_KNOBS = [k for k in KNOBS if k.env and k.type in (str, JsonObject)]
# Characters the .env quoting and the readers treat specially, mixed into arbitrary text.
TRICKY = list("'\"\\$#= \t{}`!;&|\u00a0") + [
    "\u2028",
    "\u2029",
    "\x85",
    "\x0c",
    "\x0b",
    "\x1c",
    "\U0001f600",
    "${",
    "$$",
    "\\n",
    "export ",
    "#!",
]
text = st.lists(
    st.one_of(st.characters(blacklist_categories=("Cs",)), st.sampled_from(TRICKY)), min_size=1, max_size=40
).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=6,
)
STRATEGIES = {
    "bind_address": st.ip_addresses().map(str),
    # printable, no whitespace, quote or backslash (rigkit.settings.knobs.password_problem); $ # = { } ` and the rest stay
    "kv_store_password": st.lists(
        st.one_of(
            st.characters(blacklist_categories=("Cs", "Cc", "Z")),
            st.sampled_from(list("$#={}`!;&|") + ["$$", "\U0001f600"]),
        ),
        min_size=16,
        max_size=40,
    ).map("".join),
    "l2_adapter_json": st.dictionaries(text, json_values, max_size=4).flatmap(
        lambda d: st.sampled_from([d, json.dumps(d), json.dumps(d, ensure_ascii=False, indent=1)])
    ),
}


def compose_v1_dotenv():
    """python-dotenv as docker-compose v1 imports it: from the venv when installed there, else Debian's."""
    spec = importlib.util.find_spec("dotenv")
    if spec is None:
        package = SYSTEM_DIST_PACKAGES / "dotenv"
        if not package.is_dir():
            pytest.skip("python-dotenv (docker-compose v1's .env parser) is not installed: bin/setup installs it")
        spec = importlib.util.spec_from_file_location(
            "dotenv", package / "__init__.py", submodule_search_locations=[str(package)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["dotenv"] = module
        spec.loader.exec_module(module)
    return importlib.import_module("dotenv")


def legal(knob):
    """Whether a value is legal for ``knob`` (an illegal one is refused while pyinfra prepares, never written)."""

    def accepted(value) -> bool:
        try:
            knob.coerce(value)
        except ConfigError:
            return False
        return True

    return accepted


@pytest.fixture(scope="module")
def dotenv():
    return compose_v1_dotenv()


def test_every_string_env_knob_has_a_strategy_or_takes_any_text():
    constrained = {k.name for k in STRING_ENV_KNOBS if k.check is not None and k.name not in STRATEGIES}
    # knobs whose only check is the .env one take arbitrary text, filtered by the knob itself
    assert {k.name for k in STRING_ENV_KNOBS} >= set(STRATEGIES)
    assert constrained <= {"model", "served_model_name", "hf_token"}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_legal_string_knob_values_read_back_exactly(dotenv, data):
    values = {
        knob.name: knob.coerce(data.draw(STRATEGIES.get(knob.name, text).filter(legal(knob)), label=knob.name))
        for knob in STRING_ENV_KNOBS
    }
    try:
        env_text = render_env(settings_for_host({**PROFILE, **values}, variables=[]))
    except ConfigError:
        assume(False)
    expected = {knob.env: values[knob.name] for knob in STRING_ENV_KNOBS}
    ours = parse_dotenv(env_text)
    compose_v1 = dotenv.dotenv_values(stream=io.StringIO(env_text), interpolate=True)
    for env, value in expected.items():
        assert ours[env] == value, env
        assert compose_v1[env] == value, env
