"""Render every GPU profile with rigkit's own code, as the GPU check runs them (bench/gpu/README.md).

    .venv/bin/python bench/gpu/render.py OUT.json [--weights dummy|real]

Each case is a single-H200 rig's host data (rigkit.settings.hostdata.rig_settings), sized so nine engines share one GPU:
the compose command's script (rigkit.serving.render.entrypoint_script: what `bash -c` runs in the container), the .env
values (render.env_values), the profile's fixed env, its ports, the tiers it cannot have
(Settings.tiers_not_applicable), the chunks its connector stores whole, and rigkit's own stale-segment cleanup
(rigkit.serving.commands.shm_cleanup_command) that the check runs at every stop, as `compose down` does on a rig.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from rigkit.serving.commands import shm_cleanup_command  # noqa: E402
from rigkit.serving.render import (  # noqa: E402
    L2_CONTAINER_PATH,
    SERVICE_NAME,
    compose_document,
    entrypoint_script,
    env_values,
    l2_integrity,
)
from rigkit.settings.hostdata import rig_settings  # noqa: E402
from rigkit.settings.model_source import MODEL_CONTAINER_PATH  # noqa: E402

DIGEST = "@sha256:" + "0" * 64  # never pulled: the check runs the carried wheels, not an image
# The model as a rig gets it: a pinned model_source, staged on the rig and bind-mounted read-only at
# MODEL_CONTAINER_PATH, the container offline (HF_HUB_OFFLINE). The test model is trained on the device, so its
# manifest hash is not known here: a placeholder pin (nothing is staged; go.sh mounts the trained directory there).
MODEL_SOURCE = "controller:/srv/models/gpu-check@" + "0" * 64
# What makes nine engines fit one H200 and evict with a few fillers (README: "Changes against the rendering")
DEVICE_KNOBS = {
    "model_source": MODEL_SOURCE,
    "served_model_name": "tiny",
    "max_model_len": 8192,
    "num_gpu_blocks_override": 1024,
    "gpu_memory_utilization": 0.08,
    "max_num_seqs": 16,
    "l1_size_gb": 1,
    "model_size_gb": 1,
    "mem_headroom_gb": 8,
    "allow_incubating": True,
    "bind_address": "127.0.0.1",
}
EXTRA_ARGS = ["--enforce-eager", "--enable-prompt-tokens-details"]
KV_SHARE = {"kv_share": True, "kv_share_fstype": "none", "kv_share_source": "/srv/rigkit-kv"}

# case -> (host data, the case whose store directory it shares, corrupt its store at the restart)
CASES: dict[str, dict] = {
    "native-offload": {"serving_profile": "native-offload", "serving_image": "vllm/vllm-openai" + DIGEST},
    "prefix-only": {"serving_profile": "prefix-only", "serving_image": "vllm/vllm-openai" + DIGEST},
    "native-tiered": {"serving_profile": "native-tiered", "serving_image": "vllm/vllm-openai" + DIGEST},
    "native-tiered-baseline": {
        "serving_profile": "native-tiered-baseline",
        "serving_image": "vllm/vllm-openai" + DIGEST,
    },
    "lmcache-mp-l2": {
        "serving_profile": "lmcache-mp",
        "serving_image": "lmcache/vllm-openai" + DIGEST,
        "l2_enabled": True,
        "lmcache_port": 5555,
        "lmcache_http_port": 8080,
    },
    "lmcache-mp-l1": {
        "serving_profile": "lmcache-mp",
        "serving_image": "lmcache/vllm-openai" + DIGEST,
        "lmcache_port": 5565,
        "lmcache_http_port": 8090,
    },
    "lmcache-mp-baseline": {"serving_profile": "lmcache-mp-baseline", "serving_image": "lmcache/vllm-openai" + DIGEST},
    "kv-share-a": {
        "serving_profile": "native-tiered",
        "serving_image": "vllm/vllm-openai" + DIGEST,
        **KV_SHARE,
        "kv_share_janitor": True,
    },
    "kv-share-b": {"serving_profile": "native-tiered", "serving_image": "vllm/vllm-openai" + DIGEST, **KV_SHARE},
    # native-tiered whose fs tier is corrupted (bytes flipped in every stored file) while the stack is down:
    # the warm-persistent step must not pass
    "native-tiered-corrupt": {"serving_profile": "native-tiered", "serving_image": "vllm/vllm-openai" + DIGEST},
}
SHARED_STORE = {"kv-share-a": "kv-share", "kv-share-b": "kv-share"}
CORRUPTED = {"native-tiered-corrupt"}
FIRST_PORT = 8001


def render_case(
    case: str, port: int, weights: str, host_data: dict | None = None, device_knobs: dict = DEVICE_KNOBS
) -> dict:
    """One case as the device runs it; host_data / device_knobs: another harness's case (bench/gpu/pays.py)."""
    extra = EXTRA_ARGS + (["--load-format=dummy"] if weights == "dummy" else [])
    data = {**(CASES[case] if host_data is None else host_data), **device_knobs, "serving_port": port}
    data["extra_engine_args"] = extra
    stack = rig_settings(data).stack
    service = compose_document(stack)["services"][SERVICE_NAME]
    model_mount = [v for v in service.get("volumes", []) if v["target"] == MODEL_CONTAINER_PATH]
    return {
        "case": case,
        "profile": stack.profile.name,
        "port": port,
        "served_model_name": stack.knobs["served_model_name"],
        "script": entrypoint_script(stack),
        "env": env_values(stack),
        "fixed_env": dict(stack.profile.fixed_env),
        # the compose service's own environment lines besides .env's (the profile's fixed env, the offline env of a
        # staged model): what the container gets whatever the harness's environment says
        "container_env": dict(
            line.split("=", 1)
            for line in service["environment"]
            if not line.endswith("=${" + line.split("=")[0] + ":-}")
        ),
        "model_mount": model_mount[0] if model_mount else None,
        "connector": stack.profile.connector is not None,
        "l2_container_path": L2_CONTAINER_PATH if stack.l2_active else None,
        "store": SHARED_STORE.get(case, case),
        "corrupt_store_at_restart": case in CORRUPTED,
        "lmcache_http_port": stack.listen_ports.get("lmcache_http_port"),
        "l1_gib": stack.l1_gib,
        "l2_budget_gb": stack.knobs["l2_budget_gb"] if stack.l2_active else None,
        "not_applicable": stack.tiers_not_applicable,
        "bit_exact_tiers": stack.bit_exact_tiers,
        "store_chunk_tokens": stack.store_chunk_tokens,
        "l1_in_shm": bool(stack.profile.connector and stack.profile.connector.l1_in_shm),
        "shm_cleanup": shm_cleanup_command(),
        "l2_integrity": l2_integrity(stack),
        "knobs": {k: v for k, v in stack.knobs.items() if k != "hf_token"},
    }


def render_all(weights: str) -> list[dict]:
    return [render_case(case, FIRST_PORT + i, weights) for i, case in enumerate(CASES)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--weights",
        choices=["dummy", "real"],
        default="real",
        help="dummy: vLLM's --load-format dummy (every prompt gives the same tokens: the greedy "
        "check is vacuous); real: the model directory's safetensors",
    )
    args = parser.parse_args()
    stacks = render_all(args.weights)
    args.out.write_text(json.dumps({"weights": args.weights, "stacks": stacks}, indent=1) + "\n")
    print(f"rendered {len(stacks)} stacks -> {args.out}")


if __name__ == "__main__":
    main()
