"""A rollback restores exactly what was verified (issue 4), on a real lab rig with the real vLLM CPU stack.

Release 1 is deployed with served_model_name A, release 2 with B; rollback.py, run while today's data
says B, brings back release 1 WITH A: the rendering stored on the rig when release 1 was verified,
not release 1 re-rendered with today's data. A second rollback.py run changes nothing. The rig ends
re-converged to the standard deploy (release 1, lab group data), as the `deployed` fixture left it.
"""

from __future__ import annotations

import pytest

from rigkit.ledger import rendering_dir
from rigkit.render import CONTAINER_NAME
from test_serving_lab import assert_ok, grand_total, ledger, models, serving_release

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

KNOB_A, KNOB_B = "tiny-verified-a", "tiny-today-b"
RELEASE_TIMEOUT_S = 1800


def container_env(rig, rig_exec) -> dict[str, str]:
    out = rig_exec(rig, f"docker exec {CONTAINER_NAME} env").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_rollback_restores_the_verified_rendering_not_todays(lab, deployed, run_pyinfra, rig_exec, lab_host_data):
    rig = [r for r in lab.rigs if not r.netns][-1]  # a host-network rig (rig2 in the standard lab)
    release_1, release_2 = lab.serving_image["releases"]["1"], lab.serving_image["releases"]["2"]
    limit = ["--limit", rig.name]
    try:
        assert_ok(run_pyinfra(args=[*limit, "--data", f"served_model_name={KNOB_A}"], deploy="deploy.py",
                              timeout=RELEASE_TIMEOUT_S))
        verified = ledger(rig, rig_exec)[-1]
        assert (verified["image"], verified["smoke"]) == (release_1, "pass"), verified
        stored = rendering_dir(verified["rendering"])
        assert rig_exec(rig, f"stat -c %a {stored} {stored}/.env").stdout.split() == ["700", "600"]
        assert f"RIGKIT_SERVED_MODEL_NAME='{KNOB_A}'" in rig_exec(rig, f"cat {stored}/.env").stdout

        assert_ok(run_pyinfra(args=[*limit, "--data", f"serving_image={release_2}",
                                    "--data", f"served_model_name={KNOB_B}"], deploy="deploy.py",
                              timeout=RELEASE_TIMEOUT_S))
        assert serving_release(rig, rig_exec) == "2" and models(rig, lab_host_data) == [KNOB_B]

        # today's data says B: a re-rendering would serve B; the stored rendering serves A
        todays = ["--data", f"served_model_name={KNOB_B}"]
        assert_ok(run_pyinfra(args=[*limit, *todays], deploy="rollback.py", timeout=RELEASE_TIMEOUT_S))
        assert serving_release(rig, rig_exec) == "1"
        assert container_env(rig, rig_exec)["RIGKIT_SERVED_MODEL_NAME"] == KNOB_A
        assert models(rig, lab_host_data) == [KNOB_A]
        rolled_back = ledger(rig, rig_exec)[-1]
        assert (rolled_back["kind"], rolled_back["image"], rolled_back["smoke"]) == ("rollback", release_1, "pass")
        assert rolled_back["rendering"] == verified["rendering"], rolled_back
        assert "restored the verified rendering" in rolled_back["note"] and "re-rendered" not in rolled_back["note"]

        entries = len(ledger(rig, rig_exec))
        again = run_pyinfra(args=[*limit, *todays], deploy="rollback.py", timeout=RELEASE_TIMEOUT_S)
        assert_ok(again)
        total = grand_total(again)
        assert total.success == 0 and total.error == 0, again.stdout[-4000:]
        assert len(ledger(rig, rig_exec)) == entries  # nothing was released, so nothing was recorded
    finally:
        # back to the standard deploy (release 1, lab group data), as the `deployed` fixture left the rig
        reconverged = run_pyinfra(args=limit, deploy="deploy.py", timeout=RELEASE_TIMEOUT_S)
    assert_ok(reconverged)
    assert serving_release(rig, rig_exec) == "1" and models(rig, lab_host_data) == ["tiny"]
