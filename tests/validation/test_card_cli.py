"""rigkit.validation.card.cli: `rigkit card results/<run-id>` re-renders from the JSON alone, and refuses a directory
without cards."""

from card_samples import make_card

from rigkit import cli
from rigkit.validation.card.store import write_card


def test_cli_rerenders_from_json_only(tmp_path, capsys):
    write_card(tmp_path, make_card())
    assert cli.main(["card", str(tmp_path)]) == 0
    assert (tmp_path / "rig1.md").exists()
    assert str(tmp_path / "fleet.md") in capsys.readouterr().out


def test_cli_refuses_a_directory_without_cards(tmp_path, capsys):
    assert cli.main(["card", str(tmp_path)]) == 2
    assert "no *.card.json files" in capsys.readouterr().out


def test_cli_prints_every_rig_at_a_glance_and_the_run_directory(tmp_path, capsys):
    write_card(tmp_path, make_card())
    assert cli.main(["card", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"rig1: PASS — {tmp_path / 'rig1.md'}" in out
    assert f"run directory: {tmp_path}" in out


def test_cli_given_a_card_file_names_its_directory(tmp_path, capsys):
    write_card(tmp_path, make_card())
    card = next(tmp_path.glob("*.card.json"))
    assert cli.main(["card", str(card)]) == 2
    out = capsys.readouterr().out
    assert "is a file, not a run directory" in out and f"pass its directory: {tmp_path}" in out
    assert cli.main(["card", str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().out
