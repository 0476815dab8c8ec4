"""Issue 42 on the GPU machine: does each profile's CPU tier pay, and how near the rig's own link does it run?

    .venv/bin/python bench/gpu/pays.py render OUT.json            here (bench/gpu/stage.sh): rigkit renders the cases
    python3 bench/gpu/pays.py run STACKS.json RESULTS SECONDS      device (bench/gpu/go.sh pays): measure, print, JSON

One call: the rig probe (rigkit/files/rig_limits.py: pinned and pageable host-to-device rates at the offload block's
bytes, the disk read with O_DIRECT at 1 and 16 threads at the fs tier's and LMCache's file sizes), then rounds of
stacks on one GPU (a Qwen3-8B shape with vLLM's dummy weights: 36 layers, 8 KV heads x 128, 144 KiB of KV per token;
bench/gpu/run.py's harness starts and stops them as compose would): round 1 is rigkit's rendering of every profile's
CPU tier, round 2 the candidate settings (native offload's block size, LMCache's chunk size). Each stack is measured
at every length (longest first, every stack at a length before the next length) with rigkit's own sweep
(rigkit.validation.pays_sweep) and judged with rigkit.validation.pays against the probe's figures. Progress on
stdout; RESULTS/pays.json rewritten after every point.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(HERE / "stubs"), str(REPO)]

from render import DEVICE_KNOBS, render_case  # noqa: E402

from rigkit.settings.hostdata import settings_for_host  # noqa: E402
from rigkit.settings.sizing import gpu_kv_bytes_per_token  # noqa: E402
from rigkit.validation.pays import CPU_TIER, RigLimits, fmt_rate, pays_report  # noqa: E402

# Qwen3-8B's shape (its config.json, weights by vLLM's --load-format dummy); the tokenizer is the test model's
# (bench/gpu/model: 32,000 ids, all inside this vocabulary)
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 36,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "rope_scaling": None,
}
KV_BYTES_PER_TOKEN = gpu_kv_bytes_per_token(
    "auto", QWEN3_8B["num_hidden_layers"], QWEN3_8B["num_key_value_heads"], QWEN3_8B["head_dim"], 1
)
GPU_BLOCK_TOKENS = 16  # vLLM's default block size on CUDA
# the lmcache-mp profile's chunk as rigkit renders it: one LMCache L2 file per chunk (the probe reads files that size)
LMCACHE_CHUNK_TOKENS = settings_for_host(
    {
        "serving_profile": "lmcache-mp",
        "serving_image": "lmcache/vllm-openai@sha256:" + "0" * 64,
        "allow_incubating": True,
        "model": "pays",
    }
).store_chunk_tokens
LENGTHS = (32000, 16000, 8000)  # the table: 16K and 32K; 8K where the breakeven may sit
CANDIDATE_LENGTHS = (32000,)  # round 2: the length the verdict is taken at
SESSIONS = 3
DIGEST = "@sha256:" + "0" * 64
MODEL_SOURCE = "controller:/srv/models/pays-qwen3-8b-shape@" + "0" * 64
# Three 8B engines on one 80 GB H100 at once: 16.4 GB of weights + a pool of 2,240 blocks (35,840 tokens: one 32K
# session, 5.3 GB) each. The fillers that evict a 32K session from the pool (2 x 32K) and the session fit a 20 GB CPU
# tier below LMCache's 80 % eviction watermark (14.2 GB of 17.2).
PAYS_KNOBS = {
    **DEVICE_KNOBS,
    "model_source": MODEL_SOURCE,
    "served_model_name": "pays",
    "max_model_len": 34816,
    "num_gpu_blocks_override": 2240,
    "gpu_memory_utilization": 0.29,
    "max_num_seqs": 4,
    "l1_size_gb": 20,
    "model_size_gb": 17,
    "model_attention_layers": QWEN3_8B["num_hidden_layers"],
    "model_kv_heads": QWEN3_8B["num_key_value_heads"],
    "model_head_dim": QWEN3_8B["head_dim"],
}
VLLM, LMCACHE = "vllm/vllm-openai" + DIGEST, "lmcache/vllm-openai" + DIGEST
# name -> (round, host data, native offload's block size in tokens (None: rigkit's rendering, the GPU block))
CASES: dict[str, tuple[int, dict, int | None]] = {
    "native-offload": (1, {"serving_profile": "native-offload", "serving_image": VLLM}, None),
    "native-tiered": (1, {"serving_profile": "native-tiered", "serving_image": VLLM}, None),
    "lmcache-mp": (
        1,
        {"serving_profile": "lmcache-mp", "serving_image": LMCACHE, "lmcache_port": 5575, "lmcache_http_port": 8095},
        None,
    ),
    "native-offload-block64": (2, {"serving_profile": "native-offload", "serving_image": VLLM}, 64),
    "native-offload-block256": (2, {"serving_profile": "native-offload", "serving_image": VLLM}, 256),
    # LMCache's own default chunk (rigkit's profile sets 1024 since the 2026-12-06 run, where 1024 was the candidate)
    "lmcache-mp-chunk256": (
        2,
        {
            "serving_profile": "lmcache-mp",
            "serving_image": LMCACHE,
            "lmcache_port": 5585,
            "lmcache_http_port": 8096,
            "chunk_size": 256,
        },
        None,
    ),
}
FIRST_PORT = 8101
OFFLOAD_CONFIG_KEY = '"cpu_bytes_to_use":'
START_STAGGER_S = 15  # vLLM's memory profiling fails when another engine frees memory meanwhile: starts apart
READY_TIMEOUT_S = 300
REQUEST_TIMEOUT_S = 120
# what a round needs at least: the starts, and one length of every stack
ROUND_MIN_S = 150
POINT_S = {32000: 25, 16000: 15, 8000: 12}  # one stack's length (3 sessions with their fillers), measured on no GPU yet


def with_offload_block(script: str, block_tokens: int) -> str:
    """The rendered script with native offload's block size set (kv_connector_extra_config "block_size": vLLM's
    OffloadingSpec reads it, a multiple of the GPU block; rigkit renders none, so the GPU block's 16 holds)."""
    if OFFLOAD_CONFIG_KEY not in script:
        raise ValueError("no OffloadingConnector config in the rendered script")
    return script.replace(OFFLOAD_CONFIG_KEY, f'"block_size":{block_tokens},{OFFLOAD_CONFIG_KEY}', 1)


