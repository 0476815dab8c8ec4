"""The warm-shared tier on the lab: rig1 and rig2 with cpu-lab's ExampleConnector store on the shared mount (the
lab's stand-in for a NAS: one host directory bind-mounted into every rig, inventory/lab.py).

Needs the lab with rig1 and rig2 and the shared-mount role (issue 15). The module fixture deploys both with
`--data kv_share=true` (the same arguments as the shared-mount helper's lab test, SHARE_DEPLOY, so a session running
both can share one deploy) and deploys them again without it at the end, as the session's `deployed` fixture left
them. pyinfra 3 takes one pattern per --limit (rigkit.fleet.split_limits), hence two.
"""

from __future__ import annotations

import shlex
from contextlib import ExitStack

import pytest

from rigkit.facts.docker import ComposeCommand
from rigkit.fleet import load_inventory
from rigkit.hostdata import rig_settings
from rigkit.paths import REPO_ROOT
from rigkit.stack import in_stack
from rigkit.tiers import Tier
from rigkit.validation import ValidationSettings
from rigkit.warm_shared import ask, prefill, prompt_specs, rig_client, validate_shared

LAB_INVENTORY = REPO_ROOT / "inventory" / "lab.py"
DEPLOY_TIMEOUT_S = 1800  # as tests/lab/conftest.py's deploy
RIGS = ("rig1", "rig2")
SHARE_DATA = {"kv_share": True, "validate_sessions": 1}
SHARE_DEPLOY = ["--limit", "rig1", "--limit", "rig2", "--data", "kv_share=true"]


@pytest.fixture(scope="module")
def kv_shared(lab, serving_image, run_pyinfra):
    result = run_pyinfra(SHARE_DEPLOY, deploy="deploy.py", timeout=DEPLOY_TIMEOUT_S)
    assert result.returncode == 0, f"kv_share deploy failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    yield
    back = run_pyinfra(["--limit", "rig1", "--limit", "rig2"], deploy="deploy.py", timeout=DEPLOY_TIMEOUT_S)
    assert back.returncode == 0, f"redeploy without kv_share failed:\n{back.stdout[-6000:]}"


def test_rig2_serves_what_rig1_prefilled_by_its_own_external_hits_and_the_card_shows_the_pair(kv_shared, tmp_path):
    pairs = validate_shared(str(LAB_INVENTORY), [",".join(RIGS)], SHARE_DATA, tmp_path)
    by_pair = {(p.source, p.target): p for p in pairs}
    assert set(by_pair) == {("rig1", "rig2"), ("rig2", "rig1")}
    shared = by_pair[("rig1", "rig2")]
    assert shared.label == Tier.WARM_SHARED.value and shared.passed, shared.asked.proofs
    (proof,) = shared.asked.proofs
    assert proof.gpu_hits == 0 and proof.external_hits > 0, proof.text
    assert shared.prefill.labels == ["cold"] and all(check.same for check in shared.asked.greedy)
    # rig2's cold figure: its own prefill for rig1 (the same size); measured 129 ms against 354 ms cold by hand
    assert shared.asked.ttft_s.mean < by_pair[("rig2", "rig1")].prefill.ttft_s.mean
    fleet = (tmp_path / "fleet.md").read_text()
    assert "| rig1 → rig2 | warm-shared ✓ |" in fleet and "| rig2 → rig1 |" in fleet, fleet


def test_with_the_shared_store_wiped_between_prefill_and_ask_rig2_is_not_warm(kv_shared, rig_exec, lab):
    """The store is wiped with both stacks down: wiping an ExampleConnector store under its running engine killed
    the engine in the lab (README), a connector fault, not this tier. rig2 never had the prompt either way."""
    hosts = load_inventory(str(LAB_INVENTORY))
    datas = {name: {**hosts[name]["data"], **SHARE_DATA} for name in RIGS}
    stacks = {name: rig_settings(datas[name]).stack for name in RIGS}
    settings = ValidationSettings.from_data(datas["rig1"])
    composes = {name: in_stack(rig_exec(lab.rig(name), ComposeCommand().command()).stdout.strip()) for name in RIGS}
    with ExitStack() as stack:
        clients = {name: rig_client(stack, name, datas[name], stacks[name].knobs) for name in RIGS}
        for client in clients.values():
            client.wait_ready()
        prefilled = prefill("rig1", clients["rig1"], prompt_specs(settings, 4242), settings.output_tokens, 900)
        for name in RIGS:
            rig_exec(lab.rig(name), f"{composes[name]} down --remove-orphans")
        store = stacks["rig1"].knobs["l2_path"]  # the shared store, at the same path on every sharing rig
        rig_exec(lab.rig("rig1"), f"find {shlex.quote(store)} -mindepth 1 -delete")
        for name in RIGS:
            rig_exec(lab.rig(name), f"{composes[name]} up -d")
        clients["rig2"].wait_ready()
        pair = ask(prefilled, "rig2", clients["rig2"], settings.output_tokens, 900)
        clients["rig1"].wait_ready()  # both stacks back for the tests after this one
    assert pair.prefill.labels == ["cold"]
    assert pair.asked.labels == [Tier.RETRIEVED_BUT_UNUSED.value] and not pair.passed, pair.asked.proofs
    assert pair.asked.proofs[0].external_hits == 0
