"""A registry that hangs during an upgrade, on a real lab rig with the real vLLM CPU stack.

The lab registry is stopped with SIGSTOP (its process stays, its socket keeps accepting: the kernel completes
the TCP handshake, nothing answers), the rig is asked to upgrade to release 2, which it does not hold. The
serving preflight's registry probe (`docker manifest inspect`, rigkit.facts.docker.ManifestProbe) gives up
on the TLS handshake after docker CLI's 10 s (cli/registry/client/endpoint.go; rigkit's own bound is
MANIFEST_PROBE_TIMEOUT_S), so the deploy ends within a minute or two: the rig is refused with one line naming
a hung registry, not the digest, and its old release keeps serving. The registry is resumed (SIGCONT) in a
finally, whatever happened.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rigkit.fleet.outcome import FAILED
from rigkit.fleet.pyinfra_args import rigkit_executable
from rigkit.lab.registry_server import registry_answers, registry_pid
from rigkit.paths import REPO_ROOT
from rigkit.serving.render import CONTAINER_NAME

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

LAB_INVENTORY = REPO_ROOT / "inventory" / "lab.py"
HUNG_DEPLOY_BOUND_S = 300  # two cores, SSH, the survey and the probe's 10 s: far below this


def serving_image_of(rig, rig_exec) -> str:
    return rig_exec(
        rig, f"docker inspect --format '{{{{.Config.Image}}}}' {CONTAINER_NAME}", check=False
    ).stdout.strip()


def test_a_hung_registry_is_named_and_the_old_release_keeps_serving(lab, deployed, run_pyinfra, rig_exec):
    release_1, release_2 = lab.serving_image["releases"]["1"], lab.serving_image["releases"]["2"]
    rig = [r for r in lab.rigs if not r.netns][0]
    if serving_image_of(rig, rig_exec) != release_1:  # another test left it elsewhere
        moved = run_pyinfra(
            ["--limit", rig.name, "--data", f"serving_image={release_1}"], deploy="deploy.py", timeout=1800
        )
        assert moved.returncode == 0, moved.stdout[-4000:] + moved.stderr[-2000:]
    rig_exec(rig, f"docker image rm -f {release_2}", check=False)  # release 2 must come from the registry

    pid = registry_pid()
    assert pid, "the lab registry is not running"
    rigkit = Path(rigkit_executable())
    started = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        result = subprocess.run(
            [str(rigkit), "deploy", str(LAB_INVENTORY), "--limit", rig.name, "--data", f"serving_image={release_2}"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=HUNG_DEPLOY_BOUND_S + 300,
            env={**os.environ, "COLUMNS": "200"},
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr

    assert result.returncode != 0, output[-4000:]
    assert elapsed < HUNG_DEPLOY_BOUND_S, f"the hung registry held the deploy {elapsed:.0f} s"
    assert "Traceback" not in output and "Unexpected error in Python callback" not in output, output[-6000:]
    (refusal,) = [line for line in output.splitlines() if f"[{rig.name}] refused: serving_image=" in line]
    assert "registry 127.0.0.1:5000 hung" in refusal or "registry 127.0.0.1:5000 unreachable" in refusal, refusal
    assert "check the digest" not in refusal
    summary = output.split("--> rigkit fleet summary:", 1)[1]
    assert max(len(line) for line in summary.splitlines()) <= 200  # the table fits the (COLUMNS) terminal
    row = next(line for line in summary.splitlines() if line.startswith(f"{rig.name} "))
    assert FAILED in row.split() and "check the digest" not in summary
    assert f"{rig.name}: serving_image=" in summary and "Fix: " in summary  # the full reason under the table

    assert serving_image_of(rig, rig_exec) == release_1  # the old release kept serving, untouched
    models = rig_exec(rig, f"curl -sf http://127.0.0.1:{rig.serving_port}/v1/models").stdout
    assert '"tiny"' in models
    deadline = time.monotonic() + 30
    while not registry_answers():  # resumed: it answers again for the tests after this one
        assert time.monotonic() < deadline, "the registry did not answer after SIGCONT"
        time.sleep(0.5)
