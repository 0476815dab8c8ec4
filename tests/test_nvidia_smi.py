"""nvidia-smi parsing on real outputs captured on a 2x H200 host (tests/fixtures/nvidia-smi)."""

from pathlib import Path

import pytest

from rigkit.nvidia_smi import (
    HEALTH_FIELD_READS,
    HEALTH_FIELDS,
    POWER_LIMIT_FIELDS,
    decode_clock_reasons,
    driver_branch,
    enforced_power_limits,
    health_query,
    parse_csv_table,
    parse_driver_version,
    parse_gpu_memory,
    parse_health_csv,
    parse_kernel_log,
    pci_key,
)

H200 = Path(__file__).parent / "fixtures" / "nvidia-smi" / "h200-x2-ubuntu2404"


def test_idle_noheader():
    gpus = parse_gpu_memory((H200 / "query-gpu-noheader.csv").read_text())
    assert [(g.index, g.free_mib, g.total_mib) for g in gpus] == [(0, 143156, 143771), (1, 143156, 143771)]
    assert all(g.free_fraction > 0.99 for g in gpus)


def test_busy_gpu0_just_under_the_gate():
    gpus = parse_gpu_memory((H200 / "query-gpu-busy-noheader.csv").read_text())
    assert gpus[0].free_fraction == pytest.approx(0.793, abs=0.001) and gpus[0].free_fraction < 0.8
    assert gpus[1].free_fraction > 0.8


def test_full_csv_with_header_and_units():
    text = (H200 / "query-gpu.csv").read_text()
    rows = parse_csv_table(text)
    assert rows[0]["name"] == "NVIDIA H200" and rows[1]["driver_version"] == "580.159.04"
    assert [(g.index, g.free_mib, g.total_mib) for g in parse_gpu_memory(text)] == [
        (0, 143156, 143771),
        (1, 143156, 143771),
    ]


def test_driver_version_from_proc_and_query():
    proc = (H200 / "host.txt").read_text().split("\n\n")[0]
    assert parse_driver_version(proc) == "580.159.04"
    assert parse_driver_version("550.54.14\n550.54.14\n") == "550.54.14"
    assert (
        parse_driver_version(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n"
        )
        == "535.183.01"
    )
    assert parse_driver_version("") is None
    assert driver_branch("580.159.04") == "580"


def test_malformed_line_refused():
    with pytest.raises(ValueError):
        parse_gpu_memory("0, 1000\n")
    assert parse_gpu_memory("") == []


GPU_CHECK = Path(__file__).parent / "fixtures" / "nvidia-smi" / "gpu-check-2026-12-03"


def test_the_health_query_asks_todays_reason_names_and_the_legacy_one_only_those():
    today, legacy = health_query(), health_query(legacy=True)
    assert "clocks_event_reasons.active" in today and "clocks_throttle" not in today
    assert legacy == today.replace("clocks_event_reasons.", "clocks_throttle_reasons.")
    # every field the query asks is read by the parser under the same name
    assert set(HEALTH_FIELDS + POWER_LIMIT_FIELDS) - {"index"} == set(HEALTH_FIELD_READS)


@pytest.mark.parametrize(
    "mask, reasons",
    [
        ("0x0000000000000000", ()),
        ("0x0000000000000001", ("gpu_idle",)),
        ("0x0000000000000044", ("sw_power_cap", "hw_thermal_slowdown")),
        ("0x0000000000000C00", ("reliability", "bit 0x800")),
    ],
)
def test_clock_event_reason_masks_decode_by_nvmls_bits(mask, reasons):
    assert decode_clock_reasons(mask) == reasons


def test_the_captured_h200_row_with_units_and_legacy_names():
    text = (GPU_CHECK / "nvidia-smi-query-gpu.csv").read_text()
    (gpu,), other = parse_health_csv(text)
    assert other == ["exit=0"]  # the capture's own exit line is not a GPU
    assert (gpu.power_draw_w, gpu.power_limit_w, gpu.power_min_w, gpu.power_max_w) == (78.77, 700.0, 200.0, 700.0)
    assert (gpu.pcie_gen, gpu.pcie_gen_max, gpu.pcie_width, gpu.pcie_width_max) == (5, 5, 16, 16)
    assert (gpu.temperature_c, gpu.persistence, gpu.clock_reasons) == (36.0, True, ("gpu_idle",))
    (legacy,), _ = parse_health_csv(text.replace("clocks_event_reasons.", "clocks_throttle_reasons."))
    assert legacy == gpu


def test_pci_addresses_of_nvidia_smi_and_of_xid_lines_name_the_same_gpu():
    assert pci_key("00000000:9B:00.0") == pci_key("PCI:0000:9b:00") == pci_key("0000:9b:00") == (0, 0x9B, 0)
    assert pci_key("00000000:00:06.0") != pci_key("0000:00:07") and pci_key("garbage") is None


def test_xid_lines_of_both_formats_and_a_gpu_lost_without_an_xid():
    events = parse_kernel_log(
        [
            "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s",
            "[  812.443210] NVRM: Xid (0000:03:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)",
            "Dec 03 11:40:02 rig1 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
            "Dec 03 11:40:02 rig1 kernel: NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.",
            "Dec 03 11:41:00 rig1 kernel: NVRM: The NVIDIA GPU 0000:b3:00.0",
            "Dec 03 11:41:00 rig1 kernel: NVRM: fallen off the bus and is not responding to commands.",
        ]
    )
    assert [(e.address, e.code) for e in events] == [
        ("0000:9b:00", 119),
        ("0000:03:00", 13),
        ("0000:2b:00", 79),
        ("0000:b3:00.0", 79),
    ]
    assert events[0].text.startswith("pid=2024380") and parse_kernel_log([]) == []


def test_enforced_power_limits_of_the_captured_status_section_and_of_a_card_without_one():
    text = (GPU_CHECK / "status-run-status-gpu-section-idle.txt").read_text()
    assert enforced_power_limits(text) == [700.0]
    two = "index, enforced.power.limit [W]\n1, 260.00 W\n0, [N/A]\n"  # hand-written: rows out of order, one [N/A]
    assert enforced_power_limits(two) == [None, 260.0]
