"""Read pyinfra's end-of-run results table: how many hosts changed, failed or had nothing to do."""

from __future__ import annotations

from dataclasses import dataclass

NUMBER_COLUMNS = 4  # Hosts, Success, Error, No Change


@dataclass(frozen=True)
class OperationResult:
    hosts: int
    success: int  # changed something
    error: int
    no_change: int


def _count(cell: str) -> int:
    return 0 if cell == "-" else int(cell)


def parse_results(output: str) -> dict[str, OperationResult]:
    """Rows of the `--> Results:` table keyed by operation name ("Grand total" included)."""
    results: dict[str, OperationResult] = {}
    lines = output.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "--> Results:")
    except StopIteration:
        return results
    for line in lines[start + 1 :]:
        words = line.split()
        if not words or line.startswith("-->"):
            if results:
                break
            continue
        if words[0] == "Operation" and words[-2:] == ["No", "Change"]:
            continue
        cells = words[-NUMBER_COLUMNS:]
        if len(words) <= NUMBER_COLUMNS or not all(c == "-" or c.isdigit() for c in cells):
            continue
        name = " ".join(words[:-NUMBER_COLUMNS])
        results[name] = OperationResult(*(_count(c) for c in cells))
    return results
