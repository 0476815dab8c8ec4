"""The release ledger kept on each rig: what ran, when, and whether it passed smoke.

Pure data functions; the serving role reads the rig's ledger file as a fact and writes it back.
Each entry names its rendering (the release hash of its compose.yml + .env); a verified release's
rendering is stored on the rig (``rendering_dir``), and a rollback restores that stored rendering,
not a re-rendering of the old image with today's data. Rollback picks the newest release whose
smoke verdict is "pass"; pruning keeps the newest ``keep`` distinct images and renderings plus the
current, last known-good and rollback-target ones, so a rollback never needs a pull.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from typing import Optional

from rigkit.paths import RIG_RELEASES_DIR, RIG_STATE_DIR
from rigkit.serving.render import (
    KNOBS_HASH_LABEL,
    LABEL_PREFIX,
    MODEL_LABEL,
    SERVICE_NAME,
)
from rigkit.settings import strict_yaml
from rigkit.settings.knobs import KNOBS_BY_NAME

LEDGER_PATH = f"{RIG_STATE_DIR}/ledger.json"
SCHEMA_VERSION = 1

SMOKE_PASS = "pass"
SMOKE_FAIL = "fail"
# a ledger entry's kind: a release deploy.py brought up, or one a rollback (rollback.py's, or automatic) restored
DEPLOY_KIND, ROLLBACK_KIND = "deploy", "rollback"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# characters of an image digest or a rendering hash shown in one-line summaries
SHORT_DIGEST = 12


def short_digest(image: str) -> str:
    """The first SHORT_DIGEST hex digits of ``repository@sha256:...``."""
    return image.rpartition("@")[2].removeprefix("sha256:")[:SHORT_DIGEST]


@dataclass
class Release:
    image: str  # repository@sha256:...
    profile: str
    knobs_hash: str
    deployed_at: str = field(default_factory=now_iso)
    smoke: Optional[str] = None  # SMOKE_PASS | SMOKE_FAIL | None (not checked yet)
    kind: str = DEPLOY_KIND  # DEPLOY_KIND | ROLLBACK_KIND
    note: str = ""
    rendering: Optional[str] = None  # release_hash of its compose.yml + .env (None in ledgers older than it)
    model: Optional[str] = None  # the staged model_source it mounts (source@revision; None: vLLM loads model)

    def summary(self) -> str:
        """'<digest prefix> <kind> smoke=<verdict>': the release in one line (deploy and rollout summaries)."""
        return f"{short_digest(self.image)} {self.kind} smoke={self.smoke or '-'}"


def same_release(a: Release, b: Release) -> bool:
    """Same rendering; by image alone when either predates renderings in the ledger."""
    if a.rendering and b.rendering:
        return a.rendering == b.rendering
    return a.image == b.image


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
        return (
            json.dumps(
                {"schema": SCHEMA_VERSION, "releases": [asdict(r) for r in self.releases]}, indent=2, sort_keys=True
            )
            + "\n"
        )

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

    def last_known_good(
        self, exclude_image: Optional[str] = None, other_than: Optional[Release] = None
    ) -> Optional[Release]:
        """The newest release whose smoke passed, of another image and/or another release than ``other_than``."""
        for release in reversed(self.releases):
            if (
                release.smoke == SMOKE_PASS
                and release.image != exclude_image
                and not (other_than is not None and same_release(release, other_than))
            ):
                return release
        return None

    def latest_deploy(self) -> Optional[Release]:
        """The release a rollback undoes: the latest deploy (rollbacks after it do not count)."""
        deploys = [release for release in self.releases if release.kind == DEPLOY_KIND]
        return deploys[-1] if deploys else None

    def rollback_target(self) -> Optional[Release]:
        """What rollback.py restores: the newest verified release before the latest deploy, other than it.

        Rollbacks do not move the target, so a second rollback.py run finds the rig already there."""
        deploys = [i for i, release in enumerate(self.releases) if release.kind == DEPLOY_KIND]
        if not deploys:
            return None
        undone = self.releases[deploys[-1]]
        for release in reversed(self.releases[: deploys[-1]]):
            if release.smoke == SMOKE_PASS and not same_release(release, undone):
                return release
        return None

    def newest_of_image(self, image: str) -> Optional[Release]:
        """The newest verified release of ``image`` (else its newest release): rollback_to's entry."""
        of_image = [release for release in self.releases if release.image == image]
        verified = [release for release in of_image if release.smoke == SMOKE_PASS]
        return (verified or of_image or [None])[-1]

    def _always_kept(self) -> list[Release]:
        return [release for release in (self.current, self.last_known_good(), self.rollback_target()) if release]

    def models_needed(self, keep: int) -> list[str]:
        """Staged model revisions (source@revision) a recorded release still needs: those of the kept
        renderings, the current, last known-good and rollback-target releases. Model retention never removes
        them, so a rollback to any of them copies nothing."""
        kept = set(self.renderings_to_keep(keep))
        needed = [
            release.model
            for release in self.releases
            if release.model and (release.rendering in kept or release in self._always_kept())
        ]
        return list(dict.fromkeys(needed))

    def models_newest_first(self) -> list[str]:
        return list(dict.fromkeys(release.model for release in reversed(self.releases) if release.model))

    def images_to_keep(self, keep: int) -> list[str]:
        """The newest ``keep`` distinct images, plus the current, last known-good and rollback-target ones."""
        kept: list[str] = []
        for release in reversed(self.releases):
            if release.image not in kept and len(kept) < keep:
                kept.append(release.image)
        for release in self._always_kept():
            if release.image not in kept:
                kept.append(release.image)
        return kept

    def images_to_prune(self, keep: int) -> list[str]:
        kept = set(self.images_to_keep(keep))
        seen: list[str] = []
        for release in self.releases:
            if release.image not in kept and release.image not in seen:
                seen.append(release.image)
        return seen

    def renderings_to_keep(self, keep: int) -> list[str]:
        """The newest ``keep`` distinct stored renderings, plus the current, last known-good and
        rollback-target ones: never fewer renderings than images (keep_images counts both)."""
        kept: list[str] = []
        for release in reversed(self.releases):
            if release.rendering and release.rendering not in kept and len(kept) < keep:
                kept.append(release.rendering)
        for release in self._always_kept():
            if release.rendering and release.rendering not in kept:
                kept.append(release.rendering)
        return kept

    def renderings_to_prune(self, keep: int) -> list[str]:
        kept = set(self.renderings_to_keep(keep))
        return list(
            dict.fromkeys(
                release.rendering for release in self.releases if release.rendering and release.rendering not in kept
            )
        )


