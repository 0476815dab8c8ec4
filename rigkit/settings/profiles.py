"""The profile registry (profiles.yaml): load, validate, derive A/B baselines.

``load_profiles()`` returns every profile by name, with the file's ``common`` knobs and engine
arguments merged in and ``baseline_of`` entries derived from their base. Errors name the profile
and the field (``profiles.yaml: profiles.cpu-lab.resources.gpus: ...``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rigkit.errors import ConfigError
from rigkit.paths import FILES_DIR, PROFILES_FILE
from rigkit.remote.registry import require_digest
from rigkit.settings import strict_yaml
from rigkit.settings.knobs import KNOBS_BY_NAME
from rigkit.settings.variables import closest_name

# Strings in a connector's kv_transfer_config that render.py fills from the settings.
CONNECTOR_PLACEHOLDERS = ("@l1_bytes", "@l2_dir", "@lmcache_port")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _known_knobs(names: list[str]) -> list[str]:
    for name in names:
        if name not in KNOBS_BY_NAME:
            near = closest_name(name, KNOBS_BY_NAME)
            hint = f"did you mean {near!r}?" if near else "declare it in rigkit/settings/knobs.py"
            raise ValueError(f"unknown knob {name!r}: {hint}")
    return names


class Resources(_Strict):
    gpus: int = Field(ge=0, description="GPUs the stack needs (0 = runs on CPU)")
    min_ram_gb: int = Field(ge=0, description="MemTotal a rig needs")
    kv_bytes_per_token: Optional[int] = Field(default=None, ge=1, description="KV cache cost for sizing")


class Connector(_Strict):
    kv_transfer_config: dict[str, Any]
    knobs: list[str] = []
    uses_l1: bool = False
    # never: no disk tier; optional: the l2_enabled knob decides; always: the connector needs its store.
    l2: Literal["never", "optional", "always"] = "never"
    # True when the connector never deletes from its disk store: rigkit's L2 janitor then keeps the
    # store under l2_budget_gb (least recently used first), so a full disk cannot kill the engine.
    l2_needs_janitor: bool = False
    # True when the tier keeps vLLM's own KV blocks (every GPU's share): a token then costs there what it costs
    # on the GPUs, at the KV cache dtype (rigkit.settings.hostdata.Settings.kv_bytes_per_token); False when the
    # connector stores its own format (LMCache: ~131 KB/token on the real rig, whatever the GPU's dtype).
    stores_engine_blocks: bool = False
    # True when the L1 tier is a file in /dev/shm the engine fills at start (/dev/shm/vllm_offload_<id>.mmap, mapped
    # with MAP_POPULATE): vLLM 0.26 does so for TieringOffloadingSpec only (0.32/0.33 also for the plain CPU spec), so a
    # /dev/shm with less free cannot start it
    l1_in_shm: bool = False
    # True when the connector's disk store can be shared by the engines of several rigs (kv_share: its keys
    # are the same for the same tokens on every engine, given one kv_hash_seed), so it may live on a shared mount.
    shareable: bool = False
    # True when a connector tier hands back the blocks vLLM stored, whole, so a prompt served from it is computed
    # exactly as from the GPU prefix cache: its logprobs are the GPU prefix cache's bit for bit (vLLM 0.26's CPU and
    # fs tiers on an H200 and an H100: shift 0.000), and the served-right verdict holds it to the repeat band
    # (rigkit.validation.greedy). LMCache recomputes the tail past its last whole chunk: not exact.
    bit_exact: bool = False
    # A shell script of rigkit/files/ run in the container before the engine's exec (inlined into compose's command,
    # so it is part of the rendering and its release hash); the YAML names the file, the model holds its text.
    prelude: str = ""

    @field_validator("prelude")
    @classmethod
    def _prelude_from_file(cls, name: str) -> str:
        if not name:
            return ""
        path = FILES_DIR / name
        if "/" in name or not name.endswith(".sh") or not path.is_file():
            raise ValueError(f"prelude {name!r} is not a shell script of rigkit/files/ (a file name ending in .sh)")
        return path.read_text()

    @field_validator("knobs")
    @classmethod
    def _knobs_declared(cls, names: list[str]) -> list[str]:
        return _known_knobs(names)

    @field_validator("kv_transfer_config")
    @classmethod
    def _placeholders_known(cls, config: dict) -> dict:
        for value in _leaves(config):
            if isinstance(value, str) and value.startswith("@") and value not in CONNECTOR_PLACEHOLDERS:
                raise ValueError(f"unknown placeholder {value!r}; known: {', '.join(CONNECTOR_PLACEHOLDERS)}")
        if "kv_connector" not in config:
            raise ValueError("needs a kv_connector name")
        return config


class Profile(_Strict):
    name: str
    doc: str
    status: Literal["production", "incubating"]
    image_repo: str
    image: Optional[str] = None
    launcher: str
    engine_args: list[str] = []
    knobs: list[str] = []
    fixed_env: dict[str, str] = {}
    defaults: dict[str, Any] = {}
    resources: Resources
    connector: Optional[Connector] = None
    baseline_of: Optional[str] = None
    # Derived, not written in YAML: container limits (mem_limit, shm) are sized for L1. A baseline keeps
    # its base's limits so an A/B pair differs only in the connector.
    l1_in_limits: bool = False

    @field_validator("knobs")
    @classmethod
    def _knobs_declared(cls, names: list[str]) -> list[str]:
        return _known_knobs(names)

    @field_validator("defaults")
    @classmethod
    def _defaults_valid(cls, defaults: dict) -> dict:
        _known_knobs(list(defaults))
        return {name: KNOBS_BY_NAME[name].coerce(value) for name, value in defaults.items()}

    @property
    def all_knobs(self) -> list[str]:
        """Every knob the stack reads: common, its own and its connector's (ordered, no repeats)."""
        names = self.knobs + (self.connector.knobs if self.connector else [])
        return list(dict.fromkeys(names))

    @property
    def env_knobs(self) -> list[str]:
        return [name for name in self.all_knobs if KNOBS_BY_NAME[name].env]

    @property
    def needs_gpus(self) -> bool:
        return self.resources.gpus > 0

    @property
    def uses_l1(self) -> bool:
        return bool(self.connector and self.connector.uses_l1)

    @property
    def l2_mode(self) -> str:
        return self.connector.l2 if self.connector else "never"


