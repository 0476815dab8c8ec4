"""From a host's data (inventory + group_data + --data) to its settings, validated once (RigSettings).

``settings_for_host(data)`` runs before any host is touched and raises ConfigError naming the
field on any bad input: an unknown key (with the closest valid name), a tag image, an incubating
profile without opt-in, a bad knob value, a memory limit below what L1 and the model need.

``rig_settings(data)`` builds the one object an entry point passes to every role: the stack's Settings
plus every role's variables by section (rigkit.settings.defaults), validated once per host.

The convention for host data keys (one flat namespace):
- serving knobs: rigkit.settings.knobs.KNOBS;
- role and validation variables: rigkit.settings.defaults.ROLE_SECTIONS;
- connection and lab keys: names starting with ``ssh_`` (pyinfra's SSH connector) or ``_``
  (pyinfra's global arguments such as ``_sudo``), and LAB_KEYS below.
Anything else is refused, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from rigkit.errors import ConfigError
from rigkit.remote.registry import require_digest
from rigkit.settings.connection import connection_values
from rigkit.settings.defaults import (
    ALL_VARIABLES,
    KV_SHARE_VARIABLES,
    KV_STORE_PORT,
    L2_DISK_VARIABLES,
    PACKAGE_REPOSITORY_SETTINGS,
    ROLE_SECTIONS,
    kv_share_store_path,
    l2_cache_path,
)
from rigkit.settings.engine_args import engine_option, engine_spellings, read_as
from rigkit.settings.eviction import EvictionRule, rule_for
from rigkit.settings.firewalls import API_FIREWALL, refuse_on_shared_network
from rigkit.settings.knobs import (
    HASHED_ONLY_WHEN_SET,
    KNOBS,
    KNOBS_BY_NAME,
    L2_PATH_WITHOUT_DISK_ROLE,
    NOT_HASHED,
    PORT_KNOBS,
    RETIRED_KNOBS,
    SECRET_KNOBS,
    controller_secret_variable,
    gpu_indices,
    knob_flag_spellings,
)
from rigkit.settings.model_source import MODEL_CONTAINER_PATH, ModelSource, mounted_dir, parse_model_source
from rigkit.settings.profiles import Profile, get_profile, load_profiles
from rigkit.settings.sizing import GIB, capacity_line, gpu_kv_bytes_per_token, gpu_line, required_mem_limit_gib
from rigkit.settings.types import LABEL_LIMITS, label_problem, plain_http_problem
from rigkit.settings.variables import REDACTED, Variable, refuse_unknown, resolve

CONNECTION_PREFIXES = ("ssh_", "_")
# the model store's directory under the L2 disk's mount point (the NVMe) when model_store_path is not set
MODEL_STORE_DIR = "models"
DEFAULT_L2_MOUNT = next(variable.default for variable in L2_DISK_VARIABLES if variable.name == "l2_mount_point")
# Keys the lab inventory writes for its own bookkeeping (rigkit/lab): not settings of the stack.
# lab_netns: the rig runs in its own network namespace (only such a lab rig may take api_firewall).
LAB_KEYS = frozenset({"lab_rig", "lab_netns", "lab_registry", "lab_container", "nvme_path", "loop_device"})


@dataclass(frozen=True)
class Settings:
    """Everything the serving role needs, validated: the profile, the image, every knob's value."""

    profile: Profile
    image: str
    knobs: dict[str, Any]

    @property
    def l1_gib(self) -> int:
        """L1 RAM the stack pins, in GiB (0 when the profile has no CPU-RAM tier)."""
        return self.knobs["l1_size_gb"] if self.profile.uses_l1 else 0

    @property
    def l1_bytes(self) -> int:
        """L1 in bytes: what `lmcache server --l1-size-gb` allocates, and what native-offload gets."""
        return self.l1_gib * GIB

    @property
    def l1_eviction(self) -> Optional[EvictionRule]:
        """How the L1 tier's cache evicts, by the profile's connector (None: no L1, or a connector rigkit does not
        know the rule of)."""
        connector = self.profile.connector
        if connector is None or not self.profile.uses_l1:
            return None
        return rule_for(connector.kv_transfer_config.get("kv_connector"))

    @property
    def l2_active(self) -> bool:
        mode = self.profile.l2_mode
        return mode == "always" or (mode == "optional" and bool(self.knobs["l2_enabled"]))

    @property
    def tiers_not_applicable(self) -> dict[str, str]:
        """Cache tiers (rigkit.validation.tiers.Tier values) this stack cannot have, each with why: validation runs no step
        for them and the card says "not applicable" once (a tier demanded of a stack without it fails every card)."""
        connector = self.profile.connector
        if connector is None:
            why = f"profile {self.profile.name} has no KV connector (GPU prefix cache only)"
            return {"warm-connector": why, "warm-persistent": why}
        if self.l2_active:
            return {}
        if self.profile.l2_mode == "never":
            why = (
                f"profile {self.profile.name} keeps its connector's KV in RAM only (connector l2: never): "
                "nothing survives a restart"
            )
        else:
            why = (
                f"profile {self.profile.name} runs with l2_enabled false: its RAM tier (L1) dies with the stack, "
                "so nothing survives a restart"
            )
        return {"warm-persistent": why}

    @property
    def bit_exact_tiers(self) -> list[str]:
        """Connector tiers whose logprobs must equal the GPU prefix cache's (Connector.bit_exact)."""
        connector = self.profile.connector
        exact = connector is not None and connector.bit_exact
        return [
            tier for tier in ("warm-connector", "warm-persistent") if exact and tier not in self.tiers_not_applicable
        ]

    @property
    def store_chunk_tokens(self) -> Optional[int]:
        """Tokens per chunk the connector stores whole (LMCache's chunk_size); None: it stores what it is given."""
        connector = self.profile.connector
        return self.knobs["chunk_size"] if connector is not None and "chunk_size" in connector.knobs else None

    @property
    def env_knobs(self) -> list[str]:
        """Knobs whose env var the container gets: the profile's, and the hash seed once its store is shared.
        With a staged model the hub token stays on the controller (staging only): the container is offline."""
        names = self.profile.env_knobs
        names = names + ["kv_hash_seed"] if self.knobs["kv_share"] and "kv_hash_seed" not in names else names
        return [name for name in names if not (self.model_source and name == "hf_token")]

    @property
    def model_source(self) -> Optional[ModelSource]:
        """The pinned model staged on the rig, None when vLLM loads ``model`` itself."""
        value = self.knobs["model_source"]
        return parse_model_source(value) if value else None

    @property
    def model_dir(self) -> Optional[str]:
        """The model's directory on the rig (mounted read-only at MODEL_CONTAINER_PATH): the staged revision, or
        the shared directory itself."""
        source = self.model_source
        return mounted_dir(self.knobs["model_store_path"], source) if source else None

    @property
    def runs_l2_janitor(self) -> bool:
        """This rig keeps the connector's store under l2_budget_gb: a store of its own that the connector never
        evicts from, or the shared store when this rig is its one janitor (rigkit.kv_share)."""
        connector = self.profile.connector
        needs = self.l2_active and connector is not None and connector.l2_needs_janitor
        return needs and (not self.knobs["kv_share"] or self.knobs["kv_share_janitor"])

    @property
    def listen_ports(self) -> dict[str, int]:
        """knob name -> TCP port of every port the stack listens on (host networking)."""
        return listen_ports(self.profile, self.knobs)

    @property
    def gpu_ids(self) -> list[int]:
        """Host GPU indices handed to the container; empty = every GPU (or none for CPU profiles)."""
        return gpu_indices(self.knobs["gpu_mask"])

    @property
    def gpu_kv_bytes_per_token(self) -> Optional[int]:
        """KV bytes per token in each GPU's pool (KV cache dtype, TP size, the model's shape); None when the
        model's shape is not declared."""
        knobs = self.knobs
        shape = (knobs["model_attention_layers"], knobs["model_kv_heads"], knobs["model_head_dim"])
        if None in shape:
            return None
        return gpu_kv_bytes_per_token(knobs["kv_cache_dtype"], *shape, knobs["tensor_parallel_size"])

    @property
    def kv_bytes_per_token(self) -> Optional[int]:
        """What one token costs in the cache tiers (L1, L2): the knob, else the engine's own blocks for a
        connector that stores them (every GPU's share), else the profile's figure."""
        connector = self.profile.connector
        gpu = self.gpu_kv_bytes_per_token
        if self.knobs["kv_bytes_per_token"]:
            return self.knobs["kv_bytes_per_token"]
        if connector is not None and connector.stores_engine_blocks and gpu:
            return gpu * self.knobs["tensor_parallel_size"]
        return self.profile.resources.kv_bytes_per_token

    @property
    def knobs_hash(self) -> str:
        """Changes whenever anything rendered would change: profile, image or any knob."""
        knobs = {
            name: value
            for name, value in self.knobs.items()
            if name not in NOT_HASHED and not (name in HASHED_ONLY_WHEN_SET and value == KNOBS_BY_NAME[name].default)
        }
        payload = json.dumps(
            {"profile": self.profile.name, "image": self.image, "knobs": knobs}, sort_keys=True, default=str
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def capacity(self) -> str:
        """The deploy summary's capacity line for this rig: sessions per cache tier, then the GPU KV rate."""
        if not self.kv_bytes_per_token:
            line = "capacity unknown: set kv_bytes_per_token"
        else:
            l2_gb = self.knobs["l2_budget_gb"] if self.l2_active else None
            line = capacity_line(self.l1_gib or None, l2_gb, self.kv_bytes_per_token)
        if self.gpu_kv_bytes_per_token:
            line += " | " + gpu_line(
                self.gpu_kv_bytes_per_token,
                self.knobs["kv_cache_dtype"],
                self.knobs["tensor_parallel_size"],
                self.knobs["max_model_len"],
            )
        return line


def known_keys(extra_variables: Iterable[Variable] = ()) -> set[str]:
    return {knob.name for knob in KNOBS} | {v.name for v in extra_variables} | set(LAB_KEYS)


def refuse_unknown_keys(data: dict, variables: Iterable[Variable]) -> None:
    names = [key for key in data if not key.startswith(CONNECTION_PREFIXES)]
    for name in names:
        if name in RETIRED_KNOBS:
            raise ConfigError(
                name,
                data[name],
                f"no longer a setting: {RETIRED_KNOBS[name]}",
                f"remove {name} from host and group data",
            )
    refuse_unknown(names, known_keys(variables), "host data")


def _l2_path(role_values: dict[str, Any]) -> str:
    """Where the l2_disk role mounts the L2 directory (its own settings), so the two never disagree."""
    if role_values.get("l2_mount_point") and role_values.get("l2_cache_dir"):
        return l2_cache_path(role_values)
    return L2_PATH_WITHOUT_DISK_ROLE


def _check_gpu_count(knobs: dict[str, Any], mask: list[int], host_gpus: Optional[int]) -> None:
    """Tensor parallelism needs one GPU per rank: refuse more ranks than the GPUs the stack gets."""
    tensor_parallel = knobs["tensor_parallel_size"]
    if mask and tensor_parallel > len(mask):
        raise ConfigError(
            "tensor_parallel_size",
            tensor_parallel,
            f"needs {tensor_parallel} GPUs but gpu_mask {knobs['gpu_mask']!r} selects {len(mask)}",
            f"set tensor_parallel_size to at most {len(mask)}, or select more GPUs in gpu_mask",
        )
    if host_gpus:  # declared by the host's data (0: not declared, the GPU roles skip the host)
        beyond = [index for index in mask if index >= host_gpus]
        if beyond:
            raise ConfigError(
                "gpu_mask",
                knobs["gpu_mask"],
                f"names GPU {beyond[0]} but the host declares gpus: {host_gpus} (indices 0 to {host_gpus - 1})",
                "name GPUs the host has, or correct gpus",
            )
        if not mask and tensor_parallel > host_gpus:
            raise ConfigError(
                "tensor_parallel_size",
                tensor_parallel,
                f"needs {tensor_parallel} GPUs but the host declares gpus: {host_gpus}",
                f"set tensor_parallel_size to at most {host_gpus}, or correct gpus",
            )


# A long flag in the profile's shell text, also inside ${NAME:+--flag "$NAME"}.
_LONG_FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9_-]*")


