"""The release ledger kept on each rig: what ran, when, and whether it passed smoke.

Pure data functions; the serving role reads the rig's ledger file as a fact and writes it back.
Rollback picks the newest release whose smoke verdict is "pass"; pruning keeps the newest
``keep`` distinct images plus the last known-good one, so a rollback never needs a pull.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Optional

from rigkit.paths import RIG_STATE_DIR

LEDGER_PATH = f"{RIG_STATE_DIR}/ledger.json"
SCHEMA_VERSION = 1

SMOKE_PASS = "pass"
SMOKE_FAIL = "fail"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class Release:
    image: str  # repository@sha256:...
    profile: str
    knobs_hash: str
    deployed_at: str = field(default_factory=now_iso)
    smoke: Optional[str] = None  # SMOKE_PASS | SMOKE_FAIL | None (not checked yet)
    kind: str = "deploy"  # deploy | rollback
    note: str = ""


@dataclass
class Ledger:
    releases: list[Release] = field(default_factory=list)

    @classmethod
    def from_json(cls, text: Optional[str]) -> "Ledger":
        if not text or not text.strip():
            return cls()
        data = json.loads(text)
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"ledger schema {data.get('schema')!r} is not {SCHEMA_VERSION}")
        return cls([Release(**r) for r in data.get("releases", [])])

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA_VERSION, "releases": [asdict(r) for r in self.releases]},
                          indent=2, sort_keys=True) + "\n"

    @property
    def current(self) -> Optional[Release]:
        return self.releases[-1] if self.releases else None

    def record(self, release: Release) -> None:
        self.releases.append(release)

    def record_smoke(self, verdict: str, note: str = "") -> None:
        if self.current is None:
            raise ValueError("no release to attach a smoke verdict to")
        self.current.smoke = verdict
        if note:
            self.current.note = note

    def last_known_good(self, exclude_image: Optional[str] = None) -> Optional[Release]:
        for release in reversed(self.releases):
            if release.smoke == SMOKE_PASS and release.image != exclude_image:
                return release
        return None

    def images_to_keep(self, keep: int) -> list[str]:
        """The newest ``keep`` distinct images, plus the last known-good one."""
        kept: list[str] = []
        for release in reversed(self.releases):
            if release.image not in kept and len(kept) < keep:
                kept.append(release.image)
        good = self.last_known_good()
        if good and good.image not in kept:
            kept.append(good.image)
        return kept

    def images_to_prune(self, keep: int) -> list[str]:
        kept = set(self.images_to_keep(keep))
        seen: list[str] = []
        for release in self.releases:
            if release.image not in kept and release.image not in seen:
                seen.append(release.image)
        return seen
