"""Results cards: per-rig JSON (versioned schema) + Markdown + PNG plots, and a fleet card.

Layout of a run directory (results/<run-id>/):
    <rig>.card.json      the machine-readable result (the only input of a re-render)
    <rig>.md             the card, in the shape of the user's validation card
    <rig>-ttft.png       TTFT per tier (linear ms, each session a dot, the verdict under each tier)
    <rig>-decode.png     decode A/B with CV bars (when measured)
    fleet.md, fleet-ttft.png   rigs side by side and the spread across rigs (the plot: one panel per rig)
    recorded/<rig>.card.json   a replay only: the cards of the run it repeats, copied when it ran
    replay.json          a replay only: setup differences and a verdict per figure against recorded/

`rigkit card results/<run-id>` re-renders every Markdown, PNG and replay.json from the JSON files.

Modules, one concern each: schema (the JSON models), text (figures as text), figures (the measured figures
a fleet card compares), replay (a replay against its recorded run), rig and fleet (the Markdown cards),
glance (a card in a few lines for the terminal), plots, store (the run directory's files), cli. The names other code
uses are re-exported here.
"""

from rigkit.validation.card.fleet import render_fleet_markdown
from rigkit.validation.card.rig import render_rig_markdown, render_soak
from rigkit.validation.card.schema import (
    SCHEMA_VERSION,
    Capacity,
    CapacityTier,
    DecodeAB,
    DecodeKind,
    GreedyCheck,
    L2Report,
    NumericsBands,
    Power,
    PowerRow,
    PromptRecord,
    Reproducibility,
    RigCard,
    SharedPair,
    SoakReport,
    SoakTurn,
    SpecDecode,
    StatModel,
    TierProof,
    TierResult,
    TTFTClient,
    TTFTPair,
)
from rigkit.validation.card.store import RESULTS_DIR, load_cards, new_run_id, render_run, write_card
from rigkit.validation.card.text import fmt_bytes, fmt_l2

__all__ = [
    "SCHEMA_VERSION",
    "Capacity",
    "CapacityTier",
    "DecodeAB",
    "DecodeKind",
    "GreedyCheck",
    "L2Report",
    "NumericsBands",
    "Power",
    "PowerRow",
    "PromptRecord",
    "Reproducibility",
    "RigCard",
    "SharedPair",
    "SoakReport",
    "SoakTurn",
    "SpecDecode",
    "StatModel",
    "TierProof",
    "TierResult",
    "TTFTClient",
    "TTFTPair",
    "RESULTS_DIR",
    "load_cards",
    "new_run_id",
    "render_run",
    "write_card",
    "fmt_bytes",
    "fmt_l2",
    "render_fleet_markdown",
    "render_rig_markdown",
    "render_soak",
]
