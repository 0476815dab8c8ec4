"""Drift: a rig edited by hand, or data changed since the deploy, is named per knob; a secret is compared, never shown.

Each case runs the real script on a rig made on this machine (tests/status_sandbox.py).
"""

from __future__ import annotations

import json

from status_sandbox import IMAGE_1, IMAGE_2, Rig, api_port, made_up_inspect, rig, stack_of  # noqa: F401

from rigkit.serving.commands import rendering_for
from rigkit.status.drift import Drift
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
