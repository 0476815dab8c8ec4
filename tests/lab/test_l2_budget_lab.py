"""The L2 store growing past its budget does not take the stack down (ExampleConnector never evicts;
rigkit's L2 janitor keeps the store under l2_budget_gb, least recently used first)."""

from __future__ import annotations

import time

import pytest

from rigkit.files.l2_janitor import L2_JANITOR_INTERVAL_S
from rigkit.lab.pyinfra_output import parse_results
from rigkit.prompts import PromptSpec
from rigkit.remote.client import ServingClient
from rigkit.remote.tunnel import serving_url
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.sizing import GB

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

BUDGET_GB = 0.02  # ~5 sessions of ~3,500 tokens at the tiny model's 1 KB/token
SESSIONS = 12
SESSION_TOKENS = 3500


def store_bytes(rig, rig_exec, path: str) -> int:
    return int(rig_exec(rig, f"du -sb {path} | cut -f1").stdout.split()[0])


def test_store_past_its_budget_is_evicted_and_the_stack_keeps_serving(
    lab, deployed, run_pyinfra, rig_exec, lab_host_data
):
    rig = next(r for r in lab.rigs if not r.netns)
    data = {
        **lab_host_data[rig.name],
        "serving_profile": "cpu-lab",
        "serving_image": lab.serving_image["releases"]["1"],
    }
    store = settings_for_host(data).knobs["l2_path"]
    result = run_pyinfra(args=["--limit", rig.name, "--data", f"l2_budget_gb={BUDGET_GB}"], deploy="deploy.py")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    try:
        with serving_url(data, "127.0.0.1", rig.serving_port, rig.name) as url:
            client = ServingClient(url)
            for seed in range(SESSIONS):
                prompt = client.build_prompt(PromptSpec("narrative", SESSION_TOKENS, seed=1000 + seed))
                outcome = client.stream_completion(prompt.text, max_tokens=1, timeout_s=300)
                assert not outcome.aborted, outcome.error
            time.sleep(3 * L2_JANITOR_INTERVAL_S)
            assert [model["id"] for model in client.models()] == ["tiny"]
        written = SESSIONS * SESSION_TOKENS * 1000  # ~1 KB/token: what the store would hold without eviction
        assert written > 2 * BUDGET_GB * GB
        assert store_bytes(rig, rig_exec, store) <= BUDGET_GB * GB
        evictions = rig_exec(
            rig, "journalctl -u rigkit-l2-janitor --no-pager -o cat | grep -c evicted", check=False
        ).stdout.strip()
        assert int(evictions or 0) > 0
    finally:
        restore = run_pyinfra(args=["--limit", rig.name], deploy="deploy.py")
        assert restore.returncode == 0, restore.stdout[-3000:] + restore.stderr[-3000:]
        total = parse_results(restore.stdout + restore.stderr)["Grand total"]
        assert total.error == 0
