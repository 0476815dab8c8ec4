"""A fresh rig in one command (issue 43): a rig whose model store is the default one, on its L2 NVMe, with that disk
blank (no filesystem, not mounted, not in fstab) as a new rig has it. `rigkit deploy` used to refuse to stage
("nothing is mounted at ... yet ... deploy the rig once without model_source"): two deploys and an edit. One
`rigkit deploy` now runs the roles up to l2_disk there first, stages the pinned model onto the mounted disk and
releases: the rig serves its model from the NVMe. The rig is deployed back to the lab's own store afterwards.
"""

from __future__ import annotations

import subprocess

import pytest
from test_roles_lab import MOUNT_POINT, blank_l2_disk, mount_of

from rigkit.fleet.pyinfra_args import rigkit_executable
from rigkit.paths import REPO_ROOT
from rigkit.serving.ledger import LEDGER_PATH, Ledger
from rigkit.serving.render import CONTAINER_NAME

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

FRESH_RIG = "rig2"
DEFAULT_STORE = f"{MOUNT_POINT}/models"  # model_store_path's default: <l2_mount_point>/models
DEPLOY_TIMEOUT_S = 1800


def test_one_rigkit_deploy_takes_a_rig_with_a_blank_store_disk_to_serving_its_pinned_model(
    lab, deployed, rig_exec, run_pyinfra
):
    rig = lab.rig(FRESH_RIG)
    if rig is None or rig.netns:
        pytest.skip(f"needs {FRESH_RIG} on host networking")
    blank_l2_disk(rig, rig_exec)
    try:
        result = subprocess.run(
            [
                rigkit_executable(),
                "deploy",
                str(REPO_ROOT / "inventory" / "lab.py"),
                f"--limit={FRESH_RIG}",
                "--data",
                f"model_store_path={DEFAULT_STORE}",
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=DEPLOY_TIMEOUT_S,
        )
        output = result.stdout + result.stderr
        print("\n" + "\n".join(line for line in output.splitlines() if line.startswith("-->")))
        assert result.returncode == 0, output[-6000:]
        assert "the model store is on the L2 disk, not mounted yet (a fresh rig)" in output
        assert mount_of(rig, rig_exec) is not None, f"nothing mounted at {MOUNT_POINT}"
        mounts = rig_exec(rig, f"docker inspect -f '{{{{json .Mounts}}}}' {CONTAINER_NAME}").stdout
        assert f'"Source":"{DEFAULT_STORE}/' in mounts.replace(" ", ""), mounts  # the model is served from the NVMe
        assert Ledger.from_json(rig_exec(rig, f"cat {LEDGER_PATH}").stdout).current.smoke == "pass"
    finally:  # the lab's shape: the rig on the lab's own store (still staged there), as `deployed` left it
        restored = run_pyinfra(["--limit", FRESH_RIG], deploy="deploy.py", timeout=DEPLOY_TIMEOUT_S)
        assert restored.returncode == 0, restored.stdout[-4000:]
