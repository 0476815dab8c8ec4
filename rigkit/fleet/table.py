"""rigkit deploy's summary table: one row per rig (status, step, release, reason) in the terminal's width, the
reasons it cannot show whole following it."""

from __future__ import annotations

import re
import shutil
import textwrap
from typing import Optional, Sequence

from rigkit.fleet.outcome import RigOutcome

# The summary table: the terminal's width (this when it has none, e.g. output to a pipe), the step column
# cut to STEP_CHARS, the reason column at least REASON_MIN_CHARS wide and at most REASON_LINES lines.
TABLE_WIDTH_FALLBACK = 100
STEP_CHARS = 32
REASON_MIN_CHARS = 24
REASON_LINES = 2
# a rigkit error's text: field=value: problem. Fix: fix
RIGKIT_ERROR_RE = re.compile(
    r"^(?P<field>[^\s=]+)=(?P<value>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\S+): "
    r"(?P<problem>.*?)(?:\. Fix: (?P<fix>.*))?$"
)


def table_width() -> int:
    """The terminal's width (COLUMNS first, as shutil reads it), TABLE_WIDTH_FALLBACK without a terminal."""
    return shutil.get_terminal_size((TABLE_WIDTH_FALLBACK, 24)).columns


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _wrap(text: str, width: int, **indents) -> list[str]:
    """Lines of at most ``width``; an image reference is cut only where it is longer than a line."""
    return textwrap.wrap(text, width, break_on_hyphens=False, **indents)


def reason_headline(reason: str) -> str:
    """What the table shows of a reason: a rigkit error's problem without its field=value (a digest is 80
    characters) and fix, which the full reason under the table gives; any other reason as it is."""
    match = RIGKIT_ERROR_RE.match(reason)
    return match.group("problem") if match else reason


def format_table(outcomes: Sequence[RigOutcome], width: Optional[int] = None) -> str:
    """One row per rig in ``width`` columns (default: the terminal's): the step cut, the reason last, wrapped
    in its column (under the row when the terminal leaves it less than REASON_MIN_CHARS) and cut after
    REASON_LINES lines; every reason the table does not show whole follows it in full, as do the notes."""
    width = width or table_width()
    header = ("rig", "status", "step", "release", "reason")
    rows = [header] + [
        (o.rig, o.status, _cut(o.step or "-", STEP_CHARS), o.release or "-", reason_headline(o.reason) or "-")
        for o in outcomes
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    column = sum(widths) + 2 * len(widths)  # where the reason column starts
    beside = width - column >= REASON_MIN_CHARS
    room = width - column if beside else width - 4
    indent = " " * (column if beside else 4)
    lines, shown_whole = [], set()
    for index, row in enumerate(rows):
        wrapped = _wrap(row[-1], room) or ["-"]
        if index and len(wrapped) <= REASON_LINES and row[-1] == outcomes[index - 1].reason:
            shown_whole.add(row[0])
        if len(wrapped) > REASON_LINES:
            wrapped = wrapped[: REASON_LINES - 1] + [_cut(" ".join(wrapped[REASON_LINES - 1 :]), room)]
        cells = "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:-1]))
        if beside:
            lines += [f"{cells}  {wrapped[0]}".rstrip()] + [indent + more for more in wrapped[1:]]
        else:
            lines += [cells.rstrip()] + [indent + more for more in wrapped]
    for outcome in outcomes:
        if outcome.reason and outcome.rig not in shown_whole:
            lines += _wrap(f"{outcome.rig}: {outcome.reason}", width, subsequent_indent="    ")
        for note in outcome.notes:
            lines += _wrap(f"{outcome.rig}: note: {note}", width, initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines)
