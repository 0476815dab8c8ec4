"""rigkit.validation.card.store: a run directory's JSON round trip, the schema version guard, the re-render with real PNGs."""

import json

import pytest

from card_samples import make_card
from rigkit.validation.card.store import load_cards, render_run, write_card
from rigkit.errors import ConfigError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_json_round_trip_keeps_every_field(tmp_path):
    card = make_card()
    path = write_card(tmp_path, card)
    assert path.name == "rig1.card.json"
    data = json.loads(path.read_text())
    assert data["schema_version"] == 1
    assert load_cards(tmp_path) == [card]


def test_render_run_writes_markdown_and_real_pngs(tmp_path):
    write_card(tmp_path, make_card("rig1"))
    write_card(tmp_path, make_card("rig2", cold=(2.0, 2.2, 1.8)))
    written = render_run(tmp_path)
    names = {p.name for p in written}
    assert {"rig1.md", "rig1-ttft.png", "rig1-decode.png", "rig2.md", "fleet.md", "fleet-ttft.png"} <= names
    for name in ("rig1-ttft.png", "rig1-decode.png", "fleet-ttft.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC


def test_unknown_schema_version_is_refused(tmp_path):
    path = write_card(tmp_path, make_card())
    data = json.loads(path.read_text())
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="schema v1"):
        load_cards(tmp_path)
