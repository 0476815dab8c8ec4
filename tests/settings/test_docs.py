from rigkit.settings.docs import README, with_tables
from rigkit.settings.knobs import KNOBS


def test_readme_settings_tables_match_the_declarations():
    text = README.read_text()
    assert with_tables(text) == text, "README settings tables are stale: run .venv/bin/python -m rigkit.settings.docs"


def test_every_knob_is_documented():
    text = README.read_text()
    for knob in KNOBS:
        assert f"| `{knob.name}` |" in text