def rendered_flags(profile: Profile) -> set[str]:
    """Long flags the profile's own command line sets (launcher, engine_args, the connector's config), and --model:
    `vllm serve` takes the model as its first argument, and stops on an extra --model ("unrecognized arguments")."""
    text = " ".join([profile.launcher, *profile.engine_args])
    return {engine_option(flag) for flag in _LONG_FLAG.findall(text)} | {"--kv-transfer-config", "--model"}


def guarded_spellings(profile: Profile) -> dict[str, str]:
    """Every spelling vLLM takes for a flag extra_engine_args must not set -> that flag: the profile's own flags
    (rendered_flags; a bare one in engine_args is a yes/no flag, also spelled --no-FLAG) and the engine knobs'."""
    yes_no = [item for item in profile.engine_args if _LONG_FLAG.fullmatch(item)]
    return engine_spellings(rendered_flags(profile), yes_no) | knob_flag_spellings()


def _refuse_rendered_flags(profile: Profile, extra_args: list[str]) -> None:
    """An extra argument must not set a flag rigkit renders, in any spelling vLLM reads as it (an abbreviation too):
    vLLM would silently take one of the two values."""
    spellings = guarded_spellings(profile)
    for arg in extra_args:
        reading = read_as(arg, spellings)
        if "--kv-transfer-config" in reading.flags:
            raise ConfigError(
                "extra_engine_args",
                arg,
                f"{reading}, the profile's KV connector (an A/B baseline must differ from its base only there)",
                "pick the profile with that connector (profiles.yaml) instead",
            )
        if reading.flags:
            raise ConfigError(
                "extra_engine_args",
                arg,
                f"{reading}, which profile {profile.name} already renders ({reading.outcome})",
                "set the knob that renders it (docs/settings.md), not extra_engine_args; write any other flag in full",
            )


