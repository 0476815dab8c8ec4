"""Asking the rigs: every targeted rig once, in parallel; bad input refused before any rig is asked; an unreachable
rig reported.
"""

from __future__ import annotations

import threading

import pytest
from status_sandbox import IMAGE_1

from rigkit.errors import ConfigError
from rigkit.fleet.targets import select
from rigkit.remote.tunnel import TunnelError
from rigkit.status.fleet import fleet_status, rig_status
from rigkit.status.report import exit_status, format_report
from rigkit.status.rig import UNREACHABLE


def test_an_unreachable_rig_is_reported_and_fails_the_run():
    def ask(name, data, script):
        raise TunnelError("ssh_hostname", "127.0.0.1:2299", "SSH connection failed (refused)", "check it")

    status = rig_status("rig9", {}, None, ask)
    assert status.state == UNREACHABLE and "SSH connection failed" in status.error
    assert exit_status([status]) == 1 and "unreachable: " in format_report([status])


def fake_inventory(monkeypatch, hosts):
    """The inventory rigkit.fleet.targets loads, --data applied as pyinfra applies it (a value's text kept)."""
    import rigkit.fleet.targets

    def load(inventory, data_args=()):
        override = dict(pair.split("=", 1) for pair in data_args)
        return {name: {**host, "data": {**host["data"], **override}} for name, host in hosts.items()}

    monkeypatch.setattr(rigkit.fleet.targets, "load_inventory", load)


def status_of(limits, data, ask):
    return fleet_status(select("inventory.py", limits, data), ask)


HOST = {
    "ssh_hostname": "127.0.0.1",
    "ssh_password": "lab",
    "serving_profile": "cpu-lab",
    "serving_image": IMAGE_1,
    "gpus": 0,
}


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

    statuses = status_of(["rig1,rig2"], ["served_model_name=x"], ask)
    assert sorted(asked) == [("rig1", "x"), ("rig2", "x")] and sorted(together) == ["rig1", "rig2"]
    assert [s.rig for s in statuses] == ["rig1", "rig2"] and {s.state for s in statuses} == {UNREACHABLE}


def test_bad_data_or_limit_is_refused_before_any_rig_is_asked(monkeypatch):
    fake_inventory(monkeypatch, {"rig1": {"data": HOST, "groups": []}})

    def ask(name, data, script):
        raise AssertionError("a rig was asked")

    with pytest.raises(ConfigError, match="max_model_len"):
        status_of([], ["max_model_len=3"], ask)
    with pytest.raises(ConfigError, match="matches no host or group"):
        status_of(["rig7"], [], ask)


def test_the_gateway_and_the_kv_store_are_not_asked_as_rigs(monkeypatch):
    fake_inventory(
        monkeypatch,
        {
            "rig1": {"data": HOST, "groups": ["lab"]},
            "gw": {"data": {}, "groups": ["routers"]},
            "store": {"data": {}, "groups": ["kv_stores"]},
        },
    )
    asked = []

    def ask(name, data, script):
        asked.append(name)
        raise OSError("no rig here")

    assert [s.rig for s in status_of([], [], ask)] == ["rig1"] and asked == ["rig1"]
    with pytest.raises(ConfigError, match="matches no rig"):
        status_of(["gw"], [], ask)


def test_each_rigs_gpu_thresholds_and_declared_power_limit_come_from_its_data(monkeypatch):
    """The H200 capture (700 W enforced) read for two rigs: the one declaring a 260 W cap warns, naming the fix."""
    from pathlib import Path

    capture = Path(__file__).parent.parent / "fixtures" / "nvidia-smi" / "gpu-check-2026-12-03"
    answer = "\n".join(
        ["@@rigkit-status gpu", (capture / "nvidia-smi-query-gpu.csv").read_text().strip()]
        + ["@@rigkit-status kernel-log", "source=journal", "matched=0"]
    )
    capped = {**HOST, "nvidia_driver_power_limit_w": 260, "gpu_temp_warn_c": 30, "gpu_temp_fail_c": 90}
    fake_inventory(
        monkeypatch, {"rig1": {"data": HOST, "groups": ["lab"]}, "rig2": {"data": capped, "groups": ["lab"]}}
    )
    plain, capped_rig = status_of([], [], lambda name, data, script: answer)
    assert plain.gpu["findings"] == []
    shorts = {finding["short"] for finding in capped_rig.gpu["findings"]}
    assert shorts == {"power limit 700W", "36°C"}, capped_rig.gpu["findings"]
    assert any("nvidia-smi -i 0 -pl 260" in warning for warning in capped_rig.warnings)


def test_a_warning_temperature_at_or_over_the_failing_one_is_refused_before_any_rig_is_asked(monkeypatch):
    fake_inventory(monkeypatch, {"rig1": {"data": {**HOST, "gpu_temp_warn_c": 95}, "groups": ["lab"]}})
    with pytest.raises(ConfigError, match="gpu_temp_warn_c"):
        status_of([], [], lambda name, data, script: pytest.fail("a rig was asked"))
