"""A rollback restores exactly what was verified (issue 4), on a real lab rig with the real vLLM CPU stack,
and needs no registry: the rollback runs with the lab's registry stopped and pulls nothing.

The rig starts on the standard deploy (`deployed`: release 1, served_model_name ``tiny``), verified and
recorded in its ledger. Release 2 is deployed with served_model_name B; rollback.py, run while today's data
still says B, brings back release 1 WITH ``tiny``: the rendering stored on the rig when release 1 was verified,
not release 1 re-rendered with today's data. A second rollback.py run changes nothing, and the standard
deploy afterwards changes nothing either: the rollback left the rig exactly as the `deployed` fixture did.
Two vLLM starts (release 2, the rollback).
"""

from __future__ import annotations

import pytest
from test_serving_lab import assert_ok, grand_total, ledger, models, serving_release

from rigkit.lab.registry_server import ensure_registry, stop_registry
from rigkit.serving.ledger import rendering_dir
from rigkit.serving.render import CONTAINER_NAME

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

STANDARD_NAME, KNOB_B = "tiny", "tiny-today-b"
RELEASE_TIMEOUT_S = 1800


def container_env(rig, rig_exec) -> dict[str, str]:
    out = rig_exec(rig, f"docker exec {CONTAINER_NAME} env").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_rollback_restores_the_verified_rendering_not_todays_without_a_registry(
    lab, deployed, run_pyinfra, rig_exec, lab_host_data
):
    rig = [r for r in lab.rigs if not r.netns][-1]  # a host-network rig (rig2 in the standard lab)
    release_1, release_2 = lab.serving_image["releases"]["1"], lab.serving_image["releases"]["2"]
    limit = ["--limit", rig.name]
    verified = ledger(rig, rig_exec)[-1]
    assert (verified["image"], verified["smoke"]) == (release_1, "pass"), verified
    assert serving_release(rig, rig_exec) == "1" and models(rig, lab_host_data) == [STANDARD_NAME]
    stored = rendering_dir(verified["rendering"])
    assert rig_exec(rig, f"stat -c %a {stored} {stored}/.env").stdout.split() == ["700", "600"]
    assert f"RIGKIT_SERVED_MODEL_NAME='{STANDARD_NAME}'" in rig_exec(rig, f"cat {stored}/.env").stdout
    try:
        todays = ["--data", f"served_model_name={KNOB_B}"]
        assert_ok(
            run_pyinfra(
                args=[*limit, "--data", f"serving_image={release_2}", *todays],
                deploy="deploy.py",
                timeout=RELEASE_TIMEOUT_S,
            )
        )
        assert serving_release(rig, rig_exec) == "2" and models(rig, lab_host_data) == [KNOB_B]

        # today's data says B: a re-rendering would serve B; the stored rendering serves tiny. No registry.
        since = rig_exec(rig, "date +%s").stdout.strip()
        stop_registry(progress=print)
        try:
            rolled = run_pyinfra(args=[*limit, *todays], deploy="rollback.py", timeout=RELEASE_TIMEOUT_S)
        finally:
            ensure_registry(progress=print)
        assert_ok(rolled)
        pulls = rig_exec(
            rig, f"docker events --since {since} --until $(date +%s) --filter type=image --filter event=pull"
        ).stdout
        assert pulls.strip() == "", pulls
        assert serving_release(rig, rig_exec) == "1"
        assert container_env(rig, rig_exec)["RIGKIT_SERVED_MODEL_NAME"] == STANDARD_NAME
        assert models(rig, lab_host_data) == [STANDARD_NAME]
        entries = ledger(rig, rig_exec)
        assert [e["kind"] for e in entries[-2:]] == ["deploy", "rollback"]
        rolled_back = entries[-1]
        assert (rolled_back["kind"], rolled_back["image"], rolled_back["smoke"]) == ("rollback", release_1, "pass")
        assert rolled_back["rendering"] == verified["rendering"], rolled_back
        assert "restored the verified rendering" in rolled_back["note"] and "re-rendered" not in rolled_back["note"]

        again = run_pyinfra(args=[*limit, *todays], deploy="rollback.py", timeout=RELEASE_TIMEOUT_S)
        assert_ok(again)
        total = grand_total(again)
        assert total.success == 0 and total.error == 0, again.stdout[-4000:]
        assert len(ledger(rig, rig_exec)) == len(entries)  # nothing was released, so nothing was recorded
    finally:
        # the standard deploy (release 1, lab group data): after the rollback, nothing left to change
        reconverged = run_pyinfra(args=limit, deploy="deploy.py", timeout=RELEASE_TIMEOUT_S)
    assert_ok(reconverged)
    assert serving_release(rig, rig_exec) == "1" and models(rig, lab_host_data) == [STANDARD_NAME]
    total = grand_total(reconverged)
    assert total.success == 0 and total.error == 0, reconverged.stdout[-4000:]
