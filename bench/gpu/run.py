"""Device side of the GPU check: start the stacks bench/gpu/render.py rendered, prove them with rigkit's own code
(validate_tiers, warm_shared.run_pairs, to_card, render_run), record every /metrics scrape and completion.

    python3 bench/gpu/run.py STACKS.json RESULTS_DIR SECONDS [CASE...]   (no CASE: every rendered case)

No Docker on the device: a stack is `bash -c <its rendered script>` in a new session, with the profile's fixed env
and the .env values in its environment (the container's); `vllm` / `lmcache` are the images' console scripts
(bench/gpu/bin). compose down = SIGTERM to the main process, SIGKILL to the rest once it is gone or after 10 s
(docker's stop), then rigkit's stale-segment cleanup (rigkit.serving.commands.shm_cleanup_command) as a rig's restart runs it.
The L2 bind mount (/kv-store in the container) = a host directory per store, substituted for the string /kv-store.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE / "stubs"), str(REPO)]

from rigkit.metrics import as_dict  # noqa: E402
from rigkit.nvidia_smi import POWER_LIMIT_QUERY, enforced_power_limits  # noqa: E402
from rigkit.remote.client import ServingClient  # noqa: E402
from rigkit.validation.card import RigCard  # noqa: E402
from rigkit.validation.card.assemble import to_card  # noqa: E402
from rigkit.validation.card.store import render_run, write_card  # noqa: E402
from rigkit.validation.power import LocalStore  # noqa: E402
from rigkit.validation.procedure import ValidationSettings, validate_tiers  # noqa: E402
from rigkit.validation.warm_shared import run_pairs  # noqa: E402

RUN_ID = os.environ.get("RUN_ID", "gpu-check")
# validation data for every stack, e.g. {"validate_prompt_kind": "code"} (rigkit.settings.defaults VALIDATION_VARIABLES)
VALIDATION_DATA = json.loads(os.environ.get("GPU_CHECK_VALIDATION", "{}"))
MEASURE = threading.Lock()  # one measurement at a time (TTFT), released while a stack restarts
RESTART = threading.Lock()  # one start at a time after the first (vLLM's memory profiling asserts otherwise)
LOG_LOCK = threading.Lock()
T0 = time.time()
MODEL_DIR = os.environ.get("MODEL_DIR", str(HERE / "model"))
# session sizes each stack is validated at, one after the other (each with its own restart and card)
LENGTHS = [int(n) for n in os.environ.get("GPU_CHECK_LENGTHS", "").split(",") if n.strip()]
KV_ROOT = Path(os.environ.get("KV_ROOT", "/tmp/gpu-check-kv"))
# the images' console scripts; the dry run (README) points this at bench/gpu/dryrun/bin
ENGINE_BIN = os.environ.get("GPU_CHECK_BIN", str(HERE / "bin"))


class Run:
    def __init__(self, results: Path, seconds: float):
        self.results = results
        self.deadline = T0 + seconds
        results.mkdir(parents=True, exist_ok=True)

    def log(self, message: str) -> None:
        with LOG_LOCK:
            line = f"[{time.time() - T0:7.1f}s] {message}"
            print(line, flush=True)
            with open(self.results / "run.log", "a") as f:
                f.write(line + "\n")


def offload_segments() -> list[str]:
    """/dev/shm files of the kinds the stacks make: vLLM's CPU tier, LMCache's, Python's multiprocessing."""
    try:
        return sorted(
            f"{p.name} {p.stat().st_size}"
            for p in Path("/dev/shm").iterdir()
            if p.name.startswith(("vllm_offload_", "lmcache", "psm_"))
        )
    except OSError as exc:
        return [f"error {exc}"]


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except Exception:  # noqa: BLE001 - not up yet, whatever the reason
        return False