def listen_ports(profile: Profile, knobs: dict[str, Any]) -> dict[str, int]:
    """knob name -> port of each listening port the profile's processes read (serving_port always)."""
    names = ["serving_port"] + [name for name in PORT_KNOBS[1:] if name in profile.all_knobs]
    return {name: knobs[name] for name in names}


def _refuse_shared_ports(profile: Profile, knobs: dict[str, Any]) -> None:
    """Two processes of the stack on one port: the second fails at start (host networking)."""
    taken: dict[int, str] = {}
    for name, port in listen_ports(profile, knobs).items():
        if port in taken:
            free = next(p for p in range(port + 1, 65536) if p not in taken)
            raise ConfigError(
                name,
                port,
                f"is {taken[port]} too: profile {profile.name} listens on both (host "
                "networking), so the second process would fail at start",
                f"set {name} to another port, e.g. {free}",
            )
        taken[port] = name


def _point_l2_at_kv_store(knobs: dict[str, Any], role_values: dict[str, Any]) -> None:
    """l2_kv_store_address set: LMCache's L2 is its Valkey adapter at the store (adapter_json),
    on kv_store_port from the same data the store host reads, with the password it requires."""
    address = knobs["l2_kv_store_address"]
    if address is None:
        return
    if knobs["l2_adapter_json"] is not None:
        raise ConfigError(
            "l2_adapter_json",
            knobs["l2_adapter_json"],
            "is set and so is l2_kv_store_address: two L2 adapters for one tier",
            "set one of them (l2_kv_store_address renders the Valkey adapter itself)",
        )
    if not knobs["l2_enabled"]:
        raise ConfigError(
            "l2_enabled",
            False,
            "l2_kv_store_address points the L2 tier at the store, but the L2 tier is off",
            "set l2_enabled: true, or remove l2_kv_store_address",
        )
    if knobs["kv_store_password"] is None:
        raise ConfigError(
            "kv_store_password",
            None,
            "l2_kv_store_address is set but no password: the store refuses every unauthenticated command",
            "export RIGKIT_KV_STORE_PASSWORD on the controller (the same value the kv_store role sets)",
        )
    knobs["l2_adapter_json"] = adapter_json(address, role_values.get("kv_store_port", KV_STORE_PORT.default))


