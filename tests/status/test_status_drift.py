"""Drift: a rig edited by hand, or data changed since the deploy, is named per knob; a secret is compared, never shown.

Each case runs the real script on a rig made on this machine (tests/status_sandbox.py).
"""

from __future__ import annotations

import json

import yaml
from status_sandbox import IMAGE_1, IMAGE_2, Rig, api_port, made_up_inspect, rig, stack_of  # noqa: F401

from rigkit.serving.commands import rendering_for
from rigkit.serving.ledger import release_hash
from rigkit.serving.render import KNOBS_HASH_LABEL, SERVICE_NAME
from rigkit.settings.hostdata import settings_for_host
from rigkit.status.drift import (
    PROFILE_LABEL as PROFILE,
)
from rigkit.status.drift import (
    Drift,
    compose_drift,
    container_drift,
    env_values_drift,
    files_drift,
    for_reading,
    image_drift,
    model_drift,
    rendering_drift,
)
from rigkit.status.probe import Container
from rigkit.status.report import exit_status, format_report
from rigkit.status.rig import DRIFT, OK


def test_a_hand_edited_env_is_drift_naming_the_knob(rig):
    env = rig.stack_dir / ".env"
    env.write_text(env.read_text().replace("RIGKIT_MAX_MODEL_LEN='8192'", "RIGKIT_MAX_MODEL_LEN='4096'"))
    status = rig.status()
    assert status.state == DRIFT
    assert Drift(".env", "max_model_len", "'4096'", "'8192'") in status.drift
    assert [d.source for d in status.drift if d.source == "files"] == ["files"]  # the recorded hash no longer matches
    assert not [d for d in status.drift if d.source == "container"]  # the container still runs what was verified
    assert exit_status([status]) == 1


def test_a_knob_changed_in_data_is_drift_in_the_env_file_and_the_container(rig, api_port, tmp_path):
    today = stack_of(api_port, tmp_path / "l2", served_model_name="tiny-renamed")
    status = rig.status(today)
    assert status.state == DRIFT
    named = {(d.source, d.knob) for d in status.drift}
    assert {(".env", "served_model_name"), ("container", "served_model_name")} <= named
    assert ("files", "release hash") not in named  # the rig's files are still the verified ones
    assert ("compose", "label org.rigkit.knobs-hash") not in named  # explained by the knob itself
    assert status.health["api"] == "ok"  # the API serves what the container was started with


def test_an_engine_flag_changed_in_data_is_named_from_the_compose_command(rig, api_port, tmp_path):
    today = stack_of(api_port, tmp_path / "l2", max_num_seqs=8)
    drift = [d for d in rig.status(today).drift if d.source == "compose"]
    assert Drift("compose", "max_num_seqs", "'<absent>'", "'8'") in drift


def test_a_container_started_from_another_rendering_is_drift(rig):
    rendering = rendering_for(rig.stack)
    rig.inspect(
        made_up_inspect(
            IMAGE_1, rendering.container_env(), True, {**rig.labels, "org.rigkit.knobs-hash": "0123456789abcdef"}
        )
    )
    drift = rig.status().drift
    assert drift == [
        Drift("container", "label org.rigkit.knobs-hash", "'0123456789abcdef'", repr(rendering.knobs_hash))
    ]
    rig.inspect(
        made_up_inspect(
            IMAGE_1,
            rendering.container_env(),
            True,
            {"org.rigkit.profile": "cpu-lab-baseline", "org.rigkit.knobs-hash": "0123456789abcdef"},
        )
    )
    assert [(d.source, d.knob) for d in rig.status().drift] == [("container", "serving_profile")]


def test_another_declared_image_is_drift(rig, api_port, tmp_path):
    today = stack_of(api_port, tmp_path / "l2", serving_image=IMAGE_2)
    image = [d for d in rig.status(today).drift if d.source == "image"]
    assert image == [Drift("image", "serving_image", IMAGE_1, IMAGE_2)]


def test_a_secret_is_compared_but_never_shown(rig, api_port, tmp_path):
    planted, other = "hf_planted_7c1d0e", "hf_today_99aa00"
    deployed = stack_of(api_port, tmp_path / "l2", hf_token=planted)
    rig = Rig(tmp_path, deployed)
    status = rig.status(stack_of(api_port, tmp_path / "l2", hf_token=other))
    secret = [d for d in status.drift if d.knob == "hf_token"]
    assert {d.source for d in secret} == {".env", "container"}
    assert all((d.rig, d.today) == ("<secret>", "<secret>") for d in secret)
    shown = format_report([status]) + json.dumps(status.as_dict())
    assert planted not in shown and other not in shown
    assert rig.status(deployed).state == OK  # the same token: no drift


