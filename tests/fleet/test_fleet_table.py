"""rigkit.fleet.table: rigkit deploy's summary table, from the outcomes of real captured pyinfra output
(tests/fixtures/fleet/), in the terminal's width."""

from __future__ import annotations

import os

import pytest

from test_fleet_outcome import FIXTURES, connected, hung_registry_fixture
from rigkit.fleet.outcome import FAILED, summarize
from rigkit.fleet.table import TABLE_WIDTH_FALLBACK, format_table, table_width


def test_table_has_a_header_and_a_row_per_rig():
    outcomes = summarize("    [rig1] Connected\n--> Results:\n", ["rig1"])
    table = format_table(list(outcomes.values()))
    assert table.splitlines()[0].split() == ["rig", "status", "step", "release", "reason"]
    assert table.splitlines()[1].split()[:2] == ["rig1", "ok"]


@pytest.mark.parametrize("fixture", ["registry-hung-refused.txt", "release-rolled-back.txt", "lock-refused.txt"])
@pytest.mark.parametrize("width", [80, 100, 160])
def test_the_table_fits_the_terminal_and_the_full_reason_follows_it(fixture, width):
    text = (FIXTURES / fixture).read_text()
    outcomes = list(summarize(text, connected(text)).values())
    for outcome in outcomes:
        outcome.release = "c34791316a6f deploy smoke=pass"
    table = format_table(outcomes, width=width)
    lines = table.splitlines()
    header = lines[0].split() + (lines[1].split() if lines[1].strip() == "reason" else [])  # reason under a row
    assert header == ["rig", "status", "step", "release", "reason"]
    assert max(len(line) for line in lines) <= width
    flat = "".join("".join(line.split()) for line in lines)  # a long word (a digest) is broken across lines
    for outcome in outcomes:
        assert "".join(outcome.reason.split()) in flat  # whole, under the table
        row = next(line for line in lines if line.startswith(outcome.rig + " "))  # "rig4: ..." is the full reason
        assert outcome.release in row and FAILED in row.split()


def test_the_table_shows_the_problem_and_the_reason_below_names_field_value_and_fix():
    text = hung_registry_fixture()
    name = connected(text)[0]
    outcomes = [summarize(text, [name])[name]]
    lines = format_table(outcomes, width=100).splitlines()
    assert "image: registry" in lines[1] and "sha256" not in lines[1]  # the digest stays out of the row
    below = [line for line in lines[2:] if line.startswith(f"{name}: ")]
    assert below and below[0].startswith(f"{name}: serving_image='127.0.0.1:5000/")
    ok = summarize("    [rig1] Connected\n--> Results:\n", ["rig1"])["rig1"]
    assert format_table([ok], width=100).splitlines()[1:] == ["rig1  ok      -     -        -"]


def test_the_table_width_is_the_terminal_s_or_the_fallback(monkeypatch):
    monkeypatch.setenv("COLUMNS", "123")
    assert table_width() == 123
    monkeypatch.delenv("COLUMNS")
    assert table_width() in (TABLE_WIDTH_FALLBACK, os.get_terminal_size(1).columns if os.isatty(1) else -1)
