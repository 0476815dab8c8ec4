"""Reproduce on another rig, side by side: validate.py on rig1, then on rig2 with `--data replay=results/<rig1's run>`.

Two real validate.py runs through pyinfra, each on one host-network lab rig (cpu-lab, release 1, as the session's
`deployed` fixture left them; a No Change deploy per rig first puts back release 1 if an earlier test moved it).
`validate_restart=false`: no compose down/up, so no vLLM start beyond the session's (the persistent tier is then not
measured on either side); 2 sessions each, the least that gives a TTFT figure a CV band.

Asserted: the replay repeats the recorded prompts (no "prompts" setup difference), keeps rig1's card in its own
run directory, sets rig1 (marked recorded, with its date) beside rig2 on the fleet card, calls out the settings
that really differ between the two rigs (each rig's serving port), and judges every figure both measured; the hit
counts reproduce (the same prompts on the same 72-block pool hit the same blocks). The TTFT verdicts are printed,
not asserted: timing on the lab's 2 shared cores is noise the verdict is there to show.
"""

from __future__ import annotations

import shutil

import pytest

from rigkit.paths import REPO_ROOT
from rigkit.validation.card.schema import ReplayComparison
from rigkit.validation.card.store import RECORDED_DIR, REPLAY_JSON, RESULTS_DIR, load_cards

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

VALIDATE = ["--data", "validate_restart=false", "--data", "validate_sessions=2"]


def test_a_replay_on_rig2_stands_beside_the_recorded_rig1_run(lab, deployed, run_pyinfra, monkeypatch):
    rig1, rig2 = lab.rigs[0], lab.rigs[1]
    assert not rig1.netns and not rig2.netns, "the first two lab rigs are on host networking"
    runs = {rig1.name: "replay-lab-recorded", rig2.name: "replay-lab-replay"}
    run_dirs = [REPO_ROOT / RESULTS_DIR / run for run in runs.values()]
    for run_dir in run_dirs:
        shutil.rmtree(run_dir, ignore_errors=True)
    try:
        for rig in (rig1, rig2):
            deploy = run_pyinfra(args=["--limit", rig.name], deploy="deploy.py", timeout=900)
            assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]

        monkeypatch.setenv("RIGKIT_RUN_ID", runs[rig1.name])
        first = run_pyinfra(args=["--limit", rig1.name, *VALIDATE], deploy="validate.py")
        assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-3000:]
        recorded_dir, replay_dir = run_dirs
        (recorded,) = load_cards(recorded_dir)

        monkeypatch.setenv("RIGKIT_RUN_ID", runs[rig2.name])
        replay = run_pyinfra(
            args=["--limit", rig2.name, *VALIDATE, "--data", f"replay={RESULTS_DIR / runs[rig1.name]}"],
            deploy="validate.py",
        )
        assert replay.returncode == 0, replay.stdout[-4000:] + replay.stderr[-3000:]
        print(replay.stdout[-3000:])
        (new,) = load_cards(replay_dir)
        assert [(p.kind, p.target_tokens, p.seed) for p in new.repro.prompts] == [
            (p.kind, p.target_tokens, p.seed) for p in recorded.repro.prompts
        ]
        assert [c.rig for c in load_cards(replay_dir / RECORDED_DIR)] == [rig1.name]

        fleet = (replay_dir / "fleet.md").read_text()
        print(fleet)
        assert f"| | {rig1.name} (recorded {recorded.created_at[:10]}) | {rig2.name} |" in fleet
        assert f"replay of run {runs[rig1.name]}" in fleet
        comparison = ReplayComparison.model_validate_json((replay_dir / REPLAY_JSON).read_text())
        differences = {d.setting: d for d in comparison.setup_differences}
        assert "prompts" not in differences
        port = differences["knob serving_port"]
        assert (port.recorded, port.new) == ({rig1.name: str(rig1.serving_port)}, {rig2.name: str(rig2.serving_port)})
        verdicts = {v.figure: v for v in comparison.figures}
        for figure in ("ttft:cold", "ttft:warm-gpu", "ttft:warm-connector", "hits:warm-gpu", "hits:warm-connector"):
            assert verdicts[figure].verdict in ("reproduces", "differs"), verdicts[figure]
        for figure in ("hits:warm-gpu", "hits:warm-connector"):
            assert verdicts[figure].verdict == "reproduces", verdicts[figure].text
        assert f"replay of run {runs[rig1.name]}" in replay.stdout + replay.stderr
    finally:
        for run_dir in run_dirs:
            shutil.rmtree(run_dir, ignore_errors=True)