def _derive(
    profile: Profile,
    knobs: dict[str, Any],
    role_values: dict[str, Any],
    share: dict[str, Any],
    profiles: Mapping[str, Profile],
) -> dict[str, Any]:
    """Fill knobs whose default depends on others; refuse combinations no host fact can fix."""
    derived = dict(knobs)
    _refuse_shared_ports(profile, derived)
    shared = shared_l2_path(profile, derived, share, profiles)
    if shared is not None:
        derived["l2_path"] = shared
    elif derived["l2_path"] is None:
        derived["l2_path"] = _l2_path(role_values)
    source = parse_model_source(derived["model_source"]) if derived["model_source"] else None
    if source is not None:
        # the engine loads the staged revision at one fixed path; the API keeps serving the declared name
        derived["model"] = MODEL_CONTAINER_PATH
        if derived["served_model_name"] is None:
            derived["served_model_name"] = source.default_served_name
        if derived["model_store_path"] is None:
            derived["model_store_path"] = posixpath.join(
                role_values.get("l2_mount_point") or DEFAULT_L2_MOUNT, MODEL_STORE_DIR
            )
    if derived["model"] is None:
        raise ConfigError(
            "model",
            None,
            f"profile {profile.name} has no default model",
            "set model (a model id or an in-container path) in host or group data",
        )
    if derived["served_model_name"] is None:
        derived["served_model_name"] = derived["model"]
    gpus = gpu_indices(derived["gpu_mask"])
    if derived["tensor_parallel_size"] is None:
        derived["tensor_parallel_size"] = len(gpus) or max(profile.resources.gpus, 1)
    if gpus and len(gpus) < profile.resources.gpus:
        raise ConfigError(
            "gpu_mask",
            derived["gpu_mask"],
            f"selects {len(gpus)} GPU(s) but profile {profile.name} needs {profile.resources.gpus}",
            f"select at least {profile.resources.gpus} GPUs, or clear gpu_mask to use every GPU",
        )
    _check_gpu_count(derived, gpus, role_values.get("gpus"))
    _point_l2_at_kv_store(derived, role_values)
    _refuse_rendered_flags(profile, derived["extra_engine_args"])
    l1_gib = derived["l1_size_gb"] if profile.l1_in_limits else 0
    needed = required_mem_limit_gib(l1_gib, derived["model_size_gb"], derived["mem_headroom_gb"])
    if derived["mem_limit_gb"] is None:
        derived["mem_limit_gb"] = needed
    elif derived["mem_limit_gb"] < needed:
        raise ConfigError(
            "mem_limit_gb",
            derived["mem_limit_gb"],
            f"below L1 {l1_gib} + model page cache {derived['model_size_gb']} + headroom "
            f"{derived['mem_headroom_gb']} = {needed} GiB (pinned L1 and mmap'd weights both count "
            "against the container; too small crash-loops with 'WorkerProc initialization failed')",
            f"set mem_limit_gb to at least {needed}, or lower l1_size_gb",
        )
    return derived


