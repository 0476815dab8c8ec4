"""`rigkit status` shows the model (issue 43): the pinned model_source, its revision, and whether the rig's staged copy
matches it, in the table, the details and --json. Before, a rig's model showed only as drift when it was wrong."""

from __future__ import annotations

import json

import pytest

from rigkit.settings.model_source import parse_model_source
from rigkit.status.report import format_report
from rigkit.status.rig import NOT_STAGED, STAGED_DAMAGED, STAGED_MATCHES, STAGED_UNREADABLE, RigStatus, model_report

PIN = parse_model_source("org/tiny@" + "c0ffee" * 6 + "c0ff")
DAMAGED = json.dumps({"staged": True, "damaged": [{"path": "model.safetensors", "why": "resized"}]})


@pytest.mark.parametrize(
    ("section", "staged", "damaged"),
    [
        ('checking\n{"staged": true, "manifest": "ab", "damaged": []}\n', STAGED_MATCHES, []),
        ('{"staged": false, "damaged": []}', NOT_STAGED, []),
        (DAMAGED, STAGED_DAMAGED, ["model.safetensors"]),
        ("", STAGED_UNREADABLE, []),
        (None, STAGED_UNREADABLE, []),
        ("[]", STAGED_UNREADABLE, []),
    ],
)
def test_the_model_report_names_the_pin_and_whether_the_staged_copy_matches(section, staged, damaged):
    assert model_report(PIN, section) == {
        "source": PIN.spec,
        "kind": "hub",
        "name": "org/tiny",
        "revision": PIN.revision,
        "staged": staged,
        "damaged": damaged,
    }


def test_the_table_the_details_and_json_show_the_model():
    pinned = RigStatus("rig1", model=model_report(PIN, DAMAGED))
    unpinned = RigStatus("rig2")
    text = format_report([pinned, unpinned])
    header, first, second = text.splitlines()[:3]
    assert header.split()[:6] == ["rig", "state", "image", "last", "release", "model"]
    assert f"{PIN.revision[:12]} damaged" in first and " - " in second
    assert f"  model {PIN.spec} (hub): staged copy damaged (model.safetensors)" in text.splitlines()
    assert json.loads(json.dumps(pinned.as_dict()))["model"]["staged"] == STAGED_DAMAGED
    assert unpinned.as_dict()["model"] is None


def test_a_table_of_rigs_pinning_no_model_keeps_its_columns():
    assert format_report([RigStatus("rig2")]).splitlines()[0].split() == [
        "rig", "state", "image", "last", "release", "gpu", "L2", "what"
    ]  # fmt: skip
