"""The L2 filesystem filled by ANOTHER process does not take the stack down: the janitor evicts the
store's oldest entries (never the foreign file), says loudly when the store is empty and the floor is
still unmet, the server keeps answering, and validation's L2 report reads "low", then "full", with the
numbers and the fix.

Runs on the first host-network lab rig as the session's `deployed` fixture left it (cpu-lab, release 1,
the ExampleConnector store under its janitor). The foreign file is removed at the end and the rig is
re-converged, so it is left deployed and serving release 1.
"""

from __future__ import annotations

import json
import shlex
import time
from typing import Callable

import pytest

from rigkit.files.l2_janitor import (
    ENTRY_GRACE_S,
    L2_JANITOR_INTERVAL_S,
    L2_JANITOR_MIN_FREE_BYTES,
    L2_JANITOR_UNIT,
    STATE_BELOW_FLOOR,
    STATE_OK,
    STATUS_FILE,
)
from rigkit.l2_state import read_l2
from rigkit.lab.pyinfra_output import parse_results
from rigkit.prompts import PromptSpec
from rigkit.remote.client import ServingClient
from rigkit.remote.tunnel import serving_url
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.sizing import GB
from rigkit.validation.card import L2Report, fmt_l2

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

SESSION_TOKENS = 3500  # ~3.5 MB per store entry at the tiny model's ~1 KB/token
SEEDED_SESSIONS = 6
MB = 10**6
# Phase A leaves the floor this short: a few of the seeded entries close the gap, not all of them.
SHORTFALL_BYTES = 8 * MB
JANITOR_WAIT_S = 60  # generous: the janitor acts every L2_JANITOR_INTERVAL_S once entries pass their grace
FOREIGN_NAME = "rigkit-test-foreign.bin"


def wait_for(what: str, probe: Callable[[], object], timeout_s: float = JANITOR_WAIT_S):
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(L2_JANITOR_INTERVAL_S / 2)


