"""bench/pyinfra_timeline.py: a pyinfra run's phases and operations from its stamped output."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from pyinfra_timeline import START, Timeline, run_timed  # noqa: E402

PREPARE = "prepare (deploy imports, lock, survey, operations)"

# pyinfra 3.10's lines as a -y deploy prints them (stamps made up; the texts are the CLI's own)
RUN = Timeline(
    (
        (0.40, "--> Loading config..."),
        (0.41, "--> Loading inventory..."),
        (0.45, "--> Connecting to hosts..."),
        (0.55, "    [rig1] Connected"),
        (0.55, "--> Preparing operation files..."),
        (1.50, "--> Skipping change detection"),
        (1.50, "--> Beginning operation run..."),
        (1.50, "--> Starting operation: docker | /etc/docker "),
        (1.70, "--> Starting operation: serving | Render compose.yml "),
        (1.75, "--> Results:"),
        (1.80, "--> Disconnecting from hosts..."),
    ),
    wall_s=2.0,
    returncode=0,
)


def test_phases_cut_the_wall_time_at_pyinfras_markers():
    phases = dict(RUN.phases())
    assert list(phases) == [START, "config", "inventory", "connect", PREPARE, "execute", "results", "disconnect, exit"]
    assert abs(phases[START] - 0.40) < 1e-9 and abs(phases[PREPARE] - 0.95) < 1e-9
    assert abs(phases["execute"] - 0.25) < 1e-9 and abs(phases["disconnect, exit"] - 0.20) < 1e-9
    assert abs(sum(phases.values()) - RUN.wall_s) < 1e-9


def test_operations_last_until_the_next_one_or_the_results():
    assert [(name, round(s, 2)) for name, s in RUN.operations()] == [
        ("docker | /etc/docker", 0.2),
        ("serving | Render compose.yml", 0.05),
    ]
    assert "slowest operations: docker | /etc/docker 0.20" in RUN.summary()


def test_run_timed_stamps_each_line_as_it_arrives():
    timeline = run_timed([sys.executable, "-c", "import time; print('a'); time.sleep(1.0); print('\\x1b[1mb\\x1b[0m')"])
    (first, a), (second, b) = timeline.lines
    # apart by about the child's sleep, not stamped together at its exit (a loaded machine delays the first: 0.24 s
    # of a 0.3 s sleep was seen)
    assert (a, b) == ("a", "b") and second - first >= 0.5 and timeline.returncode == 0
