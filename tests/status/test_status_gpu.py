"""GPU health in status judged, cases as data (tests/status/gpu_cases/*.json): each starts from a real capture in
tests/fixtures/nvidia-smi/ ("from"), with the cells a case changes listed in "hand_edited" (its name then says
hand-edited) and kernel log lines written by hand in the driver's documented Xid format ("hand_written"). The
whole status script on a rig of this machine (tests/status_sandbox.py) is checked at the end: the GPU sections,
the table cell and the details.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from status_sandbox import KERNEL_BOOT_LINE, Models, api_port, rig  # noqa: F401

from rigkit.nvidia_smi import parse_health_csv
from rigkit.status.gpu import NO_TOOLING, GpuLimits, judge_gpus
from rigkit.status.report import format_report
from rigkit.status.rig import OK, UNHEALTHY

CASES = Path(__file__).parent / "gpu_cases"
FIXTURES = Path(__file__).parent.parent / "fixtures" / "nvidia-smi"


def _column(header_cell: str) -> str:
    return header_cell.split(" [", 1)[0].strip()


def query_text(spec: dict) -> str:
    """The query section's text of a case: a real capture, its named cells changed, `exit=N` last."""
    if "text" in spec:
        return spec["text"]
    lines = [line for line in (FIXTURES / spec["from"]).read_text().splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("exit=")]
    if "rename" in spec:
        lines[0] = lines[0].replace(*spec["rename"])
    header = [cell.strip() for cell in lines[0].split(",")]
    columns = [_column(cell) for cell in header]
    rows = [[cell.strip() for cell in line.split(",")] for line in lines[1:]]
    for row_index, cells in spec.get("hand_edited", {}).items():
        for column, value in cells.items():
            assert column in columns, f"{column} is not a column of {spec['from']}"
            rows[int(row_index)][columns.index(column)] = value
    rows = [row for i, row in enumerate(rows) if i not in spec.get("drop_rows", [])]
    text = [", ".join(header)] + [", ".join(row) for row in rows] + spec.get("append", [])
    return "\n".join(text + [f"exit={spec.get('exit', 0)}"])


def kernel_log_text(spec) -> str:
    if spec is None:
        return ""
    lines = spec.get("hand_written", [])
    if "from" in spec:
        lines = [line for line in (FIXTURES / spec["from"]).read_text().splitlines() if not line.startswith("exit=")]
    return "\n".join([f"source={spec['source']}", f"matched={len(lines)}", *lines])


def case_ids() -> list[str]:
    return sorted(path.stem for path in CASES.glob("*.json"))


@pytest.mark.parametrize("name", case_ids())
def test_gpu_health_case(name):
    case = json.loads((CASES / f"{name}.json").read_text())
    limits = replace(GpuLimits.defaults(), **case.get("limits", {}))
    report = judge_gpus(
        query_text(case["query"]), kernel_log_text(case["kernel_log"]), limits, case.get("stack_running", True)
    )
    expect = case["expect"]
    findings = sorted([f.level, f.gpu, f.short] for f in report.findings)
    assert (report.state, findings) == (expect["state"], sorted(expect["findings"])), [f.text for f in report.findings]
    assert report.tooling == expect.get("tooling", True)
    for key, fields in expect.items():
        if key.startswith("gpu") and key[3:].isdigit():
            gpu = report.gpus[int(key[3:])]
            assert {k: gpu[k] for k in fields} == fields
    for expected in expect.get("xids", []):
        assert any(expected.items() <= xid.items() for xid in report.xids), report.xids
    for finding in report.findings:  # every reason names the GPU and carries its figure
        assert finding.gpu in finding.text or finding.gpu == "GPUs"


def test_every_case_names_its_real_capture_and_says_hand_edited_when_it_edits():
    for name in case_ids():
        case = json.loads((CASES / f"{name}.json").read_text())
        query = case["query"]
        if "from" in query:
            assert (FIXTURES / query["from"]).is_file(), name
        edited = any(key in query for key in ("hand_edited", "rename", "drop_rows", "append"))
        written = bool((case["kernel_log"] or {}).get("hand_written"))
        assert name.startswith("hand-edited") == edited, name
        if written and not edited:
            assert name.startswith("hand-written"), name


