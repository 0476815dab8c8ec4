"""The documentation: docs/settings.md's generated tables match the declarations, the README stays a README,
every link between the pages resolves (anchors included) and every repository path the pages name exists."""

import re
import unicodedata
from pathlib import Path

import pytest

from rigkit.paths import REPO_ROOT
from rigkit.settings.docs import SETTINGS_PAGE, with_tables
from rigkit.settings.knobs import KNOBS

README = REPO_ROOT / "README.md"
README_MAX_LINES = 200
PAGES = [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]
# [text](target) outside code spans; a target with a scheme (https:, mailto:) is not ours to check
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`[^`\n]*`")
# a repository path in a code span or in prose: a top-level folder of ours, then a file with an extension;
# placeholders (<run-id>, X.py) are skipped
REPO_PATH = re.compile(r"(?<![\w/.-])((?:rigkit|roles|tests|bench|inventory|group_data|templates|docs)/[\w/.-]+\.\w+)")
PLACEHOLDER = re.compile(r"[<>*{}]|/X\.py$")


def test_settings_tables_match_the_declarations():
    text = SETTINGS_PAGE.read_text()
    assert with_tables(text) == text, "docs/settings.md is stale: run .venv/bin/python -m rigkit.settings.docs"


def test_every_knob_is_documented():
    text = SETTINGS_PAGE.read_text()
    for knob in KNOBS:
        assert f"| `{knob.name}` |" in text


def test_readme_stays_short():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move the detail into docs/"
    )


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation but - and _ dropped, spaces to -."""
    text = heading.strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#{1,6} (.+)$", page.read_text(), re.M)
    return {anchor(h) for h in headings}


def links(page: Path) -> list[str]:
    text = page.read_text()
    text = re.sub(r"^    .*$", "", text, flags=re.M)  # indented code blocks
    return LINK.findall(CODE_SPAN.sub("", text))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_link_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.name}: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_repository_path_named_exists(page):
    named = {m for m in REPO_PATH.findall(page.read_text()) if not PLACEHOLDER.search(m)}
    missing = sorted(p for p in named if not (REPO_ROOT / p.rstrip(".")).exists())
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


def test_the_readme_links_every_docs_page():
    text = README.read_text()
    unlinked = [p.name for p in PAGES[1:] if f"(docs/{p.name})" not in text]
    assert not unlinked, f"README.md does not link {unlinked}"
