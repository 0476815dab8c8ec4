"""`rigkit status`: the one script a rig runs, its sections parsed, and the drift and health decisions.

The end-to-end cases run the real script on a rig made on this machine (tests/status_sandbox.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from rigkit import status as st
from rigkit.errors import ConfigError
from rigkit.status_drift import Drift
from rigkit.status_rig import UNREACHABLE, RigStatus
from rigkit.tunnel import TunnelError
from status_sandbox import IMAGE_1


def test_an_unreachable_rig_is_reported_and_fails_the_run():
    def ask(name, data, script):
        raise TunnelError("ssh_hostname", "127.0.0.1:2299", "SSH connection failed (refused)", "check it")

    status = st.rig_status("rig9", {}, None, ask)
    assert status.state == UNREACHABLE and "SSH connection failed" in status.error
    assert st.exit_status([status]) == 1 and "unreachable: " in st.format_report([status])


def test_a_long_table_fits_a_terminal():
    statuses = [RigStatus(f"rig-with-a-rather-long-name-{i}", image=IMAGE_1,
                             drift=[Drift(".env", knob, "'a'", "'b'") for knob in
                                    ("served_model_name", "max_model_len", "max_num_batched_tokens")],
                             health={"engine": "ok", "container": "rigkit-serving restarting", "api": "down"},
                             ledger={"kind": "rollback", "smoke": "fail", "deployed_at": "2026-12-01T12:30:05+00:00",
                                     "note": "automatic: deploy failed " * 20},
                             driver="580.159.04", cuda="13.0") for i in range(3)]
    for status in statuses:
        status.unhealthy = ["container: rigkit-serving restarting"]
    report = st.format_report(statuses)
    table = report.split("\n")[:len(statuses) + 1]
    assert max(len(line) for line in table) <= st.TABLE_WIDTH
    assert table[0].split()[:3] == ["rig", "state", "image"]
    assert "drift .env: max_model_len: rig 'a', today 'b'" in report  # the details name every knob in full


def test_cli_values_are_read_as_pyinfra_reads_them():
    samples = ["true", "False", "8", "-3", "0.5", '{"method": "mtp"}', '["--x"]', "tiny", "0,1", ""]
    # pyinfra_cli patches the whole process with gevent on import: compared in a child
    code = ("import json, sys; from pyinfra_cli.util import parse_cli_arg; "
            "print(json.dumps([parse_cli_arg(a) for a in json.loads(sys.argv[1])]))")
    theirs = json.loads(subprocess.run([sys.executable, "-c", code, json.dumps(samples)], capture_output=True,
                                       text=True, check=True).stdout)
    assert [st.cli_value(sample) for sample in samples] == theirs
    with pytest.raises(ConfigError):
        st.parse_data(["no-equals-sign"])


def fake_inventory(monkeypatch, hosts):
    import rigkit.fleet

    monkeypatch.setattr(rigkit.fleet, "load_inventory", lambda inventory: hosts)


HOST = {"ssh_hostname": "127.0.0.1", "ssh_password": "lab", "serving_profile": "cpu-lab",
        "serving_image": IMAGE_1, "gpus": 0}


def test_every_targeted_rig_is_asked_once_in_parallel(monkeypatch):
    fake_inventory(monkeypatch, {f"rig{i}": {"data": HOST, "groups": ["lab"]} for i in range(1, 4)})
    asked, together, lock, both_inside = [], [], threading.Lock(), threading.Barrier(2, timeout=5)

    def ask(name, data, script):
        with lock:
            asked.append((name, data["served_model_name"]))
        try:
            both_inside.wait()  # only passes when two rigs are being asked at the same time
            together.append(name)
        except threading.BrokenBarrierError:
            pass
        raise OSError("no rig here")

    statuses = st.fleet_status("inventory.py", ["rig1,rig2"], {"served_model_name": "x"}, ask)
    assert sorted(asked) == [("rig1", "x"), ("rig2", "x")] and sorted(together) == ["rig1", "rig2"]
    assert [s.rig for s in statuses] == ["rig1", "rig2"] and {s.state for s in statuses} == {UNREACHABLE}


def test_bad_data_or_limit_is_refused_before_any_rig_is_asked(monkeypatch):
    fake_inventory(monkeypatch, {"rig1": {"data": HOST, "groups": []}})

    def ask(name, data, script):
        raise AssertionError("a rig was asked")

    with pytest.raises(ConfigError, match="max_model_len"):
        st.fleet_status("inventory.py", [], {"max_model_len": 3}, ask)
    with pytest.raises(ConfigError, match="matches no rig"):
        st.fleet_status("inventory.py", ["rig7"], {}, ask)


def test_the_gateway_and_the_kv_store_are_not_asked_as_rigs(monkeypatch):
    fake_inventory(monkeypatch, {"rig1": {"data": HOST, "groups": ["lab"]}, "gw": {"data": {}, "groups": ["routers"]},
                                 "store": {"data": {}, "groups": ["kv_stores"]}})
    asked = []

    def ask(name, data, script):
        asked.append(name)
        raise OSError("no rig here")

    assert [s.rig for s in st.fleet_status("inventory.py", [], {}, ask)] == ["rig1"] and asked == ["rig1"]
    with pytest.raises(ConfigError, match="matches no rig"):
        st.fleet_status("inventory.py", ["gw"], {}, ask)
