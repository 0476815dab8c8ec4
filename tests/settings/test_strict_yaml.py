"""YAML as rigkit reads it (rigkit.settings.strict_yaml): libyaml's parser when present, PyYAML's for the message."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rigkit.settings import strict_yaml

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [
    (REPO / "profiles.yaml").read_text(),
    "a: yes\nb: 0o17\nc: 1_000\nd: 2026-12-03\ne: ~\nf: [1, '2', 3.5]\ng: !!str 7\n",  # PyYAML's YAML 1.1 resolver
    "services:\n  vllm:\n    environment:\n      - A=${A:-}\n    command: ['--x', '{\"k\": 1}']\n",
]


@pytest.mark.parametrize("text", DOCUMENTS, ids=["profiles.yaml", "resolver", "compose"])
def test_the_fast_parser_reads_each_document_as_pyyaml_does(text):
    assert strict_yaml.FastStrictLoader is not None, "PyYAML without libyaml: deploys parse ~5x slower"
    assert yaml.load(text, Loader=strict_yaml.FastStrictLoader) == yaml.load(text, Loader=strict_yaml.StrictLoader)
    assert strict_yaml.load(text) == yaml.load(text, Loader=strict_yaml.StrictLoader)


def test_a_key_given_twice_is_refused_with_both_lines_and_the_excerpt():
    with pytest.raises(strict_yaml.DuplicateKey) as refused:
        strict_yaml.load("one: 1\ntwo: 2\none: 3\n")
    message = str(refused.value)
    assert "'one' is given twice in one mapping (first at line 1)" in message
    assert "line 3, column 1" in message
    assert "    one: 3\n    ^" in message  # PyYAML's own excerpt: the document was read again by StrictLoader


def test_a_syntax_error_names_its_line_with_the_excerpt():
    with pytest.raises(yaml.YAMLError) as refused:
        strict_yaml.load("a: [1, 2\nb: 3\n")
    assert "line" in str(refused.value) and "^" in str(refused.value)
