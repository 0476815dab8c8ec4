"""A stored rendering read back: its hash, image, labels, the env the container must see, the
connector. Checked against real renderings of the profiles (rigkit.serving.render), not hand-written text."""

import pytest

from rigkit.paths import RIG_RELEASES_DIR
from rigkit.serving.ledger import Rendering, parse_dotenv, release_hash, rendering_dir
from rigkit.serving.render import dotenv_line, env_values, render_compose, render_env
from rigkit.settings.hostdata import settings_for_host

CPU_IMAGE = "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64
MP_IMAGE = "lmcache/vllm-openai@sha256:" + "2" * 64


def rendering_of(settings) -> Rendering:
    return Rendering(render_compose(settings), render_env(settings))


def cpu_lab(**knobs):
    return settings_for_host(
        {"serving_profile": "cpu-lab", "serving_image": CPU_IMAGE, "model": "/models/tiny", **knobs}, variables=[]
    )


def test_hash_is_the_release_hash_of_both_files():
    rendering = rendering_of(cpu_lab())
    assert rendering.hash == release_hash(rendering.compose, rendering.env)
    assert rendering.as_dict() == {"compose": rendering.compose, "env": rendering.env, "digest": rendering.hash}


def test_a_knob_change_changes_the_hash_and_is_read_back():
    a, b = rendering_of(cpu_lab(served_model_name="tiny-a")), rendering_of(cpu_lab(served_model_name="tiny-b"))
    assert a.hash != b.hash
    assert (a.knob("served_model_name"), b.knob("served_model_name")) == ("tiny-a", "tiny-b")


def test_reads_image_labels_and_knobs_of_what_was_rendered():
    settings = cpu_lab(serving_port=8123, bind_address="0.0.0.0")
    rendering = rendering_of(settings)
    assert rendering.image == CPU_IMAGE
    assert rendering.profile == "cpu-lab"
    assert rendering.knobs_hash == settings.knobs_hash
    assert (rendering.knob("serving_port"), rendering.knob("bind_address")) == ("8123", "0.0.0.0")
    assert rendering.connector == "ExampleConnector"


@pytest.mark.parametrize(
    "settings",
    [
        cpu_lab(hf_token="hf_it's\\a\"token"),
        settings_for_host(
            {
                "serving_profile": "lmcache-mp",
                "serving_image": MP_IMAGE,
                "model": "Qwen/Qwen3-8B",
                "allow_incubating": True,
            },
            variables=[],
        ),
    ],
    ids=["cpu-lab-quoted-token", "lmcache-mp"],
)
def test_container_env_is_what_the_deploy_expects(settings):
    # the env the smoke checks on a restored rendering equals what a fresh deploy of it expects
    expected = dict(env_values(settings)) | dict(settings.profile.fixed_env)
    assert rendering_of(settings).container_env() == expected


def test_dotenv_reads_back_both_quoting_forms():
    lines = [
        dotenv_line("A", "plain value"),
        dotenv_line("B", "it's"),
        dotenv_line("C", 'back\\slash "q" end'),
        dotenv_line("D", ""),
    ]
    assert parse_dotenv("# comment\n" + "\n".join(lines) + "\n") == {
        "A": "plain value",
        "B": "it's",
        "C": 'back\\slash "q" end',
        "D": "",
    }


def test_no_connector_without_a_kv_transfer_config():
    settings = settings_for_host(
        {
            "serving_profile": "prefix-only",
            "model": "Qwen/Qwen3-8B",
            "allow_incubating": True,
            "serving_image": "vllm/vllm-openai@sha256:" + "3" * 64,
        },
        variables=[],
    )
    assert rendering_of(settings).connector is None


def test_rendering_dir_takes_only_a_release_hash():
    assert rendering_dir("a" * 64) == f"{RIG_RELEASES_DIR}/{'a' * 64}"
    for bad in ("", "../x", "a" * 63, "A" * 64, "a" * 64 + "/.."):
        with pytest.raises(ValueError):
            rendering_dir(bad)


# --- what the mutation check (bench/mutation.py) found no test holding ---------------------------------------


def test_dotenv_quoting_edge_cases_read_as_compose_would():
    # a quote needs its closing twin: one quote character alone, or an unterminated quote, is the value as written
    text = "\n".join(
        [
            "E1=''",
            'E2=""',
            "Q1='",
            'Q2="',
            "U1='open",
            'U2="open',
            "M1='mixed\"",
            'D1="a\\"b\\\\c"',  # "a\"b\\c": escapes undone inside double quotes only
            "S1='a\\\"b'",  # single quotes keep the backslash
            "EQ=a=b",  # the first '=' splits
            " PAD =v",  # the name is stripped, the value is not
            "  # an indented comment=1",
            "no equals sign here",
            "",
            "LAST=x",
        ]
    )
    assert parse_dotenv(text) == {
        "E1": "",
        "E2": "",
        "Q1": "'",
        "Q2": '"',
        "U1": "'open",
        "U2": '"open',
        "M1": "'mixed\"",
        "D1": 'a"b\\c',
        "S1": 'a\\"b',
        "EQ": "a=b",
        "PAD": "v",
        "LAST": "x",
    }


def test_release_hash_is_the_sha256_of_compose_nul_env():
    # pinned: the rig's release hash file and every stored rendering's directory name are this digest
    assert release_hash("compose: 1\n", "A=1\n") == "83e0fec3f6747a3537343a2b1c885020ed253d53907204da07cdfca25e855e1b"
    assert release_hash("a", "b") != release_hash("a\0", "b") and release_hash("ab", "") != release_hash("a", "b")