def test_the_captured_mask_and_its_named_columns_agree():
    """The real capture has clocks_event_reasons.active and one column per reason: the mask decodes to them."""
    text = (FIXTURES / "gpu-check-2026-12-03" / "nvidia-smi-query-gpu.csv").read_text()
    (from_mask,), _ = parse_health_csv(text)
    header, row = text.splitlines()[:2]
    named = {_column(h): v.strip() for h, v in zip(header.split(","), row.split(","))}
    named.pop("clocks_event_reasons.active")
    without_mask = "\n".join([", ".join(named), ", ".join(named.values())])
    (from_columns,), _ = parse_health_csv(without_mask)
    assert from_mask.clock_reasons == from_columns.clock_reasons == ("gpu_idle",)


def test_the_script_on_a_rig_reads_gpu_health_and_xids_in_its_one_round_trip(rig):
    status = rig.status()
    assert status.state == OK and status.gpu["state"] == OK, (status.unhealthy, status.warnings)
    assert status.gpu["kernel_log"]["source"] == "journal" and status.gpu["gpus"][0]["temperature_c"] == 36.0
    shown = json.loads(json.dumps(status.as_dict()))["gpu"]  # as --json prints it
    assert shown["gpus"][0]["clock_reasons"] == ["gpu_idle"] and shown["findings"] == []
    report = format_report([status])
    assert "1x 36C 79/700W" in report.splitlines()[1]
    assert "Xids since boot: 0, read from journalctl -k -b" in report

    rig.kernel_log(
        [KERNEL_BOOT_LINE, "Dec 03 11:40:02 rig1 kernel: NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus."]
    )
    status = rig.status()
    assert status.state == UNHEALTHY and any(
        line.startswith("gpu: GPU at 0000:00:06 Xid 79") for line in status.unhealthy
    )
    assert "GPU at 0000:00:06 Xid 79" in format_report([status]).splitlines()[1]


def test_the_kernel_log_falls_back_to_dmesg_and_says_when_neither_answers(rig):
    rig.kernel_log([])  # journalctl -k shows this user no kernel line
    rig.tool("dmesg", "echo '[    0.000000] Linux version 6.18.44'")
    status = rig.status()
    assert status.gpu["kernel_log"]["source"] == "dmesg" and status.state == OK
    rig.tool("dmesg", "exit 1")
    status = rig.status()
    assert status.gpu["kernel_log"]["source"] == "none"
    assert any("Xids not checked" in warning for warning in status.warnings) and status.state == OK


def test_a_driver_that_refuses_todays_reason_names_is_asked_with_the_legacy_ones(rig):
    legacy = (FIXTURES / "gpu-check-2026-12-03" / "nvidia-smi-query-gpu.csv").read_text()
    legacy = legacy.replace("clocks_event_reasons.", "clocks_throttle_reasons.")
    (rig.root / "legacy.csv").write_text(legacy)
    rig.tool(
        "nvidia-smi",
        'case "$1" in *clocks_event_reasons*) echo \'Field "clocks_event_reasons.active" is not a valid field to '
        f"query.'; exit 2;; --query-gpu=*) grep -v '^exit=' {rig.root}/legacy.csv;; *) echo 'Driver Version: 470.256.02';; esac",
    )
    status = rig.status()
    assert status.gpu["query_error"] is None and status.gpu["gpus"][0]["clock_reasons"] == ["gpu_idle"]


def test_a_rig_without_nvidia_smi_says_no_gpu_tooling_once(rig):
    (rig.bin / "nvidia-smi").unlink()
    status = rig.status()
    assert status.state == OK and status.gpu == {**status.gpu, "tooling": False, "findings": []}
    report = format_report([status])
    assert report.count(NO_TOOLING) == 1 and "nvidia-smi failed" not in report