def release_hash(compose_text: str, env_text: str) -> str:
    """What is running is exactly what was rendered when this matches the rig's release hash file."""
    return hashlib.sha256((compose_text + "\0" + env_text).encode()).hexdigest()


RELEASE_HASH_PATTERN = re.compile(r"[0-9a-f]{64}")


def rendering_dir(rendering_hash: str) -> str:
    """Where a verified release's compose.yml and .env are stored on the rig."""
    if not RELEASE_HASH_PATTERN.fullmatch(rendering_hash or ""):
        raise ValueError(f"not a release hash: {rendering_hash!r}")
    return f"{RIG_RELEASES_DIR}/{rendering_hash}"


def parse_dotenv(text: str) -> dict[str, str]:
    """The values of a .env written by rigkit.serving.render.dotenv_line (NAME='v' or NAME="v" with \\ and \" escaped).

    Lines end at "\n" only, as compose reads them (str.splitlines would also split at U+2028, form feed, ...).
    """
    values = {}
    for line in text.split("\n"):
        if not line.strip() or line.lstrip().startswith("#") or "=" not in line:
            continue
        name, raw = line.split("=", 1)
        if len(raw) >= 2 and raw[0] == raw[-1] == "'":
            value = raw[1:-1]
        elif len(raw) >= 2 and raw[0] == raw[-1] == '"':
            value = re.sub(r'\\(["\\])', r"\1", raw[1:-1])
        else:
            value = raw
        values[name.strip()] = value
    return values


@dataclass(frozen=True)
class Rendering:
    """A release's compose.yml and .env exactly as rendered: everything the smoke and the ledger
    need is read from these texts, so a restored rendering is checked against itself."""

    compose: str
    env: str

    @property
    def hash(self) -> str:
        return release_hash(self.compose, self.env)

    def as_dict(self) -> dict:
        return {"compose": self.compose, "env": self.env, "digest": self.hash}

    @cached_property
    def _compose_service(self) -> dict:
        return strict_yaml.load(self.compose)["services"][SERVICE_NAME]

    def _service(self) -> dict:
        """The engine's service in compose.yml, parsed once per rendering (a deploy reads it a dozen times)."""
        return self._compose_service

    @property
    def image(self) -> str:
        return self._service()["image"]

    @property
    def knobs_hash(self) -> str:
        return self._service()["labels"][KNOBS_HASH_LABEL]

    @property
    def profile(self) -> str:
        return self._service()["labels"][f"{LABEL_PREFIX}.profile"]

    @property
    def model(self) -> Optional[str]:
        """The staged model_source (source@revision) this rendering mounts, None when it mounts none."""
        return self._service()["labels"].get(MODEL_LABEL)

    def container_env(self) -> dict[str, str]:
        """NAME -> value the container must see: .env values for NAME=${NAME:-} lines, the rest as written."""
        dotenv = parse_dotenv(self.env)
        values = {}
        for line in self._service().get("environment") or []:
            name, value = line.split("=", 1)
            values[name] = dotenv.get(name, "") if value == f"${{{name}:-}}" else value.replace("$$", "$")
        return values

    def knob(self, name: str) -> str:
        """A knob's value as the container sees it (every common knob reaches the env)."""
        return self.container_env()[KNOBS_BY_NAME[name].env]

    @property
    def connector(self) -> Optional[str]:
        """The KV connector named in the engine's command line, None without one."""
        match = re.search(r'"kv_connector"\s*:\s*"([^"]+)"', " ".join(self._service().get("command") or []))
        return match.group(1) if match else None
