"""rigkit/files/node_textfile.py on real nvidia-smi captures (tests/fixtures/nvidia-smi): the lines the node exporter
reads, checked by prometheus_client's reference parser."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from rigkit.files import node_textfile as textfile

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
H200_POWER = (FIXTURES / "gpu-check-2026-12-03" / "nvidia-smi-query-gpu.csv").read_text()
H200_X2 = (FIXTURES / "h200-x2-ubuntu2404" / "query-gpu.csv").read_text()


def samples(text: str) -> dict:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_power_temperature_and_throttle_reasons_from_the_h200_capture():
    text = textfile.render(H200_POWER.split("exit=")[0], "", [], [], 1.0)
    got = samples(text)
    assert got[(textfile.GPU_POWER_DRAW, (("gpu", "0"),))] == 78.77
    assert got[(textfile.GPU_POWER_LIMIT, (("gpu", "0"),))] == 700.0
    assert got[(textfile.GPU_TEMPERATURE, (("gpu", "0"),))] == 36.0
    reasons = {labels[1][1]: value for (name, labels), value in got.items() if name == textfile.GPU_THROTTLE}
    assert reasons == {"sw_power_cap": 0, "hw_slowdown": 0, "hw_thermal": 0, "hw_power_brake": 0, "sw_thermal": 0}
    assert got[(textfile.GPU_XID_ERRORS, ())] == 0
    assert got[(textfile.GPU_QUERY_OK, ())] == 1


def test_memory_and_identity_of_two_gpus():
    got = samples(textfile.render(H200_X2, None, [], [], 1.0))
    assert got[(textfile.GPU_MEMORY_TOTAL, (("gpu", "1"),))] == 143771 * 1024 * 1024
    assert got[(textfile.GPU_MEMORY_USED, (("gpu", "0"),))] == 0
    info = [labels for (name, labels) in got if name == textfile.GPU_INFO]
    assert (("gpu", "1"), ("name", "NVIDIA H200"), ("uuid", "GPU-935f3bed-6d9e-07dd-0c41-992306511ed5")) in info
    assert (textfile.GPU_XID_ERRORS, ()) not in got  # no kernel log read: no count, not a zero


def test_an_active_throttle_reason_and_xid_lines():
    header = "index, clocks_event_reasons.hw_thermal_slowdown, clocks_event_reasons.sw_power_cap, power.draw [W]\n"
    kernel = "NVRM: Xid (PCI:0000:01:00): 79, pid=1, GPU has fallen off the bus.\nother line\nNVRM: Xid (PCI:0000:01:00): 13\n"
    got = samples(textfile.render(header + "0, Active, Not Active, [N/A]\n", kernel, [], [], 1.0))
    assert got[(textfile.GPU_THROTTLE, (("gpu", "0"), ("reason", "hw_thermal")))] == 1
    assert got[(textfile.GPU_THROTTLE, (("gpu", "0"), ("reason", "sw_power_cap")))] == 0
    assert (textfile.GPU_POWER_DRAW, (("gpu", "0"),)) not in got  # [N/A] is no value
    assert got[(textfile.GPU_XID_ERRORS, ())] == 2


def test_a_cpu_rig_shm_and_l2(tmp_path):
    status = tmp_path / "janitor.json"
    status.write_text(json.dumps({"store_bytes": 750, "budget_bytes": 1000, "state": "ok"}))
    got = samples(textfile.render(None, None, textfile.shm_lines(), textfile.l2_lines(str(status)), 5.0))
    assert got[(textfile.GPU_QUERY_OK, ())] == 0
    assert not any(name.startswith("rigkit_gpu_") and name != textfile.GPU_QUERY_OK for name, _ in got)
    assert got[(textfile.SHM_SIZE, ())] >= got[(textfile.SHM_FREE, ())] > 0
    assert (got[(textfile.L2_STORE, ())], got[(textfile.L2_BUDGET, ())]) == (750, 1000)
    assert textfile.l2_lines(str(tmp_path / "absent.json")) == []


def test_the_script_writes_its_file_in_one_piece(tmp_path):
    output = tmp_path / "rigkit.prom"
    result = subprocess.run(
        [sys.executable, textfile.__file__, str(output), str(tmp_path / "none.json")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert samples(output.read_text())[(textfile.GPU_QUERY_OK, ())] in (0, 1)
    assert [path.name for path in tmp_path.iterdir()] == ["rigkit.prom"]