def secrets_from_controller(data: dict) -> dict[str, str]:
    """Secret knobs host data leaves unset, from the controller's environment (RIGKIT_HF_TOKEN for hf_token)."""
    found = {name: os.environ.get(controller_secret_variable(name)) for name in SECRET_KNOBS if name not in data}
    return {name: value for name, value in found.items() if value is not None}


def required_secret(data: dict, name: str, needed_by: str) -> str:
    """A secret knob a role needs on a host without a serving stack (the store's password), from host data or
    the controller's environment, validated; ConfigError (the value redacted) when missing or refused."""
    values = {**secrets_from_controller(data), **data}
    if values.get(name) is None:
        raise ConfigError(
            name,
            None,
            f"{needed_by} needs it and it is not set",
            f"export {controller_secret_variable(name)} on the controller (never in host data or "
            "--data: both end up in logs and ps)",
        )
    try:
        return KNOBS_BY_NAME[name].coerce(values[name])
    except ConfigError as exc:
        raise ConfigError(name, REDACTED, exc.problem, exc.fix) from None


def settings_for_host(
    data: dict, profiles: Optional[dict[str, Profile]] = None, variables: Optional[Iterable[Variable]] = None
) -> Settings:
    """Validated Settings for one host's data; ConfigError (naming the field) on any bad input."""
    variables = ALL_VARIABLES if variables is None else list(variables)
    refuse_unknown_keys(data, variables)
    profiles = load_profiles() if profiles is None else profiles
    if "serving_profile" not in data:
        raise ConfigError(
            "serving_profile",
            None,
            "no profile selected",
            f"set serving_profile to one of {', '.join(sorted(profiles))}",
        )
    profile = get_profile(profiles, KNOBS_BY_NAME["serving_profile"].coerce(data["serving_profile"]))
    try:
        knobs = resolve(
            KNOBS,
            {
                **profile.defaults,
                **secrets_from_controller(data),
                **{k: v for k, v in data.items() if k in KNOBS_BY_NAME},
            },
        )
    except ConfigError as exc:
        if exc.field in SECRET_KNOBS:  # never echo a token into a log
            raise ConfigError(exc.field, REDACTED, exc.problem, exc.fix) from None
        raise
    if knobs["model_source"] and "model" in data:
        raise ConfigError(
            "model",
            data["model"],
            f"is set and so is model_source: the engine loads the staged model_source at {MODEL_CONTAINER_PATH}",
            "remove model (served_model_name keeps the API's name)",
        )
    if profile.status == "incubating" and not knobs["allow_incubating"]:
        raise ConfigError(
            "serving_profile",
            profile.name,
            "is incubating: deploying it needs an explicit opt-in",
            "set allow_incubating: true for this host or group, or pick a production profile",
        )
    if knobs["serving_image"] is not None:
        image = require_digest(knobs["serving_image"], "serving_image", profile.image_repo)
    elif profile.image is not None:
        image = require_digest(profile.image, f"profiles.{profile.name}.image")
    else:
        raise ConfigError(
            "serving_image",
            None,
            f"profile {profile.name} pins no image",
            f"set serving_image to {profile.image_repo}@sha256:<64 hex> "
            f"(`rigkit resolve {profile.image_repo}:TAG` prints it)",
        )
    share = resolve(KV_SHARE_VARIABLES, data)  # where a shared store lives, whichever variables are validated
    return Settings(
        profile=profile, image=image, knobs=_derive(profile, knobs, resolve(variables, data), share, profiles)
    )


