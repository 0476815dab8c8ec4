"""`rigkit card results/<run-id>`: re-render every Markdown and PNG of a run from its JSON files, then print every
rig at a glance (rigkit.validation.card.glance); a replay's fleet card with the recorded run it kept, whose verdicts it also
prints."""

from __future__ import annotations

import argparse
from pathlib import Path

from rigkit.validation.card.glance import run_lines
from rigkit.validation.card.replay import summary_lines
from rigkit.validation.card.store import load_cards, render_run, replay_comparison
from rigkit.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="results/<run-id> directory holding <rig>.card.json files")


def run(args: argparse.Namespace) -> int:
    try:
        written = render_run(args.run_dir)
        comparison = replay_comparison(args.run_dir)
    except ConfigError as exc:
        print(f"rigkit card: {exc}")
        return 2
    for path in written:
        print(path)
    print("\n" + "\n".join(run_lines(load_cards(args.run_dir), args.run_dir)))
    if comparison:
        print("\n".join(summary_lines(comparison)))
    return 0
