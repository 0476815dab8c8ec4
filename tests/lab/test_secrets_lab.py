"""A planted hub token (issue 10) goes nowhere on a lab rig: the lab serves a staged model (group_data/lab.py's
model_source), and a staged model's engine loads it offline from its read-only mount, so hf_token is for staging
only (issue 24): it is rendered into neither .env, nor the stored verified rendering, nor the container.

A deploy that takes hf_token from the controller's environment (RIGKIT_HF_TOKEN, off the command line),
a `--dry --diff` with another token, and a rollback: none of their outputs shows a token, and on the rig
no file holds one (Docker's own state, /var/lib/docker, left out: the container's environment is asked directly).
Where a token must reach the container (a hub model loaded by the engine itself, not staged) the renderer puts it in
.env only, 0600 (tests/serving/test_render.py): the lab's image holds no model, so the lab cannot serve that case.
"""

from __future__ import annotations

import os
import secrets
import subprocess

import pytest
from test_serving_lab import assert_ok, ledger

from rigkit.fleet.pyinfra_args import pyinfra_executable
from rigkit.paths import REPO_ROOT, RIG_RELEASES_DIR, RIG_STACK_DIR
from rigkit.serving.render import CONTAINER_NAME

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

RELEASE_TIMEOUT_S = 1800
LAB_INVENTORY = REPO_ROOT / "inventory" / "lab.py"
NOT_SEARCHED = ("/proc", "/sys", "/dev", "/run", "/var/lib/docker")


def pyinfra(rig, *flags: str, deploy: str = "deploy.py", token: str | None = None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "RIGKIT_HF_TOKEN"}
    if token is not None:
        env["RIGKIT_HF_TOKEN"] = token
    return subprocess.run(
        [pyinfra_executable(), *flags, "--limit", rig.name, str(LAB_INVENTORY), deploy],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RELEASE_TIMEOUT_S,
    )


def files_holding(rig, rig_exec, text: str) -> dict[str, str]:
    """Every file on the rig (Docker's own state left out) that holds ``text``, with its mode."""
    prune = " -o ".join(f"-path {path}" for path in NOT_SEARCHED)
    found = rig_exec(
        rig,
        f"find / \\( {prune} \\) -prune -o -type f -print0 2>/dev/null | xargs -0 grep -lsF {text} || true",
        timeout=300,
    ).stdout.split()
    return {path: rig_exec(rig, f"stat -c %a {path}").stdout.strip() for path in found}


def test_a_planted_token_never_reaches_a_rig_that_serves_a_staged_model(lab, deployed, rig_exec):
    rig = lab.rigs[0]
    token, other = (f"hf_planted_{secrets.token_hex(8)}" for _ in range(2))
    try:
        deploy = pyinfra(rig, "-y", token=token)
        assert_ok(deploy)
        verified = ledger(rig, rig_exec)[-1]
        assert verified["smoke"] == "pass" and verified["model"], verified  # a staged model serves
        in_container = rig_exec(rig, f"docker exec {CONTAINER_NAME} printenv HF_TOKEN", check=False)
        assert in_container.returncode == 1 and in_container.stdout == "", "the container holds a hub token"

        dry = pyinfra(rig, "--dry", "--diff", token=other)
        assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]

        rollback = pyinfra(rig, "-y", deploy="rollback.py")
        assert_ok(rollback)
        for name, result in (("deploy", deploy), ("dry run", dry), ("rollback", rollback)):
            output = result.stdout + result.stderr
            assert token not in output and other not in output, f"{name} printed a token"

        assert files_holding(rig, rig_exec, token) == {}, "a file on the rig holds the token"
        assert files_holding(rig, rig_exec, other) == {}, "the dry run wrote its token somewhere"
        for env_file in (f"{RIG_STACK_DIR}/.env", f"{RIG_RELEASES_DIR}/{verified['rendering']}/.env"):
            assert "HF_TOKEN" not in rig_exec(rig, f"cat {env_file}").stdout, env_file
    finally:
        assert_ok(pyinfra(rig, "-y"))  # back to the session's release