@dataclass(frozen=True)
class RigSettings:
    """One rig's settings, validated once: the stack (None when no profile is declared) and every role's
    variables by section (``settings.docker["docker_source"]``; sections are rigkit.settings.defaults.ROLE_SECTIONS)."""

    declared_stack: Optional[Settings]
    sections: Mapping[str, Mapping[str, Any]]
    # the host data and profiles they were built from, to derive another release's settings
    data: Mapping[str, Any]
    profiles: Optional[dict[str, Profile]] = None

    def for_image(self, image: str) -> "RigSettings":
        """These settings with the stack of ``image`` (a rollback target), validated like the declared one."""
        stack = settings_for_host({**self.data, "serving_image": image}, self.profiles)
        return RigSettings(stack, self.sections, self.data, self.profiles)

    @property
    def stack(self) -> Settings:
        """The serving stack's Settings; ConfigError when the host declares no serving_profile."""
        if self.declared_stack is None:
            raise ConfigError(
                "serving_profile",
                None,
                "this run needs a serving stack but the host selects none",
                "set serving_profile in host or group data (profiles.yaml lists them)",
            )
        return self.declared_stack

    def __getattr__(self, section: str) -> Mapping[str, Any]:
        try:
            return self.sections[section]
        except KeyError:
            raise AttributeError(section) from None