def render(out: Path) -> None:
    stacks = []
    for port, (name, (round_no, data, block)) in enumerate(CASES.items(), FIRST_PORT):
        info = render_case(name, port, "dummy", host_data=data, device_knobs=PAYS_KNOBS)
        if block:
            info["script"] = with_offload_block(info["script"], block)
        info.update(
            round=round_no,
            offload_block_tokens=block,
            lengths=list(LENGTHS if round_no == 1 else CANDIDATE_LENGTHS),
        )
        stacks.append(info)
    out.write_text(
        json.dumps(
            {
                "weights": "dummy",
                "model_config": QWEN3_8B,
                "kv_bytes_per_token": KV_BYTES_PER_TOKEN,
                "sessions": SESSIONS,
                "stacks": stacks,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"rendered {len(stacks)} stacks -> {out}")


def write_model(directory: Path, config: dict) -> None:
    """config.json of the 8B shape beside the test model's tokenizer files (no weights: --load-format dummy)."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in (HERE / "model").iterdir():
        if path.name != "config.json":
            shutil.copy(path, directory / path.name)
    (directory / "config.json").write_text(json.dumps(config, indent=1) + "\n")


def probe_command(l2_dir: Path, kv_per_token: int) -> list[str]:
    """The rig probe at this shape's sizes: the offload block (16 tokens), 512 blocks a transfer (a 8K-token
    session); O_DIRECT reads of the fs tier's file (one 16-token block) and LMCache's (one 256-token chunk)."""
    block = GPU_BLOCK_TOKENS * kv_per_token
    return [
        sys.executable,
        str(REPO / "rigkit/files/rig_limits.py"),
        "--gpu",
        "--block-bytes",
        str(block),
        "--blocks",
        "512",
        "--l2-dir",
        str(l2_dir),
        "--file-bytes",
        f"{block},{LMCACHE_CHUNK_TOKENS * kv_per_token}",
        "--threads",
        "1,16",
        "--o-direct",
        "yes",
    ]


def summary_lines(name: str, report, limits: RigLimits) -> list[str]:
    lines = []
    for floor in report.floors:
        lines.append(
            f"{name}: {floor.tokens} tokens {floor.tier}: {1000 * floor.tier_s:,.0f} ms (cold "
            f"{1000 * (floor.cold_s or 0):,.0f}, warm-gpu {1000 * floor.warm_gpu_s:,.0f}, floor "
            f"{1000 * (floor.floor_s or 0):,.0f}); rate {fmt_rate(floor.rate_bytes_per_s)} = "
            f"{'?' if floor.share is None else f'{100 * floor.share:.0f} %'} of {fmt_rate(floor.limit_bytes_per_s)}; "
            f"gain {'?' if floor.gain is None else f'{floor.gain:.2f}x'}"
            + (f"; FLAG {floor.flag}" if floor.flag else "")
        )
    lines += [f"{name}: {b.tier}: {b.text}" for b in report.breakevens]
    return lines


def run(stacks_file: Path, results: Path, seconds: float) -> None:
    import run as harness

    from rigkit.metrics import require_prefix_counters
    from rigkit.remote.client import ServingClient
    from rigkit.validation.pays_sweep import measure_point
    from rigkit.validation.procedure import ValidationSettings

    rendered = json.loads(stacks_file.read_text())
    bench = harness.Run(results, seconds)
    kv_per_token = rendered["kv_bytes_per_token"]
    write_model(Path(harness.MODEL_DIR), rendered["model_config"])
    out: dict = {"kv_bytes_per_token": kv_per_token, "stacks": {}, "limits": None}

    def save() -> None:
        (results / "pays.json").write_text(json.dumps(out, indent=1) + "\n")

    probe_dir = harness.KV_ROOT / "probe"
    probe_dir.mkdir(parents=True, exist_ok=True)
    bench.log(f"rig probe: {' '.join(probe_command(probe_dir, kv_per_token)[1:])}")
    done = subprocess.run(probe_command(probe_dir, kv_per_token), capture_output=True, text=True, timeout=240)
    (results / "rig-limits.stderr.txt").write_text(done.stderr)
    try:
        out["limits"] = json.loads(done.stdout)
    except ValueError:
        out["limits"] = {"errors": [f"probe exit {done.returncode}: {done.stderr[-400:]}"]}
    limits = RigLimits.from_probe(out["limits"])
    save()
    bench.log(
        f"rig probe: {[g.name for g in limits.gpus]} PCIe {[(g.pcie_gen, g.pcie_width) for g in limits.gpus]}; "
        f"H2D pinned {fmt_rate(limits.pinned)} (blocks {fmt_rate(limits.pinned_blocks)}), pageable "
        f"{fmt_rate(limits.pageable)}; disk {limits.disk_device} {limits.disk_filesystem}: "
        + ", ".join(f"{r.file_bytes >> 20} MiB x{r.threads} {fmt_rate(r.bytes_per_s)}" for r in limits.disk_reads)
        + (f"; errors {limits.errors}" if limits.errors else "")
    )
    mounts = {tuple(sorted(s["model_mount"].items())) for s in rendered["stacks"] if s.get("model_mount")}
    dry_run = "dryrun" in harness.ENGINE_BIN  # the dry run's fake engine reads no model: nothing mounted here
    mount = harness.mount_model(dict(mounts.pop())) if mounts and not dry_run else harness.MODEL_DIR
    bench.log(f"model: {mount}")
    settings = ValidationSettings.from_data(
        {"validate_sessions": rendered["sessions"], "validate_top_logprobs": 0, "validate_prompt_tokens": 8000}
    )
    for round_no in sorted({s["round"] for s in rendered["stacks"]}):
        if bench.deadline - time.time() < ROUND_MIN_S:
            bench.log(f"round {round_no}: skipped, {bench.deadline - time.time():.0f} s left")
            continue
        infos = [s for s in rendered["stacks"] if s["round"] == round_no]
        stacks = [harness.Stack(info, bench) for info in infos]
        for stack in stacks:
            stack.start()
            time.sleep(START_STAGGER_S)
        ready = {s.name: s.wait_ready(READY_TIMEOUT_S) for s in stacks}
        for stack in stacks:  # a start that died beside the others: once more, alone
            if not ready[stack.name] and bench.deadline - time.time() > ROUND_MIN_S:
                stack.stop(grace=2)
                stack.start()
                ready[stack.name] = stack.wait_ready(READY_TIMEOUT_S)
        bench.log(f"round {round_no}: ready {ready}")
        clients = {
            s.name: ServingClient(
                s.url, model=s.info["served_model_name"], extra_metrics_urls=[s.lm_url] if s.lm_url else []
            )
            for s in stacks
            if ready[s.name]
        }
        pools = {name: require_prefix_counters(client.metrics()) for name, client in clients.items()}
        lengths = sorted({n for s in infos for n in s["lengths"]}, reverse=True)
        for n, tokens in enumerate(lengths):
            for stack in stacks:
                if stack.name not in clients or tokens not in stack.info["lengths"]:
                    continue
                if bench.deadline - time.time() < POINT_S.get(tokens, 25) + 30:
                    bench.log(f"{stack.name}: {tokens} tokens skipped (deadline)")
                    continue
                entry = out["stacks"].setdefault(stack.name, {"points": [], "errors": []})
                entry.update(
                    profile=stack.info["profile"],
                    offload_block_tokens=stack.info["offload_block_tokens"],
                    chunk_size=stack.info["knobs"].get("chunk_size"),
                    l1_gib=stack.info["l1_gib"],
                    disk_tier=bool(stack.info["l2_container_path"]),
                )
                started = time.time()
                try:
                    record = measure_point(
                        clients[stack.name],
                        pools[stack.name],
                        settings,
                        tokens,
                        seed=4200 + 1000 * n,
                        timeout_s=REQUEST_TIMEOUT_S,
                        progress=lambda line, name=stack.name: bench.log(f"{name}: {line}"),
                    )
                    entry["points"].append({**record.__dict__, "seconds": time.time() - started})
                except Exception as exc:  # noqa: BLE001 - recorded, the other stacks go on
                    entry["errors"].append(f"{tokens}: {exc!r}")
                    bench.log(f"{stack.name}: {tokens} tokens ERROR {exc!r}")
                if stack.l2_dir:  # the janitor's work between points: the disk holds one point's writes at most
                    shutil.rmtree(stack.l2_dir, ignore_errors=True)
                    stack.l2_dir.mkdir(parents=True, exist_ok=True)
                report_of(entry, kv_per_token, limits)
                for line in summary_lines(stack.name, entry["report_model"], limits):
                    bench.log(line)
                entry.pop("report_model")
                save()
        stoppers = [threading.Thread(target=s.stop) for s in stacks if s.proc is not None and s.alive()]
        for thread in stoppers:
            thread.start()
        for thread in stoppers:
            thread.join(40)
        bench.log(f"round {round_no}: stopped")
    bench.log("summary:")
    for name, entry in out["stacks"].items():
        report_of(entry, kv_per_token, limits)
        for line in summary_lines(name, entry.pop("report_model"), limits):
            print("  " + line, flush=True)
    save()


def report_of(entry: dict, kv_per_token: int, limits: RigLimits) -> None:
    """The stack's points judged against the probe (rigkit.validation.pays), into entry["report"]."""
    from rigkit.validation.pays_sweep import PointRecord

    points = [PointRecord(p["tokens"], p["ttft_s"], p["labels"], p["fillers_sent"]).point() for p in entry["points"]]
    report = pays_report(
        [p for p in points if p],
        kv_per_token,
        limits,
        "Qwen3-8B shape: 36 x 8 x 128 x 2 x bf16",
        disk_tier=bool(entry.get("disk_tier")),
    )
    entry["report"] = report.model_dump(mode="json")
    entry["report_model"] = report
    entry["cpu_tier_share"] = {
        str(f.tokens): f.share for f in report.floors if f.tier == CPU_TIER and f.share is not None
    }


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "render":
        render(Path(sys.argv[2]))
    elif len(sys.argv) >= 5 and sys.argv[1] == "run":
        run(Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