def test_one_changed_image_reads_as_one_drift_line_saying_what_today_means(rig, api_port, tmp_path):
    """The image, compose.yml's image and the container's knobs-hash label all differ; the report says it once."""
    status = rig.status(stack_of(api_port, tmp_path / "l2", serving_image=IMAGE_2))
    assert len(status.drift) == 3  # the data keeps every place (--json)
    report = format_report([status])
    drift_lines = [line.strip() for line in report.splitlines() if line.strip().startswith("drift ")]
    assert drift_lines == [
        f"drift image, compose: serving_image: the rig has {IMAGE_1}; today's data renders {IMAGE_2}"
    ]
    assert (
        "drift: the rig against what today's data renders (the inventory, group_data and --data of this run" in report
    )


# --- each drift function on plain values, word for word: what the mutation check (bench/mutation.py) found no test
# holding (the status lines print these words as they are) ---------------------------------------------------------

DATA = {"serving_profile": "cpu-lab", "serving_image": IMAGE_1, "gpus": 0}


def todays_rendering():
    return rendering_for(settings_for_host(DATA))


def edited(compose: str, **service) -> str:
    """compose.yml with the serving service's keys replaced (None: removed)."""
    document = yaml.safe_load(compose)
    for key, value in service.items():
        if value is None:
            document["services"][SERVICE_NAME].pop(key)
        else:
            document["services"][SERVICE_NAME][key] = value
    return yaml.safe_dump(document)


def test_image_and_files_drift_in_words():
    assert image_drift(IMAGE_1, IMAGE_1) == []
    assert image_drift(None, IMAGE_1) == [Drift("image", "serving_image", "<no container>", IMAGE_1)]
    assert image_drift(IMAGE_2, IMAGE_1) == [Drift("image", "serving_image", IMAGE_2, IMAGE_1)]
    missing = "stack files", "rendered files"
    assert files_drift(None, None, None) == [Drift("files", missing[0], "compose.yml and .env missing", missing[1])]
    assert files_drift("c", None, None) == [Drift("files", missing[0], ".env missing", missing[1])]
    assert files_drift(None, "e", None) == [Drift("files", missing[0], "compose.yml missing", missing[1])]
    actual = release_hash("c", "e")
    unverified = Drift("files", "release hash", "none recorded (the last release was not verified)", actual[:12])
    assert files_drift("c", "e", None) == files_drift("c", "e", " \n") == [unverified]
    assert files_drift("c", "e", actual + "\n") == []
    assert files_drift("c", "e", "f" * 64) == [
        Drift("files", "release hash", f"hash {actual[:12]} (changed since verified)", f"verified {'f' * 12}")
    ]


def test_env_values_shown_quoted_cut_or_as_secrets():
    long = "x" * 80
    rig = {"RIGKIT_MAX_MODEL_LEN": "4096", "HF_TOKEN": "hf_one", "RIGKIT_KV_STORE_PASSWORD": "", "EXTRA": long}
    today = {"RIGKIT_MAX_MODEL_LEN": "8192", "HF_TOKEN": "hf_two", "RIGKIT_KV_STORE_PASSWORD": "pw", "N": 5}
    assert env_values_drift(".env", rig, today) == [
        Drift(".env", "EXTRA", repr(long)[:59] + "…", "<unset>"),
        Drift(".env", "hf_token", "<secret>", "<secret>"),
        Drift(".env", "N", "<unset>", "5"),
        Drift(".env", "kv_store_password", "<unset>", "<secret>"),
        Drift(".env", "max_model_len", "'4096'", "'8192'"),
    ]
    sixty = "y" * 58  # repr adds two quotes: exactly SHOWN_VALUE_CHARS, shown whole
    assert env_values_drift(".env", {"A": sixty}, {})[0].rig == repr(sixty)
    assert env_values_drift(".env", {"HF_TOKEN": "same"}, {"HF_TOKEN": "same"}) == []