class Stack:
    def __init__(self, info: dict, run: Run):
        self.info, self.run = info, run
        self.name, self.port = info["case"], info["port"]
        self.url = f"http://127.0.0.1:{self.port}"
        script, env_values = info["script"], dict(info["env"])
        self.l2_dir = None
        if info["l2_container_path"]:
            self.l2_dir = KV_ROOT / info["store"]
            self.l2_dir.mkdir(parents=True, exist_ok=True)
            script = script.replace(info["l2_container_path"], str(self.l2_dir))
            env_values = {k: v.replace(info["l2_container_path"], str(self.l2_dir)) for k, v in env_values.items()}
        if not info.get("model_mount"):  # a rendering that names the model itself (before model_source)
            env_values["RIGKIT_MODEL"] = MODEL_DIR
        # the rendered compose environment (the profile's fixed env and, with a staged model, the offline env); an
        # older rendering carries the fixed env only, and the harness kept the engine offline itself
        container_env = info.get("container_env") or {
            **info["fixed_env"],
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        lmcache = info["lmcache_http_port"] is not None or info["profile"].startswith("lmcache")
        drop = ("PYTHONPATH", "PYTHONHASHSEED", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env.update(
            PATH=f"{ENGINE_BIN}:{os.environ['PATH']}",
            PYTHONPATH="/tmp/site-lm:/tmp/site" if lmcache else "/tmp/site",
            VLLM_USE_FLASHINFER_SAMPLER="0",
            PYTHONUNBUFFERED="1",
            **container_env,
            **env_values,
        )
        info = {**info, "fixed_env": container_env}
        self.script, self.env, self.info = script, env, info
        self.dir = run.results / self.name
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "run-script.sh").write_text(script)
        (self.dir / "run-env.json").write_text(
            json.dumps({**info["fixed_env"], **env_values, "PYTHONPATH": env["PYTHONPATH"]}, indent=1) + "\n"
        )
        self.starts, self.proc, self.events = 0, None, []
        self.lm_url = f"http://127.0.0.1:{info['lmcache_http_port']}/metrics" if info["lmcache_http_port"] else None

    def start(self) -> None:
        self.starts += 1
        log = open(self.dir / f"server-{self.starts}.log", "wb")
        self.proc = subprocess.Popen(
            ["/bin/bash", "-c", self.script],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd="/tmp",
        )
        self.started = time.time()
        self.events.append({"event": "start", "n": self.starts, "t": self.started - T0, "shm": offload_segments()})
        self.run.log(f"{self.name}: start #{self.starts}")

    def wait_ready(self, timeout: float) -> bool:
        end = min(time.time() + timeout, self.run.deadline)
        while time.time() < end:
            if self.proc.poll() is not None:
                self.events.append({"event": "exited", "rc": self.proc.returncode, "t": time.time() - T0})
                self.run.log(f"{self.name}: exited rc={self.proc.returncode} before ready")
                return False
            if http_ok(self.url + "/v1/models"):
                took = time.time() - self.started
                self.events.append({"event": "ready", "n": self.starts, "after_s": took, "shm": offload_segments()})
                self.run.log(f"{self.name}: ready #{self.starts} after {took:.1f} s")
                return True
            time.sleep(1)
        self.run.log(f"{self.name}: not ready in time")
        return False

    def alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def stop(self, grace: float = 10.0) -> None:
        """docker stop, then rigkit's stale-segment cleanup, as a rig's compose down/up runs it."""
        if self.proc is None:
            return
        before = offload_segments()
        try:
            os.kill(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for _ in range(60):
            if not self.alive():
                break
            time.sleep(0.5)
        left = offload_segments()
        cleanup = subprocess.run(["/bin/bash", "-c", self.info["shm_cleanup"]], capture_output=True, text=True)
        after = offload_segments()
        self.events.append(
            {
                "event": "stop",
                "t": time.time() - T0,
                "shm_before": before,
                "shm_left_by_stop": left,
                "cleanup_output": cleanup.stdout + cleanup.stderr,
                "shm_after_cleanup": after,
            }
        )
        self.run.log(
            f"{self.name}: stopped; /dev/shm segments {len(before)} before, {len(left)} left by the stop, "
            f"{len(after)} after rigkit's cleanup ({cleanup.stdout.strip() or 'removed none'})"
        )


def mount_model(mount: dict) -> str:
    """The staged model's bind mount as compose renders it (the model directory at its target, read-only if
    rendered so); a symbolic link where this machine cannot mount (says which)."""
    target = Path(mount["target"])
    if target.is_symlink():
        target.unlink()
    subprocess.run(["umount", str(target)], capture_output=True)
    target.mkdir(parents=True, exist_ok=True)
    steps = [["mount", "--bind", MODEL_DIR, str(target)]]
    if mount.get("read_only"):
        steps.append(["mount", "-o", "remount,bind,ro", str(target)])
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            subprocess.run(["umount", str(target)], capture_output=True)
            target.rmdir()
            target.symlink_to(MODEL_DIR)
            return f"{target} -> {MODEL_DIR} as a symbolic link ({' '.join(step[:2])}: {done.stderr.strip()})"
    read_only = subprocess.run(["touch", str(target / ".rw-probe")], capture_output=True).returncode != 0
    return f"{MODEL_DIR} bind-mounted at {target}, {'read-only' if read_only else 'WRITABLE'}"


def corrupt_store(directory: Path) -> dict:
    """Overwrite the middle half of every stored file with random bytes (a torn or rotten write that still reads)."""
    rng, files, touched = random.Random(20261203), 0, 0
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        size = path.stat().st_size
        if size < 16:
            continue
        with open(path, "r+b") as f:
            f.seek(size // 4)
            f.write(bytes(rng.getrandbits(8) for _ in range(size // 2)) if size < 1 << 16 else os.urandom(size // 2))
        files, touched = files + 1, touched + size // 2
    return {"files": files, "bytes_overwritten": touched}


class RecordingClient(ServingClient):
    """rigkit's client, with every /metrics scrape and completion recorded (the fixtures replay them)."""

    def __init__(self, *args, record: list, **kwargs):
        super().__init__(*args, **kwargs)
        self.record = record

    def metrics_text(self) -> str:
        text = super().metrics_text()
        self.record.append({"kind": "scrape", "url": self.base_url, "t": time.time() - T0, "text": text})
        return text

    def stream_completion(self, prompt, max_tokens, *args, **kwargs):
        result = super().stream_completion(prompt, max_tokens, *args, **kwargs)
        self.record.append(
            {
                "kind": "request",
                "url": self.base_url,
                "t": time.time() - T0,
                "prompt_sha": hashlib.sha256(prompt.encode()).hexdigest()[:16],
                "prompt_chars": len(prompt),
                "max_tokens": max_tokens,
                "result": result.as_dict(),
            }
        )
        return result


def dump_record(path: Path, record: list) -> None:
    with gzip.open(path, "wt") as f:
        for item in record:
            f.write(json.dumps(item) + "\n")


def tier_dump(run) -> dict:
    out = run.result().model_dump(mode="json")
    out["windows"] = [{k: v for k, v in as_dict(m.window).items() if k != "ttft_buckets"} for m in run.measured]
    return out


def store_bytes(path: Path):
    def measure() -> int:
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())

    return measure


def machine_facts() -> dict:
    """What validate.py's rig_facts records of a rig, read on the device: GPUs, driver, CUDA, the enforced power
    limits (no rig data here: none declared), RAM."""
    facts: dict = {}
    try:
        rows = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            .stdout.strip()
            .splitlines()
        )
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
        limits = subprocess.run(shlex.split(POWER_LIMIT_QUERY), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return facts
    cells = [[cell.strip() for cell in row.split(",")] for row in rows if row.strip()]
    if cells:
        facts.update(gpu_models=[row[0] for row in cells], driver_version=cells[0][-1])
    if "CUDA Version:" in header:
        facts["cuda_version"] = header.split("CUDA Version:")[1].split()[0]
    facts["power_limits_enforced_w"] = enforced_power_limits(limits.stdout) if limits.returncode == 0 else []
    meminfo = Path("/proc/meminfo").read_text().split()
    facts["host_ram_bytes"] = int(meminfo[meminfo.index("MemTotal:") + 1]) * 1024
    return facts


MACHINE: dict = {}


def model_layers() -> int | None:
    try:
        return json.loads((Path(MODEL_DIR) / "config.json").read_text())["num_hidden_layers"]
    except (OSError, ValueError, KeyError):
        return None


def validate_stack(stack: Stack, summary: dict) -> None:
    """The stack validated once per session size of GPU_CHECK_LENGTHS (once at the validation data's without)."""
    for length in LENGTHS or [None]:
        validate_stack_at(stack, summary, length)


def validate_stack_at(stack: Stack, summary: dict, length: int | None) -> None:
    run, record, info = stack.run, [], stack.info
    name = stack.name if length is None else f"{stack.name}-{length}"
    out: dict = {"case": name, "profile": info["profile"], "not_applicable": info["not_applicable"]}

    def restart() -> None:
        run.log(f"{stack.name}: restart (compose down/up)")
        MEASURE.release()
        try:
            with RESTART:
                stack.stop()
                if info["corrupt_store_at_restart"] and stack.l2_dir:
                    out["corrupted"] = corrupt_store(stack.l2_dir)
                    run.log(f"{stack.name}: corrupted its store while down: {out['corrupted']}")
                stack.start()
                if not stack.wait_ready(300):
                    raise RuntimeError(f"{stack.name} did not come back after the restart")
        finally:
            MEASURE.acquire()

    with MEASURE:
        try:
            if time.time() > run.deadline - 60:
                raise RuntimeError("skipped: too close to the deadline")
            client = RecordingClient(
                stack.url,
                model=info["served_model_name"],
                extra_metrics_urls=[stack.lm_url] if stack.lm_url else [],
                record=record,
            )
            data = {**VALIDATION_DATA, **({"validate_prompt_tokens": length} if length else {})}
            settings = ValidationSettings.from_data(data)
            tiers = {f"L1 RAM {info['l1_gib']} GiB": info["l1_gib"] * 2**30} if info["l1_gib"] else {}
            if stack.l2_dir:
                tiers[f"L2 disk {info['l2_budget_gb']:g} GB"] = int(info["l2_budget_gb"] * 10**9)
            run.log(f"{name}: validate_tiers")
            validation = validate_tiers(
                client,
                restart,
                settings,
                connector_configured=info["connector"],
                store_bytes=store_bytes(stack.l2_dir) if stack.l2_dir else None,
                capacity_tiers=tiers,
                not_applicable=info["not_applicable"],
                store_chunk_tokens=info["store_chunk_tokens"],
                bit_exact_tiers=info.get("bit_exact_tiers", []),
                store=LocalStore(stack.l2_dir) if stack.l2_dir else None,
                model_layers=model_layers(),
            )
            out["tiers"] = [tier_dump(t) for t in validation.tiers]
            out["numerics"] = validation.numerics.model_dump(mode="json") if validation.numerics else None
            out["power"] = validation.power.model_dump(mode="json") if validation.power else None
            if validation.power:
                for row in validation.power.rows:
                    run.log(
                        f"{name}: power {row.damage:12s} files {row.files} bytes {row.bytes_damaged} "
                        f"{row.label} {row.verdict} shift {row.shift_nats} caught {row.caught}"
                    )
            out["failures"] = validation.failures
            card = to_card(
                name,
                RUN_ID,
                validation,
                settings,
                info["connector"],
                repro={
                    "profile": info["profile"],
                    "knobs": info["knobs"],
                    "l2_integrity": info.get("l2_integrity"),
                    **MACHINE,
                },
            )
            out["card_passed"] = card.passed
            write_card(run.results / "cards", card)
            for tier in out["tiers"]:
                run.log(
                    f"{name}: {tier['expected']:16s} labels {tier['labels']} passed {tier['passed']} "
                    f"greedy {[g.get('verdict') for g in tier.get('greedy', [])]}"
                )
            run.log(f"{name}: card {'PASS' if card.passed else 'FAIL'}")
        except Exception as exc:  # noqa: BLE001 - recorded, the other stacks go on
            out["error"] = "".join(traceback.format_exception(exc))
            run.log(f"{name}: ERROR {exc!r}")
        finally:
            out["events"] = stack.events
            where = stack.dir if length is None else stack.dir.parent / name
            where.mkdir(parents=True, exist_ok=True)
            dump_record(where / "record.jsonl.gz", record)
            (where / "result.json").write_text(json.dumps(out, indent=1) + "\n")
            summary[name] = out


def validate_share(a: Stack, b: Stack, summary: dict) -> None:
    run, record = a.run, []
    out: dict = {"case": "kv-share", "stacks": [a.name, b.name]}
    with MEASURE:
        try:
            clients = {s.name: RecordingClient(s.url, model=s.info["served_model_name"], record=record) for s in (a, b)}
            settings = ValidationSettings.from_data(VALIDATION_DATA)
            run.log("kv-share: run_pairs")
            pairs = run_pairs(clients, {a.name: settings, b.name: settings}, [[a.name, b.name]])
            out["pairs"] = [p.model_dump(mode="json") for p in pairs]
            out["passed"] = all(p.passed for p in pairs)
            for name in (a.name, b.name):  # each engine's card carries the pairs it was asked in
                write_card(
                    run.results / "cards",
                    RigCard(
                        rig=name,
                        run_id=RUN_ID,
                        repro={"profile": a.info["profile"]},
                        shared=[p for p in pairs if p.target == name],
                    ),
                )
            for p in pairs:
                run.log(
                    f"kv-share: {p.source} -> {p.target}: prefill {p.prefill.labels} asked {p.asked.labels} "
                    f"passed {p.passed} greedy same {[g.same for g in p.asked.greedy]}"
                )
        except Exception as exc:  # noqa: BLE001
            out["error"] = "".join(traceback.format_exception(exc))
            run.log(f"kv-share: ERROR {exc!r}")
        finally:
            out["events"] = {a.name: a.events, b.name: b.events}
            (run.results / "kv-share").mkdir(exist_ok=True)
            dump_record(run.results / "kv-share" / "record.jsonl.gz", record)
            (run.results / "kv-share" / "result.json").write_text(json.dumps(out, indent=1) + "\n")
            summary["kv-share"] = out


def main() -> None:
    stacks_file, results, seconds = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
    run = Run(results, seconds)
    MACHINE.update(machine_facts())
    rendered = json.loads(stacks_file.read_text())
    wanted = sys.argv[4:] or [s["case"] for s in rendered["stacks"]]
    stacks = {s["case"]: Stack(s, run) for s in rendered["stacks"] if s["case"] in wanted}
    mounts = {tuple(sorted(s["model_mount"].items())) for s in rendered["stacks"] if s.get("model_mount")}
    model_mount = mount_model(dict(mounts.pop())) if mounts else f"RIGKIT_MODEL={MODEL_DIR}"
    run.log(
        f"cases {list(stacks)}, weights {rendered['weights']}, model {MODEL_DIR} ({model_mount}); "
        f"/dev/shm before: {offload_segments()}"
    )
    for stack in stacks.values():
        stack.start()
        time.sleep(3)
    ready = {name: stack.wait_ready(420) for name, stack in stacks.items()}
    for stack in stacks.values():  # a start that died beside the others: once more, alone
        if not ready[stack.name] and time.time() < run.deadline - 150:
            with RESTART:
                stack.stop(grace=2)
                stack.start()
                ready[stack.name] = stack.wait_ready(240)
    run.log(f"ready: {ready}")
    summary: dict = {
        "ready": ready,
        "weights": rendered["weights"],
        "validation": VALIDATION_DATA,
        "model_mount": model_mount,
    }
    threads = [
        threading.Thread(target=validate_stack, args=(s, summary), daemon=True)
        for name, s in stacks.items()
        if not name.startswith("kv-share") and ready[name]
    ]
    if {"kv-share-a", "kv-share-b"} <= set(stacks) and ready["kv-share-a"] and ready["kv-share-b"]:
        threads.append(
            threading.Thread(
                target=validate_share, args=(stacks["kv-share-a"], stacks["kv-share-b"], summary), daemon=True
            )
        )
    for thread in threads:
        thread.start()
        time.sleep(0.2)
    for thread in threads:
        thread.join(max(1.0, run.deadline - time.time()))
    if any(t.is_alive() for t in threads):
        run.log("deadline: validations still running")
    for stack in stacks.values():
        if stack.l2_dir:
            files = [p for p in stack.l2_dir.rglob("*") if p.is_file()]
            (stack.dir / "l2-files.txt").write_text(
                f"{len(files)} files, {sum(p.stat().st_size for p in files)} bytes\n"
            )
    stoppers = [threading.Thread(target=s.stop) for s in stacks.values() if s.proc is not None and s.alive()]
    for thread in stoppers:
        thread.start()
    for thread in stoppers:
        thread.join(40)
    run.log(f"/dev/shm after every stop and rigkit's cleanup: {offload_segments()}")
    try:
        render_run(results / "cards")
    except Exception as exc:  # noqa: BLE001
        run.log(f"render_run: {exc!r}")
    (results / "summary.json").write_text(
        json.dumps(
            {
                k: v
                if k in ("ready", "weights", "validation", "model_mount")
                else {
                    "error": (v.get("error") or "")[-400:] or None,
                    "card_passed": v.get("card_passed", v.get("passed")),
                }
                for k, v in summary.items()
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
