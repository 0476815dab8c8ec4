"""The rollout's plan: its settings (one for the fleet, from the rigs' data or a flag) and its stages, canaries
first, then batches, in inventory order. deploy.py refuses a rollout's data that no `rigkit deploy` drives."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rigkit.errors import ConfigError
from rigkit.paths import ROLLBACK_DEPLOY
from rigkit.settings.defaults import ROLLOUT_VARIABLES

# Set by `rigkit deploy` for every pyinfra run it drives: deploy.py refuses a rollout's data without it.
ROLLOUT_STEP_ENV = "RIGKIT_ROLLOUT_STEP"
ALL_AT_ONCE = "all at once"
CANARY = "canary"


@dataclass(frozen=True)
class RolloutSettings:
    canary: int
    batch: int
    on_failure: str
    cache_proof: bool

    @property
    def active(self) -> bool:
        return bool(self.canary or self.batch)

    def describe(self) -> str:
        batch = f"batches of {self.batch}" if self.batch else "the rest in one batch"
        return f"canary {self.canary}, {batch}, on failure: {self.on_failure}"


def fleet_value(variable: Any, per_rig: Mapping[str, Mapping[str, Any]], override: Any = None) -> Any:
    """One rollout variable's value for the fleet (a rigkit.settings.variables.Variable): the flag (``override``, None = not
    given) wins; else every targeted rig's resolved `rollout` section (``per_rig``) must carry the same value: a
    rollout is one plan for the fleet."""
    name = variable.name
    if override is not None:
        return variable.coerce(override)
    seen = {rig: section[name] for rig, section in per_rig.items()}
    distinct = sorted({json.dumps(v) for v in seen.values()})
    if len(distinct) > 1:
        first, other = next(iter(seen)), next(r for r, v in seen.items() if v != next(iter(seen.values())))
        raise ConfigError(
            name,
            seen[other],
            f"differs between rigs ({first}: {seen[first]!r}, {other}: "
            f"{seen[other]!r}): a rollout is one plan for the whole fleet",
            f"set {name} once in group data, or pass it as a rigkit deploy flag",
        )
    return next(iter(seen.values())) if seen else variable.default


def rollout_settings(per_rig: Mapping[str, Mapping[str, Any]], overrides: Mapping[str, Any]) -> RolloutSettings:
    """The rollout's settings from each targeted rig's resolved `rollout` section; a flag (``overrides``, by
    variable name, None = not given) wins (fleet_value)."""
    values = {
        variable.name: fleet_value(variable, per_rig, overrides.get(variable.name)) for variable in ROLLOUT_VARIABLES
    }
    return RolloutSettings(
        values["rollout_canary"], values["rollout_batch"], values["rollout_on_failure"], values["rollout_cache_proof"]
    )


def refuse_unbatched(rollout_section: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    """deploy.py: a rollout is set but no `rigkit deploy` drives this run, so pyinfra would upgrade every rig at
    once, the outage the canary is there to prevent. Refused before any rig is touched."""
    canary, batch = rollout_section["rollout_canary"], rollout_section["rollout_batch"]
    if (canary or batch) and not environ.get(ROLLOUT_STEP_ENV):
        raise ConfigError(
            "rollout_canary" if canary else "rollout_batch",
            canary or batch,
            "a rollout is set, and plain pyinfra deploys every rig at once (only rigkit deploy "
            "runs canaries and batches)",
            "run `rigkit deploy INVENTORY` instead, or pass --data rollout_canary=0 --data "
            "rollout_batch=0 to deploy every rig at once deliberately",
        )


# --- the stages -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    label: str  # "canary", "batch 1", ... or "all at once"
    rigs: tuple[str, ...]

    @property
    def canary(self) -> bool:
        return self.label == CANARY


def plan_stages(rigs: Sequence[str], canary: int, batch: int) -> list[Stage]:
    """The canary stage (the first ``canary`` rigs, in inventory order), then batches of ``batch`` (0: the rest
    at once). The order is the inventory's, so a re-run plans the same stages."""
    rigs = list(rigs)
    if canary > len(rigs):
        raise ConfigError(
            "rollout_canary",
            canary,
            f"asks for {canary} canaries but the run targets {len(rigs)} rig(s) ({', '.join(rigs) or 'none'})",
            f"set rollout_canary (or --canary) to at most {len(rigs)}, or widen --limit",
        )
    if not (canary or batch):
        return [Stage(ALL_AT_ONCE, tuple(rigs))]
    stages = [Stage(CANARY, tuple(rigs[:canary]))] if canary else []
    rest = rigs[canary:]
    size = batch or len(rest) or 1  # every rig a canary: no batch follows
    stages += [Stage(f"batch {i // size + 1}", tuple(rest[i : i + size])) for i in range(0, len(rest), size)]
    return stages


# Options a rolling rollback (rollback.py) refuses, and why.
REFUSED_OPTIONS = {
    "--canary": "a canary proves a new release's cache before the other rigs get it; a rollback brings back a "
    "release each rig verified already",
    "--on-failure": "a rolling rollback halts at the first rig not back on a verified rollback and leaves the rigs it "
    "rolled back where they are: there is no release further back for it to go to",
    "--recheck-canaries": "a rollback has no canaries to prove again",
}
REFUSED_FIX = "drop {option}: --batch N rolls back N rigs at a time (through the router when the inventory has one)"


def refuse_rollout_options(options: Mapping[str, Any]) -> None:
    """ConfigError for the first of ``options`` (option -> its value, None or False when not given) that a rollback
    has no use for (REFUSED_OPTIONS): field, value and fix."""
    for option, why in REFUSED_OPTIONS.items():
        value = options.get(option)
        if value is not None and value is not False:
            raise ConfigError(
                option, value, f"makes no sense with {ROLLBACK_DEPLOY}: {why}", REFUSED_FIX.format(option=option)
            )
