"""The rollout's local record (ROLLOUTS_DIR/<inventory>.json, written after every stage): what the ledgers cannot
say. Which release each rig verified before this rollout started, which rigs it upgraded, which canaries passed
the cache proof, which rigs it left out of a router. A re-run of the same rollout continues from it. The rigs left
out of a router outlive the rollout: a rolling rollback (rigkit.rollout.rollback) keeps them in the same record, and
any later rollout or rolling rollback that gets such a rig verified puts it back."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from rigkit.paths import ROLLOUTS_DIR
from rigkit.rollout.state import ReleaseState

RECORD_SCHEMA = 1


def fingerprint(wanted: Mapping[str, str]) -> str:
    """One rollout = one set of wanted renderings over one set of rigs."""
    return hashlib.sha256(json.dumps(dict(sorted(wanted.items()))).encode()).hexdigest()[:16]


@dataclass
class RolloutRecord:
    target: str  # fingerprint(wanted)
    inventory: str
    # rig -> {"rendering": verified hash, "image": current image} when this rollout first read it
    before: dict[str, dict[str, str]] = field(default_factory=dict)
    upgraded: list[str] = field(default_factory=list)  # rigs this rollout brought onto their wanted rendering
    proven: list[str] = field(default_factory=list)  # canaries whose cache proof passed on the wanted rendering
    halted: str = ""  # the last run's halt, in words ("" while running or after it completed)
    # rig -> the routers this rollout took it out of and has not put it back into (rigkit.rollout.drain)
    out_of_router: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"schema": RECORD_SCHEMA, **asdict(self)}, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Optional["RolloutRecord"]:
        """None for a record this rigkit cannot read (another schema, damaged): a new rollout starts."""
        try:
            data = json.loads(text)
            if data.pop("schema", None) != RECORD_SCHEMA:
                return None
            return cls(**data)
        except (ValueError, TypeError):
            return None


def resume_record(
    existing: Optional[RolloutRecord], inventory: str, wanted: Mapping[str, str], states: Mapping[str, ReleaseState]
) -> RolloutRecord:
    """The record of the same rollout (same wanted renderings), or a new one holding every rig's state now."""
    target = fingerprint(wanted)
    if existing is not None and existing.target == target:
        for rig in wanted:  # a rig the killed run never read
            existing.before.setdefault(rig, _before(states[rig]))
        return existing
    return RolloutRecord(target=target, inventory=inventory, before={rig: _before(states[rig]) for rig in wanted})


def _before(state: ReleaseState) -> dict[str, str]:
    return {"rendering": state.verified, "image": state.current.image if state.current else ""}


def record_path(inventory: str, directory: Path = ROLLOUTS_DIR) -> Path:
    return directory / f"{Path(inventory).stem}.json"


def load_record(path: Path) -> Optional[RolloutRecord]:
    return RolloutRecord.from_json(path.read_text()) if path.exists() else None


def save_record(record: RolloutRecord, path: Path) -> None:
    """Written whole, then renamed: a controller killed while writing leaves the previous record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(record.to_json())
    partial.replace(path)