def check_relations(sections: Mapping[str, Mapping[str, Any]]) -> None:
    """ConfigError for role settings each valid alone but not together: a label longer than its filesystem
    keeps, a plain-http package repository without the opt-in, an allow-list that cuts every client off."""
    l2 = sections["l2_disk"]
    problem = label_problem(l2["l2_label"], l2["l2_fstype"])
    if problem:
        raise ConfigError(
            "l2_label",
            l2["l2_label"],
            problem,
            f"write a label of at most {LABEL_LIMITS[l2['l2_fstype']]} characters, e.g. rigkit-l2",
        )
    if not sections["host"]["package_repos_allow_http"]:
        for section in sections.values():
            for name, value in section.items():
                if name in PACKAGE_REPOSITORY_SETTINGS and value and plain_http_problem(value):
                    raise ConfigError(
                        name,
                        value,
                        plain_http_problem(value),
                        f"write https://{value[len('http://') :]}, or set package_repos_allow_http: "
                        "true for a mirror on a network you trust",
                    )
    firewall = sections["api_firewall"]
    if firewall["api_firewall"] and not firewall["api_allowed_sources"] and not firewall["api_allow_controller"]:
        raise ConfigError(
            "api_allowed_sources",
            [],
            "is empty while api_allow_controller is false: only the rig "
            "itself could reach its API (the router, the controller and every client cut off)",
            "list the router's address in api_allowed_sources, or set api_allow_controller: true",
        )
    health = sections["gpu_health"]
    if health["gpu_temp_warn_c"] >= health["gpu_temp_fail_c"]:
        raise ConfigError(
            "gpu_temp_warn_c",
            health["gpu_temp_warn_c"],
            f"is not below gpu_temp_fail_c ({health['gpu_temp_fail_c']} °C): status would fail a GPU before warning",
            "set gpu_temp_warn_c below gpu_temp_fail_c, e.g. 85 and 92",
        )
    store = sections["kv_store"]
    if store["kv_store_firewall"] and store["kv_store_allowed_sources"] == []:
        raise ConfigError(
            "kv_store_allowed_sources",
            [],
            "is empty: no rig could reach the store",
            "leave it unset (every rig of the inventory) or list the rigs' addresses",
        )


def rig_settings(data: dict, profiles: Optional[dict[str, Profile]] = None, needs_stack: bool = True) -> RigSettings:
    """Every setting of one host, validated: ConfigError (naming the field) on any bad input.

    ``needs_stack=False``: a host without a serving_profile is fine (a provisioning role run on its own)."""
    refuse_unknown_keys(data, ALL_VARIABLES)
    connection_values(data)
    declared = needs_stack or data.get("serving_profile") is not None
    stack = settings_for_host(data, profiles) if declared else None
    sections = {name: resolve(variables, data) for name, variables in ROLE_SECTIONS.items()}
    refuse_on_shared_network(API_FIREWALL, data, sections["api_firewall"]["api_firewall"])
    check_share_settings(sections["kv_share"])
    check_relations(sections)
    return RigSettings(stack, sections, dict(data), profiles)


# --- the shared KV tier's settings (rigkit.kv_share: the fleet-wide checks and the fstab line) ---

NFS_FSTYPES = ("nfs", "nfs4")


def nfs_export(source: str) -> Optional[tuple[str, str]]:
    """(server, export path) of an NFS source as nfs(5) writes it, ``SERVER:/PATH``, an IPv6 server in brackets
    (``[fd00::1]:/export``); None for anything else."""
    if source.startswith("["):
        address, bracket, rest = source[1:].partition("]")
        if not (bracket and address and rest.startswith(":")):
            return None
        server, export = f"[{address}]", rest[1:]
    else:
        server, _, export = source.partition(":")
    return (server, export) if server and export.startswith("/") else None