def test_compose_command_flags_named_by_knob_and_compact_values():
    today = todays_rendering().compose
    base = "exec vllm serve --model m \\\n  --max-num-seqs 8 --enforce-eager --dtype=bfloat16 --swap-space"
    rig_command = "exec vllm serve --model m \\\n  --max-num-seqs 16 --dtype=float16 --new-flag -x --swap-space 4"
    assert compose_drift(edited(today, command=[rig_command]), edited(today, command=[base])) == [
        Drift("compose", "command --dtype", "'float16'", "'bfloat16'"),
        Drift("compose", "command --enforce-eager", "'<absent>'", "'null'"),
        Drift("compose", "max_num_seqs", "'16'", "'8'"),
        Drift("compose", "command --new-flag", "'null'", "'<absent>'"),
        Drift("compose", "command --swap-space", "'4'", "'null'"),
    ]
    # the same flags, another launcher or prelude: one line saying so; an unparsable script has no flags
    assert compose_drift(edited(today, command=["set -e; " + base]), edited(today, command=[base])) == [
        Drift("compose", "command", "differs", "the profile's launcher or prelude")
    ]
    assert compose_drift(edited(today, command=["exec 'unclosed --x 1"]), edited(today, command=[base])) == [
        Drift("compose", "command --dtype", "'<absent>'", "'bfloat16'"),
        Drift("compose", "command --enforce-eager", "'<absent>'", "'null'"),
        Drift("compose", "max_num_seqs", "'<absent>'", "'8'"),
        Drift("compose", "command --model", "'<absent>'", "'m'"),
        Drift("compose", "command --swap-space", "'<absent>'", "'null'"),
    ]


def test_compose_keys_environment_and_labels_in_words():
    today = todays_rendering().compose
    service = yaml.safe_load(today)["services"][SERVICE_NAME]
    environment = [line for line in service["environment"] if not line.startswith("RIGKIT_MAX_MODEL_LEN=")]
    labels = {**service["labels"], "org.rigkit.profile": "other", "org.rigkit.extra": "x"}
    rig = edited(
        today,
        restart="no",
        mem_limit="1g",
        environment=environment + ["ONLY_ON_RIG=1"],
        labels=labels,
        command=["exec vllm serve --max-num-seqs 99"],
        extra_key={"a": [1, 2]},
    )
    found = compose_drift(rig, today)
    assert found[:2] == [
        Drift("compose", "restart_policy", "'no'", repr(service["restart"])),
        Drift("compose", "mem_limit_gb", "'1g'", repr(service["mem_limit"])),
    ]
    assert Drift("compose", "label org.rigkit.extra", "'x'", "'null'") in found
    assert Drift("compose", "label org.rigkit.profile", "'other'", "'cpu-lab'") in found
    assert Drift("compose", "max_model_len", "'not declared'", "'declared'") not in found
    assert Drift("compose", "max_model_len", "not declared", "declared") in found
    assert Drift("compose", "ONLY_ON_RIG", "declared", "not declared") in found
    assert Drift("compose", "max_num_seqs", "'99'", "'<absent>'") in found  # the command's drift kept beside the rest
    assert found[-1] == Drift("compose", "extra_key", "'{\"a\":[1,2]}'", "'null'")
    long_label = {**service["labels"], "org.rigkit.stack": "s" * 70}
    assert compose_drift(edited(today, labels=long_label), today) == [
        Drift("compose", "label org.rigkit.stack", repr("s" * 59 + "…"), "'serving'")
    ]
    assert compose_drift(None, today) == []
    unreadable = [Drift("compose", "compose.yml", f"unreadable (no services.{SERVICE_NAME})", "rendered")]
    assert compose_drift("services: {}", today) == compose_drift("- a", today) == compose_drift(":\n-", today)
    assert compose_drift("services: {}", today) == unreadable


