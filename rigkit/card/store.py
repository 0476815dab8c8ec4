"""A run directory's files: write and load rig cards (JSON), re-render their Markdown and plots."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from rigkit.card.fleet import render_fleet_markdown
from rigkit.card.plots import plot_decode, plot_ttft
from rigkit.card.rig import render_rig_markdown
from rigkit.card.schema import SCHEMA_VERSION, RigCard
from rigkit.errors import ConfigError

CARD_SUFFIX = ".card.json"
RESULTS_DIR = Path("results")


def write_card(run_dir: Path, card: RigCard) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / f"{card.rig}{CARD_SUFFIX}"
    path.write_text(card.model_dump_json(indent=2) + "\n")
    return path


def load_cards(run_dir: Path) -> list[RigCard]:
    paths = sorted(run_dir.glob(f"*{CARD_SUFFIX}"))
    if not paths:
        raise ConfigError("run_dir", str(run_dir), f"no *{CARD_SUFFIX} files",
                          "pass a results/<run-id> directory written by validate.py")
    cards = []
    for path in paths:
        try:
            cards.append(RigCard.model_validate_json(path.read_text()))
        except ValueError as exc:
            raise ConfigError(str(path), None, f"not a schema v{SCHEMA_VERSION} rig card ({exc})",
                              "re-run validate.py for that rig or fix the JSON") from None
    return cards


def render_run(run_dir: Path) -> list[Path]:
    """(Re-)render every rig card and the fleet card of a run from its JSON files."""
    cards = load_cards(run_dir)
    written = []
    for card in cards:
        md = run_dir / f"{card.rig}.md"
        md.write_text(render_rig_markdown(card))
        written.append(md)
        if card.tiers:
            plot_ttft([card], run_dir / f"{card.rig}-ttft.png")
            written.append(run_dir / f"{card.rig}-ttft.png")
        if card.decode_ab:
            plot_decode(card, run_dir / f"{card.rig}-decode.png")
            written.append(run_dir / f"{card.rig}-decode.png")
    fleet = run_dir / "fleet.md"
    fleet.write_text(render_fleet_markdown(cards))
    written.append(fleet)
    if any(c.tiers for c in cards):
        plot_ttft(cards, run_dir / "fleet-ttft.png")
        written.append(run_dir / "fleet-ttft.png")
    return written


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