def check_share_settings(section: Mapping[str, Any]) -> None:
    """An NFS source names its server and export (``server:/export``): anything else no mount can take."""
    source, fstype = section["kv_share_source"], section["kv_share_fstype"]
    if source is None or fstype not in NFS_FSTYPES:
        return
    if nfs_export(source) is None:
        raise ConfigError(
            "kv_share_source",
            source,
            f"is not an NFS export (kv_share_fstype {fstype})",
            "write it as SERVER:/EXPORT, e.g. nas:/export/rigkit-kv ([fd00::1]:/export for an IPv6 server)",
        )


def shareable_profiles(profiles: Mapping[str, Any]) -> list[str]:
    return sorted(name for name, profile in profiles.items() if profile.connector and profile.connector.shareable)


def shared_l2_path(
    profile: Any, knobs: Mapping[str, Any], section: Mapping[str, Any], profiles: Mapping[str, Any]
) -> Optional[str]:
    """Where the connector store lives with ``kv_share`` on (None when off); ConfigError when the profile has
    no shared-capable tier, no source is declared, or an explicit l2_path lies off the shared mount."""
    if not knobs["kv_share"]:
        return None  # kv_share_janitor alone says nothing: it names the janitor of a store once one is shared
    if not (profile.connector and profile.connector.shareable):
        raise ConfigError(
            "kv_share",
            True,
            f"profile {profile.name} has no tier that can live on a shared mount",
            f"use a profile with one ({', '.join(shareable_profiles(profiles))}), or set kv_share: false",
        )
    if section["kv_share_source"] is None:
        raise ConfigError(
            "kv_share_source",
            None,
            "kv_share is on but no shared mount is declared",
            "set kv_share_source (e.g. nas:/export/rigkit-kv) and kv_share_mount_point in group data",
        )
    mount_point = section["kv_share_mount_point"]
    path = knobs["l2_path"] or kv_share_store_path(section)
    if posixpath.commonpath([path, mount_point]) != mount_point or path == mount_point:
        raise ConfigError(
            "l2_path",
            path,
            f"is not a directory inside the shared mount {mount_point} (kv_share)",
            "leave l2_path unset (the store then is kv_share_mount_point/kv_share_store_dir)",
        )
    return path


# --- the fleet's KV store as LMCache's L2 (rigkit.kv_store runs the store) ---

# How long LMCache's Valkey adapter waits on the store (its glide client's timeouts, seconds), rendered into the
# adapter JSON so what a dead store costs is stated here, not left to LMCache's defaults: one request (a lookup,
# a get, a put) gives up after REQUEST_TIMEOUT_S, the first connection after CONNECTION_TIMEOUT_S. Equal to
# LMCache's own defaults (valkey_l2_adapter.py DEFAULT_REQUEST_TIMEOUT_SECS / DEFAULT_CONNECTION_TIMEOUT_SECS,
# LMCache d4eb1aa2); what LMCache does with a request that timed out (serve from L1, recompute) is unmeasured here.
ADAPTER_REQUEST_TIMEOUT_S = 5.0
ADAPTER_CONNECTION_TIMEOUT_S = 10.0


def adapter_json(address: str, port: int) -> str:
    """LMCache's Valkey L2 adapter config for the store at ``address``:``port``, without the password
    (the entrypoint adds it from RIGKIT_KV_STORE_PASSWORD), with the timeouts rigkit states for a dead store.
    LMCache splits ``startup_nodes`` at its last ':' (an IPv6 address needs no brackets)."""
    return '{"type":"valkey","startup_nodes":"%s:%d","request_timeout":%s,"connection_timeout":%s}' % (
        address,
        port,
        ADAPTER_REQUEST_TIMEOUT_S,
        ADAPTER_CONNECTION_TIMEOUT_S,
    )
