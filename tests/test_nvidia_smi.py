"""nvidia-smi parsing on real outputs captured on a 2x H200 host (tests/fixtures/nvidia-smi)."""

from pathlib import Path

import pytest

from rigkit.nvidia_smi import driver_branch, parse_csv_table, parse_driver_version, parse_gpu_memory

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
