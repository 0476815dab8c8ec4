"""A run directory's files: write and load rig cards (JSON), re-render their Markdown and plots."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from rigkit.errors import ConfigError
from rigkit.validation.card.fleet import render_fleet_markdown
from rigkit.validation.card.pays import plot_pays
from rigkit.validation.card.plots import plot_decode, plot_ttft
from rigkit.validation.card.replay import compare, recorded_title
from rigkit.validation.card.rig import render_rig_markdown
from rigkit.validation.card.schema import SCHEMA_VERSION, ReplayComparison, RigCard, SharedPair, TTFTClient

CARD_SUFFIX = ".card.json"
RESULTS_DIR = Path("results")
# A replay keeps the cards of the run it repeats here, inside its own run directory: the replay's fleet card is
# re-rendered from its own directory alone, even once the recorded run is moved or deleted.
RECORDED_DIR = "recorded"
REPLAY_JSON = "replay.json"
# Every host of one validate.py run writes into results/<this run id>: set it to know the directory beforehand.
RUN_ID_ENV = "RIGKIT_RUN_ID"


def write_card(run_dir: Path, card: RigCard) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / f"{card.rig}{CARD_SUFFIX}"
    path.write_text(card.model_dump_json(indent=2) + "\n")
    return path


def load_cards(run_dir: Path) -> list[RigCard]:
    if run_dir.is_file():
        raise ConfigError(
            "run_dir",
            str(run_dir),
            "is a file, not a run directory (cards are re-rendered per run: "
            "every rig card and the fleet card together)",
            f"pass its directory: {run_dir.parent}",
        )
    if not run_dir.is_dir():
        raise ConfigError(
            "run_dir", str(run_dir), "no such directory", "pass a results/<run-id> directory written by validate.py"
        )
    paths = sorted(run_dir.glob(f"*{CARD_SUFFIX}"))
    if not paths:
        raise ConfigError(
            "run_dir",
            str(run_dir),
            f"no *{CARD_SUFFIX} files",
            "pass a results/<run-id> directory written by validate.py",
        )
    cards = []
    for path in paths:
        try:
            cards.append(RigCard.model_validate_json(path.read_text()))
        except ValueError as exc:
            raise ConfigError(
                str(path),
                None,
                f"not a schema v{SCHEMA_VERSION} rig card ({exc})",
                "re-run validate.py for that rig or fix the JSON",
            ) from None
    return cards


def record_shared(run_dir: Path, pairs: list[SharedPair], ttft_clients: dict[str, TTFTClient]) -> list[Path]:
    """Put each warm-shared pair into its target rig's card (the rig whose counters labelled it), replacing the
    pairs that card held; a rig validate.py wrote no card for in this run gets one holding its pairs only."""
    written = []
    for target in dict.fromkeys(pair.target for pair in pairs):
        path = run_dir / f"{target}{CARD_SUFFIX}"
        card = (
            RigCard.model_validate_json(path.read_text())
            if path.is_file()
            else RigCard(rig=target, run_id=run_dir.name, ttft_client=ttft_clients.get(target))
        )
        card.shared = [pair for pair in pairs if pair.target == target]
        written.append(write_card(run_dir, card))
    return written


def keep_recorded(run_dir: Path, recorded_run: Path) -> list[Path]:
    """Copy the rig cards of the run a replay repeats into the replay's run directory (RECORDED_DIR)."""
    if recorded_run.resolve() == run_dir.resolve():
        raise ConfigError(
            "replay", str(recorded_run), "is this run's own directory", "replay an earlier run: results/<its run-id>"
        )
    return [write_card(run_dir / RECORDED_DIR, card) for card in load_cards(recorded_run)]


def load_recorded(run_dir: Path) -> list[RigCard]:
    """The recorded run's cards a replay kept; none for a run that replays nothing."""
    return load_cards(run_dir / RECORDED_DIR) if (run_dir / RECORDED_DIR).is_dir() else []


def replay_comparison(run_dir: Path) -> Optional[ReplayComparison]:
    """A replay's comparison with the run it repeats, from the run directory's JSON alone; None for a run that
    replays nothing."""
    recorded = load_recorded(run_dir)
    return compare(recorded, load_cards(run_dir)) if recorded else None


def render_run(run_dir: Path) -> list[Path]:
    """(Re-)render every rig card and the fleet card of a run from its JSON files; for a replay, also its
    comparison with the recorded run (fleet.md and replay.json)."""
    cards = load_cards(run_dir)
    recorded = load_recorded(run_dir)
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
        if plot_pays(card, run_dir / f"{card.rig}-pays.png"):
            written.append(run_dir / f"{card.rig}-pays.png")
    fleet = run_dir / "fleet.md"
    fleet.write_text(render_fleet_markdown(cards, recorded))
    written.append(fleet)
    if recorded:
        replay = run_dir / REPLAY_JSON
        replay.write_text(compare(recorded, cards).model_dump_json(indent=2) + "\n")
        written.append(replay)
    columns = [c.model_copy(update={"rig": recorded_title(c)}) for c in recorded] + cards
    if any(c.tiers for c in columns):
        plot_ttft(columns, run_dir / "fleet-ttft.png")
        written.append(run_dir / "fleet-ttft.png")
    return written


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
