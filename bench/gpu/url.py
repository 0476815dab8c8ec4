"""Issue 41 on the device: `rigkit validate --url` against GPU-check stacks it knows by URL alone.

    python3 bench/gpu/url.py STACKS.json RESULTS_DIR SECONDS CASE...

Each CASE of the rendered stacks (bench/gpu/render.py) is started as run.py starts it; then the rigkit command a user
types runs in a subprocess, given nothing but the stack's URL, its /metrics (and LMCache's), the profile, and a
--restart-command: a shell line that asks this process to compose-down/up the stack (run.py's `Stack.stop` and
`start`) and returns once it serves again, as `kubectl rollout restart && kubectl rollout status` would. A case whose
store run.py corrupts at the restart (native-tiered-corrupt) is corrupted the same way here: its card must FAIL.
Each command's output, exit status and card land in RESULTS_DIR/<case>/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import REPO, Run, Stack, corrupt_store, mount_model, offload_segments  # noqa: E402

# the knobs behind a case's tiers that its profile alone does not say (render.CASES); rigkit validate --data takes them
TIER_KNOBS = ("l2_enabled",)
VALIDATION_DATA = json.loads(os.environ.get("GPU_CHECK_VALIDATION", "{}"))


class RestartServer:
    """Restarts a stack when its restart command asks: the command touches REQUEST and waits for DONE."""

    def __init__(self, stack: Stack, directory: Path):
        self.stack, self.request, self.done = stack, directory / "restart.request", directory / "restart.done"
        self.corrupted: list[dict] = []
        threading.Thread(target=self.serve, daemon=True).start()

    @property
    def command(self) -> str:
        return (
            f"rm -f {self.done} && touch {self.request} && "
            f"for i in $(seq 600); do [ -f {self.done} ] && exit $(cat {self.done}); sleep 1; done; exit 9"
        )

    def serve(self) -> None:
        while True:
            if self.request.exists():
                self.request.unlink()
                stack = self.stack
                stack.stop()
                if stack.info["corrupt_store_at_restart"] and stack.l2_dir:
                    self.corrupted.append(corrupt_store(stack.l2_dir))
                    stack.run.log(f"{stack.name}: corrupted its store while down: {self.corrupted[-1]}")
                stack.start()
                self.done.write_text("0" if stack.wait_ready(300) else "1")
            time.sleep(0.5)


def validate_by_url(stack: Stack, run: Run) -> dict:
    info, directory = stack.info, stack.dir
    restarts = RestartServer(stack, directory)
    knobs = {key: info["knobs"][key] for key in TIER_KNOBS if info["knobs"].get(key)}
    command = [
        sys.executable,
        "-m",
        "rigkit.cli",
        "validate",
        "--url",
        stack.url,
        "--profile",
        info["profile"],
        "--name",
        stack.name,
        "--restart-command",
        restarts.command,
        "--run-dir",
        str(directory / "cards"),
    ]
    if stack.lm_url:
        command += ["--lmcache-metrics-url", stack.lm_url]
    for key, value in {**knobs, **VALIDATION_DATA}.items():
        command += ["--data", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"]
    (directory / "command.json").write_text(json.dumps(command, indent=1) + "\n")
    run.log(f"{stack.name}: {' '.join(command[3:])}")
    started = time.time()
    env = {**os.environ, "PYTHONPATH": f"{HERE / 'stubs'}:{REPO}:{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=run.deadline - started)
    (directory / "validate.out").write_text(done.stdout)
    (directory / "validate.err").write_text(done.stderr)
    took = time.time() - started
    run.log(f"{stack.name}: rigkit validate exited {done.returncode} after {took:.0f} s\n{done.stdout}{done.stderr}")
    return {"exit": done.returncode, "seconds": round(took, 1), "corrupted": restarts.corrupted, "starts": stack.starts}


def main() -> None:
    stacks_file, results, seconds = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
    run = Run(results, seconds)
    rendered = json.loads(stacks_file.read_text())
    stacks = {s["case"]: Stack(s, run) for s in rendered["stacks"] if s["case"] in sys.argv[4:]}
    mounts = {tuple(sorted(s["model_mount"].items())) for s in rendered["stacks"] if s.get("model_mount")}
    run.log(f"cases {list(stacks)}; model {mount_model(dict(mounts.pop())) if mounts else 'by path'}")
    for stack in stacks.values():
        stack.start()
        time.sleep(3)
    ready = {name: stack.wait_ready(420) for name, stack in stacks.items()}
    run.log(f"ready: {ready}")
    summary = {}
    for name, stack in stacks.items():  # one at a time: each command's TTFT on a quiet GPU
        if ready[name]:
            try:
                summary[name] = validate_by_url(stack, run)
            except subprocess.TimeoutExpired:
                summary[name] = {"exit": None, "error": "out of time"}
        (results / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for stack in stacks.values():
        stack.stop(grace=5)
    run.log(f"done: {summary}; /dev/shm after: {offload_segments()}")


if __name__ == "__main__":
    main()
