"""The status table fits a terminal; the details under it name every drift in full."""

from __future__ import annotations

from status_sandbox import IMAGE_1

from rigkit.status.drift import Drift
from rigkit.status.report import TABLE_WIDTH, format_report
from rigkit.status.rig import RigStatus


def test_a_long_table_fits_a_terminal():
    statuses = [
        RigStatus(
            f"rig-with-a-rather-long-name-{i}",
            image=IMAGE_1,
            drift=[
                Drift(".env", knob, "'a'", "'b'")
                for knob in ("served_model_name", "max_model_len", "max_num_batched_tokens")
            ],
            health={"engine": "ok", "container": "rigkit-serving restarting", "api": "down"},
            ledger={
                "kind": "rollback",
                "smoke": "fail",
                "deployed_at": "2026-12-01T12:30:05+00:00",
                "note": "automatic: deploy failed " * 20,
            },
            driver="580.159.04",
            cuda="13.0",
        )
        for i in range(3)
    ]
    for status in statuses:
        status.unhealthy = ["container: rigkit-serving restarting"]
    report = format_report(statuses)
    table = report.split("\n")[: len(statuses) + 1]
    assert max(len(line) for line in table) <= TABLE_WIDTH
    assert table[0].split()[:3] == ["rig", "state", "image"]
    assert (
        "drift .env: max_model_len: the rig has 'a'; today's data renders 'b'" in report
    )  # the details name every knob in full
