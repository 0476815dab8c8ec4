"""profiles.yaml: the registry loads, A/B pairs are derived, errors name the profile and field."""

import textwrap

import pytest

from rigkit.errors import ConfigError
from rigkit.settings.knobs import KNOBS_BY_NAME
from rigkit.settings.profiles import ab_pair, load_profiles, parse_profiles, without_connector

CONNECTOR_FIELDS = {"name", "doc", "connector", "baseline_of"}

MINIMAL = """
common: {knobs: [model], engine_args: [--enable-prefix-caching]}
profiles:
  one:
    doc: d
    status: production
    image_repo: example/vllm
    launcher: vllm serve "${RIGKIT_MODEL}"
    resources: {gpus: 1, min_ram_gb: 8}
    connector: {kv_transfer_config: {kv_connector: OffloadingConnector, kv_role: kv_both}, knobs: [l1_size_gb]}
"""


def _without(profile, fields=CONNECTOR_FIELDS):
    return {key: value for key, value in profile.model_dump().items() if key not in fields}


def test_required_profiles_exist_with_their_needs():
    profiles = load_profiles()
    assert {"lmcache-mp", "native-offload", "prefix-only", "cpu-lab"} <= set(profiles)
    assert profiles["lmcache-mp"].status == "incubating"
    assert profiles["lmcache-mp"].connector.kv_transfer_config["kv_connector"] == "LMCacheMPConnector"
    assert profiles["native-offload"].connector.kv_transfer_config["kv_connector"] == "OffloadingConnector"
    assert profiles["prefix-only"].connector is None
    assert profiles["cpu-lab"].connector.kv_transfer_config["kv_connector"] == "ExampleConnector"
    assert profiles["cpu-lab"].needs_gpus is False
    assert all(profiles[name].needs_gpus for name in ("lmcache-mp", "native-offload", "prefix-only"))
    assert profiles["lmcache-mp"].resources.kv_bytes_per_token == 131_000
    assert profiles["lmcache-mp"].uses_l1 and profiles["lmcache-mp"].l2_mode == "optional"
    assert profiles["cpu-lab"].l2_mode == "always"


def test_every_knob_a_profile_reads_is_declared():
    for profile in load_profiles().values():
        for name in profile.all_knobs + list(profile.defaults):
            assert name in KNOBS_BY_NAME, (profile.name, name)


def test_lmcache_reads_the_four_knobs_through_env():
    envs = {KNOBS_BY_NAME[name].env for name in load_profiles()["lmcache-mp"].env_knobs}
    assert {"LMCACHE_L1_GB", "LMCACHE_L2", "LMCACHE_L2_ADAPTER", "LMCACHE_CHUNK_SIZE"} <= envs


def test_prefix_only_is_native_offload_without_its_connector():
    profiles = load_profiles()
    with_connector, without = ab_pair(profiles, "native-offload")
    assert with_connector.name == "native-offload" and without.name == "prefix-only"
    assert _without(with_connector) == _without(without)
    assert set(with_connector.all_knobs) - set(without.all_knobs) == {"l1_size_gb"}
    assert ab_pair(profiles, "prefix-only") == (with_connector, without)


def test_ab_pair_derives_a_baseline_for_any_connector_profile():
    profiles = load_profiles()
    for name in ("lmcache-mp", "cpu-lab"):
        with_connector, without = ab_pair(profiles, name)
        assert with_connector is profiles[name] and without.connector is None
        assert _without(with_connector) == _without(without)


def test_declared_baseline_reuses_its_base():
    profiles = load_profiles()
    assert profiles["lmcache-mp-baseline"] == without_connector(
        profiles["lmcache-mp"], name="lmcache-mp-baseline", doc=None
    )


def test_common_knobs_and_args_are_merged():
    profile = parse_profiles(MINIMAL)["one"]
    assert profile.knobs == ["model"] and profile.engine_args == ["--enable-prefix-caching"]
    assert profile.all_knobs == ["model", "l1_size_gb"]


@pytest.mark.parametrize(
    "change, where",
    [
        (("status: production", "status: beta"), "profiles.one.status"),
        (("gpus: 1", "gpus: -1"), "profiles.one.resources.gpus"),
        (("knobs: [l1_size_gb]", "knobs: [l1_size_gib]"), "profiles.one.connector.knobs"),
        (("launcher:", "lancher:"), "profiles.one"),
        (("kv_role: kv_both}", 'kv_role: kv_both, extra: "@l3_bytes"}'), "profiles.one.connector.kv_transfer_config"),
    ],
)
def test_validation_errors_name_profile_and_field(change, where):
    with pytest.raises(ConfigError) as caught:
        parse_profiles(MINIMAL.replace(*change))
    assert where in caught.value.field