def test_rendering_and_container_drift_name_the_knobs_hash_only_when_nothing_else_explains_it():
    today = todays_rendering()
    service = yaml.safe_load(today.compose)["services"][SERVICE_NAME]
    relabelled = edited(today.compose, labels={**service["labels"], KNOBS_HASH_LABEL: "0" * 16})
    hash_only = rendering_drift(relabelled, today.env, today)
    assert hash_only == [Drift("compose", f"label {KNOBS_HASH_LABEL}", repr("0" * 16), repr(today.knobs_hash))]
    env = today.env.replace("RIGKIT_MAX_MODEL_LEN='8192'", "RIGKIT_MAX_MODEL_LEN='4096'")
    assert rendering_drift(relabelled, env, today) == [Drift(".env", "max_model_len", "'4096'", "'8192'")]
    assert rendering_drift(today.compose, None, today) == []
    declared = today.container_env()
    labels = {"org.rigkit.profile": "cpu-lab", KNOBS_HASH_LABEL: today.knobs_hash}

    def container(env, labels):
        return Container("rigkit-serving", IMAGE_1, True, "running", None, 0, env=env, labels=labels)

    assert container_drift(container({**declared, "UNDECLARED": "1"}, labels), today) == []
    other_hash = {**labels, KNOBS_HASH_LABEL: "f" * 16}
    assert container_drift(container(declared, other_hash), today) == [
        Drift("container", f"label {KNOBS_HASH_LABEL}", repr("f" * 16), repr(today.knobs_hash))
    ]
    changed = {**declared, "RIGKIT_MAX_MODEL_LEN": "4096"}
    assert container_drift(container(changed, {KNOBS_HASH_LABEL: "f" * 16}), today) == [
        Drift("container", "max_model_len", "'4096'", "'8192'"),
        Drift("container", "serving_profile", "'null'", "'cpu-lab'"),
    ]


def test_model_drift_in_words():
    assert model_drift(None, "org/m@abc") == [Drift("model", "model_source", "<not readable>", "org/m@abc")]
    assert (
        model_drift("no json here", "m")
        == model_drift("", "m")
        == [Drift("model", "model_source", "<not readable>", "m")]
    )
    assert model_drift('progress\n{"staged": false}\n', "m") == [Drift("model", "model_source", "<not staged>", "m")]
    assert model_drift('{"staged": true}', "m") == []
    damaged = json.dumps({"staged": True, "damaged": [{"path": "a.safetensors", "why": "size 1, manifest 2"}]})
    assert model_drift("checking\n" + damaged, "m") == [
        Drift("model", "model_source: a.safetensors", "size 1, manifest 2", "as the manifest")
    ]


def test_for_reading_one_line_per_knob_naming_every_place():
    drifts = [
        Drift("image", "serving_image", IMAGE_2, IMAGE_1),
        Drift("compose", "serving_image", "'x'", "'y'"),
        Drift("compose", f"label {KNOBS_HASH_LABEL}", "'a'", "'b'"),
        Drift("compose", "serving_image", "'x'", "'y'"),
    ]
    assert for_reading(drifts) == [Drift("image, compose", "serving_image", IMAGE_2, IMAGE_1)]
    assert for_reading(drifts[2:3]) == drifts[2:3]


def test_drift_edge_values_a_hand_edited_compose_may_hold():
    today = todays_rendering().compose
    service = yaml.safe_load(today)["services"][SERVICE_NAME]
    # a command split in several items, a bare flag before a line continuation
    split = ["exec", "vllm", "--enforce-eager", "\\\n", "--max-num-seqs", "8"]
    assert compose_drift(edited(today, command=split), edited(today, command=["exec", "vllm --max-num-seqs", "8"])) == [
        Drift("compose", "command --enforce-eager", "'null'", "'<absent>'")
    ]
    # a label only today's rendering has; a value of exactly 60 characters shown whole; a date YAML parsed
    labels = {name: value for name, value in service["labels"].items() if name != "org.rigkit.stack"}
    assert compose_drift(edited(today, labels=labels), today) == [
        Drift("compose", "label org.rigkit.stack", "'null'", "'serving'")
    ]
    sixty = "s" * 60
    assert compose_drift(edited(today, restart=sixty), today)[0].rig == repr(sixty)
    dated = edited(today).replace("restart: ", "built: 2026-12-03\n    restart: ", 1)
    assert Drift("compose", "built", repr('"2026-12-03"'), "'null'") in compose_drift(dated, today)
    # an environment line whose value holds '='
    environment = service["environment"] + ["ONLY_ON_RIG=a=b"]
    assert compose_drift(edited(today, environment=environment), today) == [
        Drift("compose", "ONLY_ON_RIG", "declared", "not declared")
    ]
    # a value that is no string is shown as JSON
    assert env_values_drift(".env", {"FLAG": True, "LIST": ["a"]}, {}) == [
        Drift(".env", "FLAG", "true", "<unset>"),
        Drift(".env", "LIST", '["a"]', "<unset>"),
    ]


def test_a_container_of_another_profile_shows_its_profile():
    today = todays_rendering()
    container = Container(
        "rigkit-serving", IMAGE_1, True, "running", None, 0, env=today.container_env(), labels={PROFILE: "gpu"}
    )
    assert container_drift(container, today) == [Drift("container", "serving_profile", "'gpu'", "'cpu-lab'")]
