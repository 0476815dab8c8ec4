"""A planted token (issue 10) goes only where it must: the rig's .env and the stored verified rendering
(both 0600), and the serving container's own environment, which needs it.

A deploy that takes hf_token from the controller's environment (RIGKIT_HF_TOKEN, off the command line),
a `--dry --diff` with another token, and a rollback: none of their outputs shows a token, and on the rig
no file outside those two places holds one. Docker's own state (/var/lib/docker: the container's config
and layers) is left out: the container's environment is where the token has to be.
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


def test_a_planted_token_reaches_only_the_env_files_and_the_container(lab, deployed, rig_exec):
    rig = lab.rigs[0]
    token, other = (f"hf_planted_{secrets.token_hex(8)}" for _ in range(2))
    try:
        deploy = pyinfra(rig, "-y", token=token)
        assert_ok(deploy)
        verified = ledger(rig, rig_exec)[-1]
        assert verified["smoke"] == "pass", verified
        assert rig_exec(rig, f"docker exec {CONTAINER_NAME} printenv HF_TOKEN").stdout.strip() == token

        dry = pyinfra(rig, "--dry", "--diff", token=other)
        assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
        assert ".env (it holds a secret" in dry.stdout + dry.stderr  # the change is shown, its lines are not

        rollback = pyinfra(rig, "-y", deploy="rollback.py")
        assert_ok(rollback)
        for name, result in (("deploy", deploy), ("dry run", dry), ("rollback", rollback)):
            output = result.stdout + result.stderr
            assert token not in output and other not in output, f"{name} printed a token"

        holding = files_holding(rig, rig_exec, token)
        stored = f"{RIG_RELEASES_DIR}/{verified['rendering']}/.env"
        assert stored in holding, holding  # the verified rendering, kept for rollbacks
        assert all(path in (f"{RIG_STACK_DIR}/.env", stored) for path in holding), holding
        assert set(holding.values()) == {"600"}, holding
        assert not files_holding(rig, rig_exec, other), "the dry run wrote its token somewhere"
    finally:
        assert_ok(pyinfra(rig, "-y"))  # back to the session's release, no token