def test_tag_image_in_a_profile_is_refused():
    text = MINIMAL.replace("image_repo: example/vllm", "image_repo: example/vllm\n    image: example/vllm:latest")
    with pytest.raises(ConfigError) as caught:
        parse_profiles(text)
    assert "profiles.one.image" in caught.value.field and "rigkit resolve" in str(caught.value)


def test_bad_default_names_the_profile_and_knob():
    text = MINIMAL.replace("resources:", "defaults: {restart_policy: sometimes}\n    resources:")
    with pytest.raises(ConfigError) as caught:
        parse_profiles(text)
    assert "profiles.one.defaults.restart_policy" in caught.value.field


@pytest.mark.parametrize(
    "entry, where",
    [
        ("two: {baseline_of: nothing}", "profiles.two.baseline_of"),
        ("two: {baseline_of: one, image_repo: x}", "profiles.two"),
    ],
)
def test_bad_baselines_refused(entry, where):
    with pytest.raises(ConfigError) as caught:
        parse_profiles(MINIMAL + textwrap.indent(entry, "  ") + "\n")
    assert where in caught.value.field


def test_ab_pair_of_a_profile_without_connector_or_base():
    profiles = parse_profiles(MINIMAL)
    bare = without_connector(profiles["one"], name="bare").model_copy(update={"baseline_of": None})
    with pytest.raises(ConfigError):
        ab_pair({"bare": bare}, "bare")


# --- the file parsed strictly (issue 25) -----------------------------------------------------------------------


def _refused(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_profiles(text)
    return caught.value


PROFILE_TWICE = (
    MINIMAL
    + """
  one:
    doc: the same name again
    status: production
    image_repo: example/other
    launcher: x
    resources: {gpus: 0, min_ram_gb: 1}
"""
)


@pytest.mark.parametrize(
    "text, where, problem, fix",
    [
        (PROFILE_TWICE, "yaml", "'one' is given twice in one mapping (first at line 4)", "keep one of them"),
        (
            MINIMAL.replace("    status:", "    stauts: production\n    status:"),
            "profiles.one.stauts",
            "unknown key",
            "did you mean 'status'?",
        ),
        (
            MINIMAL.replace("knobs: [l1_size_gb]", "knobs: [l1_size_gib]"),
            "profiles.one.connector.knobs",
            "unknown knob 'l1_size_gib'",
            "",
        ),
        (
            MINIMAL.replace("common: {knobs: [model]", "common: {knobs: model"),
            "common.knobs",
            "must be a list, got str",
            "knobs: [model]",
        ),
        (
            MINIMAL.replace("    resources:", "    engine_args: --enforce-eager\n    resources:"),
            "profiles.one.engine_args",
            "must be a list",
            "engine_args: [--enforce-eager]",
        ),
        (MINIMAL.replace("common:", "comon:"), "top level.comon", "unknown key", "did you mean 'common'?"),
        (
            MINIMAL.replace("    resources:", "    defaults: {chunk_size: 512}\n    resources:"),
            "profiles.one.defaults.chunk_size",
            "never reads",
            "add chunk_size to the profile's knobs",
        ),
        (
            MINIMAL.replace("kv_role: kv_both}", 'kv_role: kv_both, path: "@l2_dir"}'),
            "profiles.one.connector.kv_transfer_config",
            "uses @l2_dir but the connector has no L2 tier",
            "l2",
        ),
        (
            MINIMAL + "  twice: {baseline_of: one-baseline}\n  one-baseline: {baseline_of: one}\n",
            "profiles.twice.baseline_of",
            "is itself a baseline",
            "'one'",
        ),
        (
            MINIMAL + "  one-baseline: {baseline_of: onee}\n",
            "profiles.one-baseline.baseline_of",
            "no profile 'onee'",
            "did you mean 'one'?",
        ),
    ],
)
def test_the_profiles_file_is_parsed_strictly(text, where, problem, fix):
    error = _refused(text)
    assert error.field == f"profiles.yaml: {where}" and problem in error.problem and fix in error.fix, str(error)
