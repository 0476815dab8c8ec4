"""The serving knob registry: every tunable of a serving stack, declared once.

Host or group data sets knobs by name (``l1_size_gb: 60``). A profile (profiles.yaml) lists the knobs
its container reads and may change a knob's default; host data overrides both. Knobs with an ``env``
name reach the container through ``.env`` and a ``NAME=${NAME:-}`` line in the compose
``environment:`` block (rigkit/serving/render.py derives both from this list); the others shape the compose
file itself (limits, mounts, restart policy) or steer rigkit (gates, timeouts).

Never name an env var VLLM_PORT or VLLM_HOST_IP: vLLM reads those itself.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

from rigkit.errors import ConfigError
from rigkit.settings.engine_args import engine_spellings, read_as
from rigkit.settings.model_source import parse_model_source
from rigkit.settings.types import IpAddress, between, check_bind_source, refuse_credentials
from rigkit.settings.variables import REDACTED, JsonObject, Refusal, Variable, check_of, one_of

# Host paths and env values travel through .env and compose; both readers (compose v1's python-dotenv,
# compose v2's Go parser) must read back exactly what was declared.
FORBIDDEN_CHARACTERS = {"\n": "a newline", "\r": "a carriage return", "\x00": "a NUL byte"}

RESTART_POLICIES = ("no", "always", "unless-stopped", "on-failure")

# Short passwords fall to guessing: valkey answers AUTH in microseconds and never locks an account out.
MIN_PASSWORD_LENGTH = 16


def password_problem(text: str) -> Optional[str]:
    """Why ``text`` cannot be the store's password, or None.

    valkey.conf would take most characters inside double quotes with escapes, but the role reads the password
    back from the file for its checks (``auth_from_config_script``) and .env carries it to the rigs: a quote, a
    backslash, whitespace or a control character would need escaping in one of them, so such values are refused.
    """
    if len(text) < MIN_PASSWORD_LENGTH:
        return f"has {len(text)} characters, fewer than {MIN_PASSWORD_LENGTH} (valkey never slows down guessing)"
    for char in text:
        if char in "\"'\\":
            return "contains a quote or a backslash, which valkey.conf and .env would each need escaped"
        if char.isspace() or not char.isprintable():
            return f"contains whitespace or a control character ({char!r})"
    return None


# Names that were knobs once, and why they are gone: host data still setting one is refused with the reason.
RETIRED_KNOBS = {
    "shm_size_gb": "the stack runs with `ipc: host`, so the container's /dev/shm is the rig's own and compose "
    "ignored shm_size; the preflight checks the rig's /dev/shm instead",
}

# l2_path when it is not set and no l2_disk role declares where the L2 disk is mounted.
L2_PATH_WITHOUT_DISK_ROLE = "/var/lib/rigkit/kv"


def env_value_problem(text: str) -> Optional[str]:
    """Why ``text`` cannot be written to .env so that compose v1 and v2 read it back unchanged, or None."""
    for char, name in FORBIDDEN_CHARACTERS.items():
        if char in text:
            return f"contains {name}"
    if "${" in text:
        # compose v1 (python-dotenv) expands ${...} even inside single quotes.
        return "contains '${', which compose would expand"
    needs_double_quotes = "'" in text or "\\" in text
    if needs_double_quotes and "$" in text:
        # Inside double quotes compose v2 expands $NAME and $$: no quoting keeps both ' (or \) and $.
        return "contains both a quote or backslash and '$', which no .env quoting keeps for both compose versions"
    if needs_double_quotes and (text.endswith('"') or text.endswith("\\")):
        # compose v2 takes an escaped quote or backslash right before the closing quote as its end
        return "ends with '\"' or a backslash and also contains a quote or backslash"
    return None


# The fix for what .env cannot carry (env_value_problem): only ever given for that.
ONE_LINE_FIX = "write it on one line, without NUL, '${' or both a quote and '$'"


def _text(extra=None):
    """A check for strings that reach .env or compose: refuses what compose cannot carry."""

    def check(value: str) -> None:
        problem = env_value_problem(value)
        if problem:
            raise Refusal(problem, ONE_LINE_FIX)
        if extra is not None:
            extra(value)

    # the extra check's own fix for what it refuses (never the one-line fix: that is for env_value_problem's)
    check.fix = getattr(extra, "fix", "") if extra is not None else ONE_LINE_FIX
    return check


# TCP ports a setting may name (0 means "any free port" to the kernel: never what a server should bind).
PORT_RANGE = (1, 65535)


check_port = between(*PORT_RANGE)


def gpu_indices(mask: str) -> list[int]:
    """The GPU indices of a gpu_mask ("" = every GPU: no index)."""
    return [int(part) for part in mask.split(",")] if mask else []


def _gpu_mask(value: str) -> None:
    if value and not re.fullmatch(r"[0-9]+(,[0-9]+)*", value):
        raise ValueError("must be GPU indices separated by commas, e.g. 0,1 (empty = every GPU)")
    indices = gpu_indices(value)
    repeated = sorted({index for index in indices if indices.count(index) > 1})
    if repeated:
        raise ValueError(
            f"names GPU {', '.join(map(str, repeated))} more than once: each GPU is one "
            "tensor-parallel rank, so a repeat would run two ranks on one GPU"
        )


_gpu_mask.fix = "write each GPU index once, separated by commas, e.g. 0,1 (empty = every GPU)"


def _profile_name(value: str) -> None:
    # a near-miss (lmcache_mp) passes on to rigkit.settings.profiles.get_profile, which names the closest profile
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", value):
        raise ValueError("must be a profile name from profiles.yaml")


_profile_name.fix = "write a profile name from profiles.yaml, e.g. cpu-lab"


def _model_source(value: str) -> None:
    try:
        parse_model_source(value)
    except ConfigError as exc:
        raise Refusal(exc.problem, exc.fix) from None


_model_source.fix = "write org/name@<40-hex commit>, controller:/dir@<manifest sha256> or shared:/dir@<manifest sha256>"


def _image(value: str) -> None:
    if any(char.isspace() for char in value):
        raise ValueError("must not contain whitespace")


_image.fix = "write the image as REPO@sha256:<64 hex> (`rigkit resolve IMAGE:TAG` prints it)"


# What vLLM 0.26.0 accepts (vllm/config/cache.py: CacheDType, MambaCacheMode;
# vllm/model_executor/layers/quantization/__init__.py: QuantizationMethods), so a typo is refused before
# any host is touched instead of crash-looping the container. Another vLLM may accept others: add them here.
KV_CACHE_DTYPES = (
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
    "nvfp4",
)
MAMBA_CACHE_MODES = ("all", "align", "none")
QUANTIZATION_METHODS = (
    "awq",
    "auto_awq",
    "fp8",
    "fbgemm_fp8",
    "fp_quant",
    "modelopt",
    "modelopt_fp4",
    "modelopt_mxfp8",
    "modelopt_mixed",
    "auto_gptq",
    "gptq",
    "gptq_marlin",
    "awq_marlin",
    "humming",
    "compressed-tensors",
    "bitsandbytes",
    "experts_int8",
    "quark",
    "moe_wna16",
    "torchao",
    "inc",
    "mxfp4",
    "gpt_oss_mxfp4",
    "deepseek_v4_fp8",
    "online",
    "fp8_per_tensor",
    "fp8_per_block",
    "fp8_per_channel",
    "int8_per_channel_weight_only",
    "nvfp4_per_token",
    "mxfp8",
)

# Engine knob -> the vLLM flag it renders (rigkit/serving/render.py). A bool renders the bare flag when true.
ENGINE_FLAGS = {
    "speculative_config": "--speculative-config",
    "kv_cache_dtype": "--kv-cache-dtype",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_num_seqs": "--max-num-seqs",
    "mamba_cache_mode": "--mamba-cache-mode",
    "quantization": "--quantization",
    "trust_remote_code": "--trust-remote-code",
}

# Knobs that did not exist when earlier releases were recorded: at their default they stay out of the knobs
# hash, so a rig deployed before them is still "No Change" when they are left unset.
HASHED_ONLY_WHEN_SET = frozenset(
    {
        *ENGINE_FLAGS,
        "extra_engine_args",
        "model_attention_layers",
        "model_kv_heads",
        "model_head_dim",
        "lmcache_port",
        "lmcache_http_port",
        "l2_kv_store_address",
        "kv_store_password",
        "kv_share",
        "kv_hash_seed",
        "model_source",
        "model_store_path",
    }
)
# Knobs that steer rigkit on the rig, never the container: changing them restarts no engine.
NOT_HASHED = frozenset({"kv_share_janitor", "model_store_keep"})

# The longest context a setting may name (16 Mi tokens: ten times today's longest models').
MAX_CONTEXT_TOKENS = 2**24

# PYTHONHASHSEED takes 0 (no randomisation) to 4294967295 (Python's own bound).
HASH_SEED_RANGE = (0, 2**32 - 1)


# What vLLM uses when gpu_memory_utilization is unset (vLLM 0.26 vllm/config/cache.py, CacheConfig: default=0.92):
# also the share of each GPU's memory that must be free for it to start (rigkit.preflight.gpus.check_gpus).
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92


def _fraction_of_gpu(value: float) -> None:
    # vLLM's own bound (CacheConfig.gpu_memory_utilization: gt=0, le=1)
    if not 0 < value <= 1:
        raise ValueError("must be a fraction above 0 and at most 1, e.g. 0.92")


_fraction_of_gpu.fix = "write a fraction above 0 and at most 1, e.g. 0.92"


def _adapter_json(value: str) -> None:
    # the adapter reaches the LMCache server's command line (ps), status, the card and the ledger
    refuse_credentials(
        json.loads(value),
        "ps on the rig, its status and its card",
        "; a Valkey store's password is kv_store_password (l2_kv_store_address renders the adapter)",
    )


_adapter_json.fix = (
    'write one JSON object without credentials, e.g. {"type": "fs", "base_path": "/kv-store"}: a Valkey store '
    "takes l2_kv_store_address and kv_store_password (read from the controller's environment)"
)


def _speculative_config(value: str) -> None:
    config = json.loads(value)
    # vLLM needs a method or a draft model to know what to run (vllm/config/speculative.py)
    if not config.get("method") and not config.get("model"):
        raise ValueError('names neither a "method" (e.g. "mtp", "ngram", "eagle3") nor a draft "model"')
    tokens = config.get("num_speculative_tokens")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise ValueError(f'"num_speculative_tokens" must be a whole number of at least 1, got {tokens!r}')


_speculative_config.fix = (
    'write speculative decoding as a JSON object, e.g. {"method": "mtp", "num_speculative_tokens": 3}'
)


def _engine_args(value: list) -> None:
    for index, arg in enumerate(value):
        if not isinstance(arg, str):
            raise ValueError(f"item {index} is {type(arg).__name__} {arg!r}: each argument must be a string")
        if "\x00" in arg:
            raise ValueError(f"item {index} contains a NUL byte, which no program argument can carry")
        reading = read_as(arg, knob_flag_spellings())
        if reading.flags:
            knobs = " or ".join(knob for knob, flag in ENGINE_FLAGS.items() if flag in reading.flags)
            raise ValueError(
                f"item {index} ({arg!r}) {reading}, which the {knobs} knob renders ({reading.outcome}): "
                f"set {knobs} instead"
            )


_engine_args.fix = (
    "write a list of strings, one argument each, each flag in full, and set rigkit's own flags through their knobs"
)


def knob_flag_spellings() -> dict[str, str]:
    """Every spelling vLLM takes for an engine knob's flag -> that flag (a bool knob's flag also as --no-FLAG)."""
    yes_no = [flag for knob, flag in ENGINE_FLAGS.items() if KNOBS_BY_NAME[knob].type is bool]
    return engine_spellings(ENGINE_FLAGS.values(), yes_no)


KNOBS: list[Variable] = [
    # Which stack, which image.
    Variable(
        "serving_profile",
        None,
        "profile from profiles.yaml to deploy (lmcache-mp, native-offload, prefix-only, cpu-lab, ...)",
        str,
        _text(_profile_name),
        optional=False,
    ),
    Variable(
        "serving_image",
        None,
        "image by digest (repo@sha256:...); overrides the profile's image",
        str,
        _text(_image),
        optional=True,
    ),
    Variable("allow_incubating", False, "opt in to deploying a profile whose status is incubating", bool),
    Variable(
        "force",
        False,
        "turn forceable preflight refusals (GPU memory, L2 budget) into warnings; never overrides the RAM gate",
        bool,
    ),
    # The model and the API.
    Variable(
        "model", None, "model id or in-container path vLLM loads", str, _text(), env="RIGKIT_MODEL", optional=False
    ),
    Variable(
        "model_source",
        None,
        "the model's weights, pinned (rigkit.settings.model_source): org/name@<40-hex commit> "
        "(a hub repository at a commit), controller:/dir@<manifest sha256> (`rigkit resolve-model` prints "
        "either): staged into model_store_path on every rig before the release; or shared:/dir@<manifest sha256>, "
        "a directory every rig already mounts (a share): verified in place, not copied. Mounted read-only at "
        "/model, the hub offline in the container; empty = model as vLLM loads it",
        str,
        _text(_model_source),
        optional=True,
    ),
    Variable(
        "model_store_path",
        None,
        "host directory of the model store (staged revisions); empty = "
        "models/ under the l2_disk role's l2_mount_point (the NVMe)",
        str,
        _text(check_bind_source),
        optional=True,
    ),
    Variable(
        "model_store_keep",
        2,
        "staged revisions of the model kept on the rig, newest deployed first; a "
        "revision a recorded release needs (current, last known-good, rollback target) is never removed",
        int,
        between(1, 100),
    ),
    Variable(
        "served_model_name",
        None,
        "name the API serves the model under (/v1/models)",
        str,
        _text(),
        env="RIGKIT_SERVED_MODEL_NAME",
        optional=True,
    ),
    Variable("serving_port", 8000, "TCP port of the OpenAI API", int, check_port, env="RIGKIT_SERVING_PORT"),
    Variable(
        "bind_address",
        "127.0.0.1",
        "address the API listens on (host networking)",
        str,
        _text(IpAddress()),
        env="RIGKIT_BIND_ADDRESS",
    ),
    Variable(
        "max_model_len",
        None,
        "--max-model-len (context limit; empty = the model's)",
        int,
        between(256, MAX_CONTEXT_TOKENS, "tokens"),
        env="RIGKIT_MAX_MODEL_LEN",
        optional=True,
    ),
    Variable(
        "max_num_batched_tokens",
        None,
        "--max-num-batched-tokens (empty = vLLM's default)",
        int,
        between(256, MAX_CONTEXT_TOKENS, "tokens"),
        env="RIGKIT_MAX_NUM_BATCHED_TOKENS",
        optional=True,
    ),
    Variable(
        "num_gpu_blocks_override",
        None,
        "--num-gpu-blocks-override: shrink the KV pool (tests evict with it)",
        int,
        between(1, 2**31 - 1, "blocks"),
        env="RIGKIT_NUM_GPU_BLOCKS_OVERRIDE",
        optional=True,
    ),
    Variable(
        "tensor_parallel_size",
        None,
        "--tensor-parallel-size (empty = number of selected GPUs)",
        int,
        between(1, 64, "GPUs"),
        env="RIGKIT_TENSOR_PARALLEL_SIZE",
        optional=True,
    ),
    Variable(
        "gpu_mask",
        "",
        "host GPU indices given to the container, e.g. 0,1 (empty = every GPU)",
        str,
        _text(_gpu_mask),
        allow_empty=True,
    ),
    Variable(
        "hf_token",
        None,
        "Hugging Face token for gated models (.env only, mode 0600)",
        str,
        _text(),
        env="HF_TOKEN",
        optional=True,
        secret=True,
    ),
    Variable(
        "cpu_kvcache_space_gb",
        None,
        "VLLM_CPU_KVCACHE_SPACE in GiB (CPU builds of vLLM)",
        int,
        between(1, 4096, "GiB"),
        env="VLLM_CPU_KVCACHE_SPACE",
        optional=True,
    ),
    # The KV cache tiers.
    Variable(
        "l1_size_gb",
        30,
        "L1 CPU-RAM KV cache size in GiB (2^30 bytes, as lmcache server --l1-size-gb "
        "counts it; native-offload gets the same bytes)",
        int,
        between(1, 4096, "GiB"),
        env="LMCACHE_L1_GB",
    ),
    Variable("l2_enabled", False, "persist the KV cache on disk (L2) under l2_path", bool, env="LMCACHE_L2"),
    Variable(
        "l2_adapter_json",
        None,
        "LMCache L2 adapter as a JSON object (empty = fs adapter on l2_path)",
        JsonObject,
        _text(_adapter_json),
        env="LMCACHE_L2_ADAPTER",
        optional=True,
    ),
    Variable(
        "l2_path",
        None,
        "host directory of the L2 disk tier, mounted into the container (empty = the "
        "l2_disk role's l2_mount_point/l2_cache_dir)",
        str,
        _text(check_bind_source),
        optional=True,
    ),
    Variable(
        "l2_budget_gb",
        100.0,
        "disk the L2 tier may fill, in GB (preflight refuses less free space)",
        float,
        between(0.01, 1_000_000, "GB"),
    ),
    Variable(
        "chunk_size",
        256,
        "LMCache chunk size in tokens (LMCache's own default; the lmcache-mp profile sets 1024: see its defaults); "
        "whole chunks only are stored, a prompt's tail past its last one is recomputed",
        int,
        between(16, 65536, "tokens"),
        env="LMCACHE_CHUNK_SIZE",
    ),
    Variable(
        "l2_kv_store_address",
        None,
        "lmcache-mp: IP address of the fleet's Valkey store (a host of the "
        "kv_stores group, one of its kv_store_bind_addresses): LMCache's L2 is then its Valkey adapter at this "
        "address and kv_store_port, authenticated with kv_store_password (needs l2_enabled)",
        str,
        _text(IpAddress()),
        optional=True,
    ),
    Variable(
        "kv_store_password",
        None,
        "the Valkey store's password (requirepass), which the store "
        "requires and the rigs' LMCache sends; from the controller's RIGKIT_KV_STORE_PASSWORD, at least "
        f"{MIN_PASSWORD_LENGTH} characters, no quote, backslash, whitespace or control character",
        str,
        _text(
            check_of(
                password_problem,
                "export a longer password without quotes, backslashes or whitespace in RIGKIT_KV_STORE_PASSWORD",
            )
        ),
        env="RIGKIT_KV_STORE_PASSWORD",
        optional=True,
        secret=True,
    ),
    Variable(
        "lmcache_port",
        5555,
        "TCP port of the LMCache server's ZMQ socket (lmcache server --port; the "
        "connector's lmcache.mp.port), host networking",
        int,
        between(1024, 65535),
        env="LMCACHE_PORT",
    ),
    Variable(
        "lmcache_http_port",
        8080,
        "TCP port of the LMCache server's HTTP API on the rig's loopback "
        "(/metrics, /healthcheck; lmcache server --http-port)",
        int,
        between(1024, 65535),
        env="LMCACHE_HTTP_PORT",
    ),
    # The shared KV tier (issue 15): the connector's store on the kv_share role's mount, read by several rigs.
    Variable(
        "kv_share",
        False,
        "the profile's connector store lives on the shared mount (the kv_share role's "
        "kv_share_mount_point/kv_share_store_dir) instead of the L2 disk; only profiles with a shared-capable "
        "tier (profiles.yaml: shareable) take it",
        bool,
    ),
    Variable(
        "kv_share_janitor",
        False,
        "with kv_share: this rig runs the L2 janitor on the shared store (exactly "
        "one rig per store: the others never evict what their peers wrote)",
        bool,
    ),
    Variable(
        "kv_hash_seed",
        0,
        "PYTHONHASHSEED of the engine wherever a store's keys come from Python's hash() "
        "(native-tiered's fs tier) or the store is shared (kv_share): one value fleet-wide, set in group data",
        int,
        between(*HASH_SEED_RANGE),
        env="PYTHONHASHSEED",
    ),
    Variable(
        "kv_bytes_per_token",
        None,
        "KV cache cost per token in bytes, for capacity sizing (empty = the profile's)",
        int,
        between(1, 2**24, "bytes"),
        optional=True,
    ),
    # Container limits.
    Variable(
        "model_size_gb",
        30,
        "page cache of the model weights that counts against mem_limit, in GiB",
        int,
        between(0, 4096, "GiB"),
    ),
    Variable(
        "mem_headroom_gb",
        20,
        "memory above L1 + model the container needs (runtime, activations), GiB",
        int,
        between(0, 4096, "GiB"),
    ),
    Variable(
        "mem_limit_gb",
        None,
        "container memory limit = swap limit, in GiB as compose's g counts it (empty = L1 + model + headroom)",
        int,
        between(1, 65536, "GiB"),
        optional=True,
    ),
    Variable(
        "restart_policy",
        "unless-stopped",
        "compose restart policy: no | always | unless-stopped | on-failure",
        str,
        one_of(RESTART_POLICIES),
    ),
    # Gates and lifecycle.
    Variable(
        "ram_reserve_gb",
        28,
        "RAM left to the host in GiB: refuse when MemAvailable < L1 + this (even forced)",
        int,
        between(0, 4096, "GiB"),
    ),
    Variable(
        "gpu_free_fraction_min",
        0.8,
        "each selected GPU must have at least this fraction of memory free",
        float,
        between(0.0, 1.0),
    ),
    Variable("ready_timeout_s", 600, "seconds to wait for /v1/models after up -d", int, between(1, 86400, "seconds")),
    Variable(
        "keep_images", 2, "serving images kept on the rig (older ones are pruned)", int, between(1, 100, "images")
    ),
    # The engine: rendered as vLLM flags into the entrypoint only when set (ENGINE_FLAGS), so leaving them
    # unset renders what rigkit rendered before they existed.
    Variable(
        "speculative_config",
        None,
        "--speculative-config: speculative decoding as a JSON object (a dict or "
        'its JSON text), e.g. {"method": "mtp", "num_speculative_tokens": 3}; empty = off',
        JsonObject,
        _speculative_config,
        optional=True,
    ),
    Variable(
        "kv_cache_dtype",
        None,
        "--kv-cache-dtype: GPU KV cache element type (one of vLLM 0.26's: "
        + ", ".join(KV_CACHE_DTYPES)
        + "); empty = auto, the model's dtype",
        str,
        one_of(KV_CACHE_DTYPES),
        optional=True,
    ),
    Variable(
        "gpu_memory_utilization",
        None,
        "--gpu-memory-utilization: fraction of each GPU's memory vLLM may "
        f"use, in (0, 1] (empty = vLLM's default, {VLLM_DEFAULT_GPU_MEMORY_UTILIZATION})",
        float,
        _fraction_of_gpu,
        optional=True,
    ),
    Variable(
        "max_num_seqs",
        None,
        "--max-num-seqs: sequences scheduled at once (empty = vLLM's default)",
        int,
        between(1, 65536),
        optional=True,
    ),
    Variable(
        "mamba_cache_mode",
        None,
        "--mamba-cache-mode: Mamba-state caching of hybrid models, one of "
        + ", ".join(MAMBA_CACHE_MODES)
        + " (empty = vLLM's choice)",
        str,
        one_of(MAMBA_CACHE_MODES),
        optional=True,
    ),
    Variable(
        "quantization",
        None,
        "--quantization: weight quantization method (one of vLLM 0.26's methods, "
        "e.g. fp8, awq, gptq_marlin); empty = what the checkpoint's config declares",
        str,
        one_of(QUANTIZATION_METHODS),
        optional=True,
    ),
    Variable("trust_remote_code", False, "--trust-remote-code: run the model repository's own Python code", bool),
    Variable(
        "extra_engine_args",
        [],
        "more vLLM arguments, a list of strings, each passed as exactly one "
        'argument (never split or expanded), e.g. ["--enable-chunked-prefill"]; each flag in full, and none '
        "that vLLM reads as a flag rigkit renders (a prefix, short name or --no- form of one is refused too)",
        list,
        _engine_args,
    ),
    # The model's attention KV shape (its config.json): with kv_cache_dtype and tensor_parallel_size it gives
    # the GPU KV per token (rigkit.settings.sizing.gpu_kv_bytes_per_token), which sets the longest context, not the
    # cache tiers' cost (kv_bytes_per_token).
    Variable(
        "model_attention_layers",
        None,
        "layers of the model that keep a KV cache (full-attention layers of a hybrid model), for the GPU KV per token",
        int,
        between(1, 1024, "layers"),
        optional=True,
    ),
    Variable(
        "model_kv_heads",
        None,
        "KV heads per attention layer (config.json num_key_value_heads)",
        int,
        between(1, 1024, "heads"),
        optional=True,
    ),
    Variable(
        "model_head_dim", None, "elements per KV head (config.json head_dim)", int, between(1, 16384), optional=True
    ),
]

KNOBS_BY_NAME: dict[str, Variable] = {knob.name: knob for knob in KNOBS}

# The TCP ports a stack listens on (host networking), where its profile reads them: preflighted, never shared.
PORT_KNOBS = ("serving_port", "lmcache_port", "lmcache_http_port")

# Never printed, never in compose: only in .env (mode 0600) and the stored verified rendering (0600).
SECRET_KNOBS = frozenset(knob.name for knob in KNOBS if knob.secret)
SECRET_ENV_NAMES = frozenset(KNOBS_BY_NAME[name].env for name in SECRET_KNOBS)
# The controller's environment variable a secret knob is read from when host data does not set it: it keeps
# the secret off the command line (`--data hf_token=...` shows it to every user of the controller in `ps`).
CONTROLLER_SECRET_PREFIX = "RIGKIT_"


def controller_secret_variable(knob_name: str) -> str:
    return CONTROLLER_SECRET_PREFIX + knob_name.upper()


def redacted(env_name: str, value: object) -> object:
    """``value``, or a placeholder when ``env_name`` carries a secret."""
    return REDACTED if env_name in SECRET_ENV_NAMES else value


def env_name(knob_name: str) -> str:
    """The container env var of a knob (KeyError for an unknown or env-less knob)."""
    env = KNOBS_BY_NAME[knob_name].env
    if env is None:
        raise KeyError(f"{knob_name} has no env var")
    return env


def knob_for_env(env: str) -> str:
    """The knob whose container env var is ``env``; ``env`` itself when no knob feeds it (a profile's fixed env)."""
    return next((knob.name for knob in KNOBS if knob.env == env), env)


def env_text(value: Any) -> str:
    """A knob value as the container sees it: booleans as 1/0, unset as empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)
