"""bench/deploy_bench.py's arithmetic that runs without the lab."""

import sys

from rigkit.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

from cpu_account import CpuSpent  # noqa: E402
from deploy_bench import scaling_estimate  # noqa: E402


def test_the_scaling_estimate_is_one_rigs_wall_plus_the_added_cpu_over_the_cores(monkeypatch):
    """Run N of 2026-12-05: 1 rig 0.62 s (rigs 0.15, controller 0.47 CPU-s), 4 rigs 0.68 and 0.57 CPU-s."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    line = scaling_estimate(0.62, CpuSpent(0.47, 0.15, 1), CpuSpent(0.57, 0.68, 4), 4)
    # (0.68 + 0.57 - 0.15 - 0.47) / 2 = 0.315 s: (0.62 + 0.315) / 0.62 = 1.51x; the controller's +0.10: 1.16x
    assert "3 more rigs add 0.63 CPU-s" in line and "that is 0.32 s, ~1.51x one rig from CPU alone" in line
    assert "+0.10 CPU-s would remain: ~1.16x" in line
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert "~1.13x one rig" in scaling_estimate(0.62, CpuSpent(0.47, 0.15, 1), CpuSpent(0.57, 0.68, 4), 4)