def _leaves(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def without_connector(profile: Profile, name: Optional[str] = None, doc: Optional[str] = None) -> Profile:
    """The same stack with the KV connector (and what only it reads) removed: the A/B baseline."""
    return profile.model_copy(
        update={
            "name": name or f"{profile.name}-baseline",
            "doc": doc or f"{profile.name} without its KV connector (A/B baseline)",
            "connector": None,
            "baseline_of": profile.name,
        }
    )


def ab_pair(profiles: dict[str, Profile], name: str) -> tuple[Profile, Profile]:
    """(with connector, without connector) for a profile: the two sides of a connector A/B."""
    profile = get_profile(profiles, name)
    if profile.connector is None:
        if profile.baseline_of is None:
            raise ConfigError(
                "serving_profile", name, "has no KV connector, so no A/B pair", "pick a profile with a connector"
            )
        return get_profile(profiles, profile.baseline_of), profile
    declared = [p for p in profiles.values() if p.baseline_of == name]
    return profile, (declared[0] if declared else without_connector(profile))


def get_profile(profiles: dict[str, Profile], name: str) -> Profile:
    if name not in profiles:
        suggestion = closest_name(name, profiles)
        fix = f"did you mean {suggestion!r}?" if suggestion else f"one of {', '.join(sorted(profiles))}"
        raise ConfigError("serving_profile", name, f"no such profile in {PROFILES_FILE.name}", fix)
    return profiles[name]


def _error(path: Path, where: str, problem: str, fix: str) -> ConfigError:
    return ConfigError(f"{path.name}: {where}", None, problem, fix)


def _validation_error(path: Path, name: str, exc: ValidationError, common: Optional[dict] = None) -> ConfigError:
    first = exc.errors()[0]
    location = ".".join(str(part) for part in first["loc"])
    where = f"profiles.{name}.{location}" if location else f"profiles.{name}"
    loc = first["loc"]
    if len(loc) >= 2 and loc[0] in _LIST_FIELDS and isinstance(loc[1], int):
        # the profile's list is common's then its own (parse_profiles): name the item where the user wrote it
        shared = len((common or {}).get(loc[0]) or [])
        own = loc[1] - shared
        where = f"common.{loc[0]}[{loc[1]}]" if own < 0 else f"profiles.{name}.{loc[0]}[{own}]"
        return _error(path, f"{where} = {first.get('input')!r}", first["msg"], f"write {loc[0]} as a list of text")
    if first["type"] == "extra_forbidden":
        model = {"connector": Connector, "resources": Resources}.get(str(first["loc"][0]), Profile)
        near = closest_name(str(first["loc"][-1]), [f for f in model.model_fields if f not in _DERIVED_FIELDS])
        fix = f"did you mean {near!r}?" if near else f"use one of {', '.join(sorted(model.model_fields))}"
        return _error(path, where, "unknown key", fix)
    return _error(path, where, first["msg"], "fix the profile entry (see the comments at the top of the file)")


# Profile fields rigkit derives; a profile entry never writes them.
_DERIVED_FIELDS = ("name", "l1_in_limits")
_LIST_FIELDS = ("knobs", "engine_args")


def _refuse_text_for_list(path: Path, where: str, entry: dict) -> None:
    """A string where a list is expected would be split into its characters by list()."""
    for key in _LIST_FIELDS:
        if key in entry and entry[key] is not None and not isinstance(entry[key], list):
            raise _error(
                path,
                f"{where}.{key}",
                f"must be a list, got {type(entry[key]).__name__} {entry[key]!r}",
                f"write it as a YAML list: {key}: [{entry[key]}]",
            )


def _refuse_unknown(path: Path, where: str, keys, known) -> None:
    for key in keys:
        if key not in known:
            near = closest_name(str(key), known)
            raise _error(
                path,
                f"{where}.{key}",
                "unknown key",
                f"did you mean {near!r}?" if near else f"use one of {', '.join(known)}",
            )


def _refuse_unread_defaults(path: Path, profile: Profile) -> None:
    """A default for a container knob the profile never reads, or "@l2_dir" in a connector with no L2 tier."""
    for knob in profile.defaults:
        if KNOBS_BY_NAME[knob].env and knob not in profile.all_knobs:
            raise _error(
                path,
                f"profiles.{profile.name}.defaults.{knob}",
                "is a knob this profile never reads",
                f"add {knob} to the profile's knobs, or remove the default",
            )
    if profile.connector and profile.connector.l2 == "never":
        if "@l2_dir" in _leaves(profile.connector.kv_transfer_config):
            raise _error(
                path,
                f"profiles.{profile.name}.connector.kv_transfer_config",
                "uses @l2_dir but the connector has no L2 tier (l2: never), so it would name a directory never mounted",
                "set connector.l2 to optional or always, or remove @l2_dir",
            )


def parse_profiles(text: str, path: Path = PROFILES_FILE) -> dict[str, Profile]:
    """Profiles from YAML text; ConfigError naming the profile and field on the first problem."""
    try:
        document = strict_yaml.load(text) or {}
    except strict_yaml.DuplicateKey as exc:
        raise _error(path, "yaml", str(exc), "keep one of them (YAML would silently keep only the last)") from None
    except yaml.YAMLError as exc:
        raise _error(path, "yaml", str(exc), "fix the YAML syntax") from None
    if not isinstance(document, dict):
        raise _error(path, "yaml", "is not a mapping", "write `common:` and `profiles:` at the top level")
    _refuse_unknown(path, "top level", document, ("common", "profiles"))
    common = document.get("common") or {}
    entries = document.get("profiles")
    if not isinstance(entries, dict) or not entries:
        raise _error(path, "profiles", "missing or empty", "declare profiles under `profiles:`")
    _refuse_unknown(path, "common", common, ("knobs", "engine_args", "fixed_env"))
    _refuse_text_for_list(path, "common", common)
    common_env = {name: str(value) for name, value in (common.get("fixed_env") or {}).items()}

    profiles: dict[str, Profile] = {}
    for name, entry in entries.items():
        if not isinstance(entry, dict):
            raise _error(path, f"profiles.{name}", "must be a mapping", "see the other profiles")
        if "baseline_of" in entry:
            continue
        _refuse_text_for_list(path, f"profiles.{name}", entry)
        own_env = entry.get("fixed_env") or {}
        clashes = {k for k in own_env if k in common_env and str(own_env[k]) != common_env[k]}
        if clashes:
            raise _error(
                path,
                f"profiles.{name}.fixed_env",
                f"sets {sorted(clashes)} otherwise than common.fixed_env",
                "every profile keeps common.fixed_env (telemetry off): remove them from the profile",
            )
        merged = {
            **entry,
            "name": name,
            # the profile's own env in its order, then what common adds (a profile's rendering stays put)
            "fixed_env": {**own_env, **{k: v for k, v in common_env.items() if k not in own_env}},
            "knobs": list(common.get("knobs", [])) + list(entry.get("knobs") or []),
            "engine_args": list(common.get("engine_args", [])) + list(entry.get("engine_args") or []),
        }
        try:
            profile = Profile(**merged)
        except ValidationError as exc:
            raise _validation_error(path, name, exc, common) from None
        except ConfigError as exc:  # a knob default failed its own check
            raise _error(path, f"profiles.{name}.defaults.{exc.field}", exc.problem, exc.fix) from None
        if "l1_in_limits" in entry:
            raise _error(path, f"profiles.{name}.l1_in_limits", "is derived from the connector", "remove it")
        if profile.image is not None:
            require_digest(profile.image, f"{path.name}: profiles.{name}.image")
        _refuse_unread_defaults(path, profile)
        profiles[name] = profile.model_copy(update={"l1_in_limits": profile.uses_l1})

    for name, entry in entries.items():
        if "baseline_of" not in entry:
            continue
        extra = set(entry) - {"baseline_of", "doc"}
        if extra:
            raise _error(
                path,
                f"profiles.{name}",
                f"a baseline_of profile takes only doc, not {sorted(extra)}",
                "derive, don't copy: change the base profile instead",
            )
        base = profiles.get(entry["baseline_of"])
        if base is None:
            if isinstance(entries.get(entry["baseline_of"]), dict) and "baseline_of" in entries[entry["baseline_of"]]:
                raise _error(
                    path,
                    f"profiles.{name}.baseline_of",
                    f"{entry['baseline_of']!r} is itself a baseline (no connector to drop)",
                    f"point baseline_of at the profile "
                    f"{entry['baseline_of']!r} derives from: "
                    f"{entries[entry['baseline_of']]['baseline_of']!r}",
                )
            near = closest_name(str(entry["baseline_of"]), profiles)
            raise _error(
                path,
                f"profiles.{name}.baseline_of",
                f"no profile {entry['baseline_of']!r}",
                f"did you mean {near!r}?" if near else f"one of {', '.join(sorted(profiles))}",
            )
        if base.connector is None:
            raise _error(
                path,
                f"profiles.{name}.baseline_of",
                f"{base.name} has no connector to drop",
                "point baseline_of at a profile with a connector",
            )
        profiles[name] = without_connector(base, name=name, doc=entry.get("doc"))
    return profiles


@lru_cache(maxsize=4)
def _load_cached(path: Path, mtime_ns: int) -> dict[str, Profile]:
    return parse_profiles(path.read_text(), path)


def load_profiles(path: Path = PROFILES_FILE) -> dict[str, Profile]:
    """Every profile in profiles.yaml (cached per file version)."""
    try:
        return _load_cached(path, path.stat().st_mtime_ns)
    except FileNotFoundError:
        raise ConfigError("profiles file", str(path), "missing", "restore profiles.yaml at the repo root") from None
