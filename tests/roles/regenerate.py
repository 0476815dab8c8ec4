"""Rewrite the expected ``commands`` of role cases from what the code yields now, for a change that alters
renderings (compose text, knobs hashes, release hashes) on purpose: mechanical, never by hand.

    .venv/bin/python tests/roles/regenerate.py tests/roles/serving/native-offload-h200x2-fresh.json ...

Review the diff: only the renderings the change meant to alter may move.
"""

import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1]), str(Path(__file__).parents[2])]

from pyinfra_cases import run_case  # noqa: E402


def indent_of(text: str) -> int:
    """The JSON indent a case file is written with (they differ), so a rewrite changes only what moved."""
    second = text.splitlines()[1] if "\n" in text else ""
    return (len(second) - len(second.lstrip(" "))) or 1


def write_case(path: Path, case: dict, indent: int) -> None:
    path.write_text(json.dumps(case, indent=indent, ensure_ascii=False) + "\n")


def regenerate(path: Path) -> None:
    text = path.read_text()
    case = json.loads(text)
    result = run_case(path.parent.name, case)
    if result["error"] is not None:
        raise SystemExit(f"{path}: the case now fails ({result['error']}): fix the code or the case, not its commands")
    case["commands"] = result["commands"]
    write_case(path, case, indent_of(text))


if __name__ == "__main__":
    for name in sys.argv[1:]:
        regenerate(Path(name))