def test_foreign_file_filling_the_l2_disk_keeps_the_stack_serving(
    lab, deployed, run_pyinfra, rig_exec, lab_host_data, rig_diagnostics
):
    rig = next(r for r in lab.rigs if not r.netns)
    data = {
        **lab_host_data[rig.name],
        "serving_profile": "cpu-lab",
        "serving_image": lab.serving_image["releases"]["1"],
    }
    stack = settings_for_host(data)
    store, floor = stack.knobs["l2_path"], L2_JANITOR_MIN_FREE_BYTES

    def run(cmd: str) -> str:
        return rig_exec(rig, cmd).stdout

    def l2_report() -> L2Report:
        """What validate.py's card records: the same reader, through the rig's shell."""
        report = read_l2(run, stack)
        assert report is not None and report.budget_bytes == int(stack.knobs["l2_budget_gb"] * GB)
        return report

    def janitor_status(after: float = 0.0) -> dict:
        """The janitor's status from a round that began after `after` (rig clock), or {}."""
        text = rig_exec(rig, f"cat {STATUS_FILE}", check=False).stdout
        status = json.loads(text) if text.strip() else {}
        return status if status.get("updated_at", 0) > after else {}

    def entries() -> dict[str, float]:
        """Store entry -> last write (the janitor's LRU order, the mount being noatime)."""
        lines = run(f"find {shlex.quote(store)} -mindepth 1 -maxdepth 1 -printf '%T@ %f\\n'").split("\n")
        return {name: float(stamp) for stamp, name in (line.split(" ", 1) for line in lines if line)}

    def fill_to_free(free_bytes: int) -> float:
        """The foreign file (another process's) grows until `free_bytes` stay available on the mount;
        returns when it was done (rig clock)."""
        current = int(run(f"stat -c %s {foreign} 2>/dev/null || echo 0").strip())
        available = int(run(f"df -B1 --output=avail {shlex.quote(mount)} | tail -n 1").strip())
        run(f"fallocate -l {current + available - free_bytes} {foreign}")
        return float(run("date +%s.%N"))

    def journal(priority: str = "info") -> str:
        return rig_exec(
            rig, f"journalctl -u {L2_JANITOR_UNIT} --since @{started} -p {priority} --no-pager -o cat", check=False
        ).stdout

    wait_for("the janitor's status file (a janitor that writes one is deployed)", janitor_status)
    mount = l2_report().mount
    assert mount and mount != store, f"l2_path {store} must be a directory of its own on the L2 mount"
    foreign = shlex.quote(f"{mount.rstrip('/')}/{FOREIGN_NAME}")
    started = int(run("date +%s").strip())
    try:
        with serving_url(data, "127.0.0.1", rig.serving_port, rig.name) as url:
            client = ServingClient(url)

            def completion(seed: int) -> None:
                prompt = client.build_prompt(PromptSpec("narrative", SESSION_TOKENS, seed=seed))
                outcome = client.stream_completion(prompt.text, max_tokens=4, timeout_s=300)
                assert not outcome.aborted, f"{outcome.error}\n{rig_diagnostics(rig)}"

            def still_serving(seed: int) -> None:
                assert [model["id"] for model in client.models()] == ["tiny"]
                completion(seed)

            # The store holds a few more entries (prompts no earlier run sent), old enough to evict.
            before = set(entries())
            for index in range(SEEDED_SESSIONS):
                completion(seed=started * 100 + index)
            stored = entries()
            assert len(set(stored) - before) >= 2, stored
            time.sleep(ENTRY_GRACE_S + L2_JANITOR_INTERVAL_S)

            # Phase A: another process leaves the floor a few MB short: the oldest entries go, the rest stay.
            filled_at = fill_to_free(floor - SHORTFALL_BYTES)
            foreign_bytes = int(run(f"stat -c %s {foreign}").strip())
            status = wait_for(
                "the janitor to restore the floor",
                lambda: (
                    (s := janitor_status(after=filled_at)).get("state") == STATE_OK
                    and s["fs_free_bytes"] >= floor
                    and s
                ),
            )
            left = entries()
            evicted, survivors = set(stored) - set(left), set(stored) & set(left)
            assert evicted and survivors, (evicted, left)
            assert max(stored[name] for name in evicted) <= min(stored[name] for name in survivors)  # oldest first
            assert "below the floor" in status["last_eviction"]["reason"]
            logged = journal()
            assert any(
                line.startswith("evicted") and "below the floor" in line and any(n in line for n in evicted)
                for line in logged.splitlines()
            ), logged
            low = l2_report()
            assert (low.state, low.level) == ("low", "warn"), low
            assert low.fs_free_bytes >= floor and low.evicted_entries >= len(evicted)
            assert f"free space on {mount} or lower l2_budget_gb" in low.problems[0]
            still_serving(seed=started * 100 + 20)

            # Phase B: the other process keeps filling what the janitor frees: the store cannot restore the floor.
            fill_to_free(floor // 2)
            for index in range(2):  # requests that store KV while the disk sits under the floor
                still_serving(seed=started * 100 + 10 + index)

            def store_emptied_under_the_floor():
                filled_at = fill_to_free(floor // 2)
                status = wait_for("a janitor round after the fill", lambda: janitor_status(after=filled_at))
                return status.get("state") == STATE_BELOW_FLOOR and status.get("entries") == 0 and status

            status = wait_for(
                "the janitor to empty the store and report the floor it cannot restore",
                store_emptied_under_the_floor,
                timeout_s=3 * JANITOR_WAIT_S,
            )
            assert entries() == {}
            assert f"free space on {mount}" in status["message"]
            assert "L2 BELOW-FLOOR" in journal(priority="err")
            full = l2_report()
            print(fmt_l2(full))
            assert (full.state, full.level) == ("full", "fail"), full
            assert full.fs_free_bytes < floor and full.min_free_bytes == floor and full.fs_size_bytes > floor
            assert full.janitor == "active" and full.janitor_state == STATE_BELOW_FLOOR
            assert f"free space on {mount} or lower l2_budget_gb" in full.problems[0]
            assert "something else fills the disk" in full.problems[0]
            assert int(run(f"stat -c %s {foreign}").strip()) >= foreign_bytes  # never the foreign file
            still_serving(seed=started * 100 + 21)

            # The other process goes away: the janitor says so and the report is clean again.
            run(f"rm -f {foreign}")
            removed_at = float(run("date +%s.%N"))
            wait_for(
                "the janitor to see the floor restored",
                lambda: janitor_status(after=removed_at).get("state") == STATE_OK,
            )
            assert "is over" in journal()
            assert l2_report().state == "ok"
            still_serving(seed=started * 100 + 22)
    finally:
        rig_exec(rig, f"rm -f {foreign}", check=False)
        restore = run_pyinfra(args=["--limit", rig.name], deploy="deploy.py")
        assert restore.returncode == 0, restore.stdout[-3000:] + restore.stderr[-3000:]
        assert parse_results(restore.stdout + restore.stderr)["Grand total"].error == 0
