"""rigkit.l2_state, the L2 tier's state: the probe command (run here for real on a small tmpfs), its parser, and the
classification of the L2 state from numbers (full, low, janitor down, over budget, unknown, ok)."""

import json
import os
import subprocess

import pytest

from rigkit.files import l2_janitor
from rigkit.l2_state import (
    L2_JANITOR_STALE_S,
    L2_OVER_BUDGET_TOLERANCE,
    L2Probe,
    classify_l2,
    l2_probe_command,
    parse_l2_probe,
    read_l2,
)
from rigkit.settings.hostdata import settings_for_host
from rigkit.validation.card import fmt_l2

MB = 10**6
UNIT = "rigkit-l2-janitor.service"
PATH = "/mnt/rigkit-l2/lmcache"
FLOOR = 256 * MB
BUDGET = 500 * MB
NOW = 1_800_000_000.0


def probe(free: int, store: int, janitor: str = "active", status: dict | None = None, size: int = 2000 * MB) -> L2Probe:
    if status is None:
        status = {"state": l2_janitor.STATE_OK, "updated_at": NOW - 1, "evicted_entries": 0, "evicted_bytes": 0}
    return L2Probe(
        mount="/mnt/rigkit-l2",
        fs_size_bytes=size,
        fs_free_bytes=free,
        store_bytes=store,
        janitor=janitor,
        now=NOW,
        janitor_status=status,
    )


def classify(p: L2Probe, janitor_unit: str | None = UNIT):
    return classify_l2(p, PATH, BUDGET, FLOOR, janitor_unit)


def test_plenty_of_room_is_ok():
    report = classify(probe(free=1500 * MB, store=100 * MB))
    assert (report.state, report.level, report.problems) == ("ok", "ok", [])


def test_free_below_the_floor_is_full_and_fails_with_the_fix():
    status = {
        "state": l2_janitor.STATE_BELOW_FLOOR,
        "updated_at": NOW - 1,
        "evicted_entries": 7,
        "evicted_bytes": 24 * MB,
        "last_eviction": {"reason": "free 120.0 MB below the floor"},
    }
    report = classify(probe(free=120 * MB, store=0, status=status))
    assert (report.state, report.level) == ("full", "fail")
    assert "free space on /mnt/rigkit-l2 or lower l2_budget_gb" in report.problems[0]
    assert "120.0 MB free, below the floor 256.0 MB" in report.problems[0]
    assert "something else fills the disk" in report.problems[0]
    assert (report.evicted_entries, report.evicted_bytes) == (7, 24 * MB)
    assert report.last_eviction_reason == "free 120.0 MB below the floor"


def test_full_without_a_janitor_still_fails():
    report = classify(probe(free=FLOOR - 1, store=300 * MB, janitor="inactive"), janitor_unit=None)
    assert (report.state, report.level, report.janitor) == ("full", "fail", None)
    assert "the store holds 300.0 MB" in report.problems[0]


def test_headroom_smaller_than_the_budget_allows_is_low_with_the_budget_that_fits():
    report = classify(probe(free=FLOOR + 50 * MB, store=100 * MB))
    assert (report.state, report.level) == ("low", "warn")
    assert "lower l2_budget_gb to at most 0.15" in report.problems[0]  # store 100 MB + 50 MB headroom


def test_store_at_its_budget_with_the_floor_met_is_ok():
    assert classify(probe(free=FLOOR, store=BUDGET)).state == "ok"


def test_janitor_not_running_fails_when_the_connector_needs_it():
    report = classify(probe(free=1500 * MB, store=10 * MB, janitor="failed"))
    assert (report.state, report.level) == ("janitor-down", "fail")
    assert "run deploy.py" in report.problems[0]
    assert classify(probe(free=1500 * MB, store=10 * MB, janitor="inactive"), janitor_unit=None).level == "ok"


def test_janitor_that_refuses_its_store_fails_with_its_reason():
    status = {"state": l2_janitor.STATE_REFUSED, "updated_at": NOW, "message": "/mnt/rigkit-l2 is a mount point"}
    report = classify(probe(free=1500 * MB, store=10 * MB, status=status))
    assert report.level == "fail" and "/mnt/rigkit-l2 is a mount point" in report.problems[0]


def test_stale_janitor_status_is_a_warning():
    status = {"state": l2_janitor.STATE_OK, "updated_at": NOW - L2_JANITOR_STALE_S - 1}
    report = classify(probe(free=1500 * MB, store=10 * MB, status=status))
    assert (report.state, report.level) == ("janitor-down", "warn") and "stuck" in report.problems[0]


def test_store_over_budget_beyond_one_janitor_round_warns():
    over = int(BUDGET * (1 + 2 * L2_OVER_BUDGET_TOLERANCE))
    report = classify(probe(free=1500 * MB, store=over))
    assert (report.state, report.level) == ("over-budget", "warn")
    assert classify(probe(free=1500 * MB, store=BUDGET + 1)).state == "ok"


def test_unreadable_numbers_are_unknown_not_ok():
    report = classify(parse_l2_probe(""), janitor_unit=None)
    assert (report.state, report.level) == ("unknown", "warn")


def test_the_worst_state_names_the_report():
    report = classify(probe(free=100 * MB, store=0, janitor="inactive"))
    assert (report.state, report.level) == ("full", "fail") and len(report.problems) == 2


def test_parser_reads_numbers_and_the_janitor_status():
    status = {"state": "ok", "evicted_entries": 3}
    text = (
        f"mount=/mnt/rigkit-l2\nfs_size=2040373248\nfs_free=1916182528\nstore_bytes=8352\njanitor=active\n"
        f"now=1796069692\njanitor_status={json.dumps(status)}\n"
    )
    assert parse_l2_probe(text) == L2Probe(
        "/mnt/rigkit-l2", 2040373248, 1916182528, 8352, "active", 1796069692.0, status
    )
    broken = parse_l2_probe("fs_free=\njanitor_status={not json\nstore_bytes=12x\n")
    assert (broken.fs_free_bytes, broken.janitor_status, broken.store_bytes) == (None, None, None)


@pytest.fixture
def small_fs(tmp_path):
    """A real 4 MiB tmpfs standing in for the L2 filesystem (mounting needs root)."""
    mount = tmp_path / "l2"
    mount.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def local_shell(command: str) -> str | None:
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


def test_read_l2_of_the_cpu_lab_stack_uses_its_budget_the_janitor_floor_and_unit(small_fs):
    store = small_fs / "kv"
    store.mkdir()
    stack = settings_for_host(
        {
            "serving_profile": "cpu-lab",
            "serving_port": 8104,
            "l2_path": str(store),
            "serving_image": "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64,
        }
    )
    report = read_l2(local_shell, stack)
    assert report.budget_bytes == int(stack.knobs["l2_budget_gb"] * 10**9)
    assert report.min_free_bytes == 256 * 2**20 > report.fs_free_bytes  # a 4 MiB disk is under the janitor's floor
    assert (report.state, report.level) == ("full", "fail")
    assert report.janitor != "active"  # no janitor runs here, and cpu-lab's connector needs one
    assert any(problem.startswith("L2 janitor rigkit-l2-janitor.service is") for problem in report.problems)


def test_probe_command_reads_a_real_filesystem_and_status_file(small_fs, tmp_path):
    mount = small_fs
    store = mount / "kv"
    store.mkdir()
    (store / "entry").write_bytes(b"\1" * 100_000)
    subprocess.run(["fallocate", "-l", str(3 * 2**20), str(mount / "foreign.bin")], check=True)
    status_file = tmp_path / "status.json"
    status_file.write_text(json.dumps({"state": l2_janitor.STATE_BELOW_FLOOR, "evicted_entries": 2}))
    output = subprocess.run(
        ["sh", "-c", l2_probe_command(str(store), UNIT, str(status_file))], capture_output=True, text=True, check=True
    ).stdout
    parsed = parse_l2_probe(output)
    assert parsed.mount == str(mount) and parsed.fs_size_bytes == 4 * 2**20
    assert parsed.fs_free_bytes < 2**20 and parsed.store_bytes >= 100_000
    assert parsed.janitor_status["state"] == l2_janitor.STATE_BELOW_FLOOR and parsed.now > 0
    report = classify_l2(parsed, str(store), budget_bytes=2**20, min_free_bytes=2**20, janitor_unit=None)
    assert (report.state, report.level) == ("full", "fail") and f"free space on {mount}" in report.problems[0]
    assert fmt_l2(report).endswith("FULL ✗")


def test_l2_probe_splits_at_newlines_only():
    assert parse_l2_probe("mount=/mnt/a\u2028b\nfs_free=5\n").mount == "/mnt/a\u2028b"


def skip_off_root(path) -> None:
    if os.stat(path).st_dev != os.stat("/").st_dev:
        pytest.skip(f"{path} is not on the root filesystem here")


def test_a_shared_store_on_the_root_filesystem_means_the_export_is_unmounted(small_fs, tmp_path):
    """The probe run for real: a store on a mounted filesystem (the export) is fine; the same store once the export is
    unmounted (its mount point a plain directory on "/") fails first, with the fix. A store of the rig's own may sit
    on "/"."""
    mounted, unmounted = small_fs / "kv", tmp_path / "kv-share" / "kv"
    for store in (mounted, unmounted):
        store.mkdir(parents=True)

    def report(store, shared=True):
        output = subprocess.run(["sh", "-c", l2_probe_command(str(store), UNIT, "/nonexistent")], capture_output=True)
        parsed = parse_l2_probe(output.stdout.decode())
        return classify_l2(parsed, str(store), BUDGET, 0, janitor_unit=None, shared=shared)

    assert report(mounted).state != "export-unmounted"
    skip_off_root(tmp_path)
    failed = report(unmounted)
    assert (failed.state, failed.level) == ("export-unmounted", "fail")
    assert failed.problems[0].startswith(f"shared KV export not mounted: the store {unmounted} is on the rig's root")
    assert "mount the export again" in failed.problems[0]
    assert report(unmounted, shared=False).state != "export-unmounted"


def test_read_l2_of_a_shared_cpu_lab_stack_whose_export_is_a_plain_directory_on_root(tmp_path):
    mount_point = tmp_path / "kv-share"  # never mounted: the export as it is once unmounted
    (mount_point / "kv").mkdir(parents=True)
    stack = settings_for_host(
        {
            "serving_profile": "cpu-lab",
            "serving_port": 8104,
            "serving_image": "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64,
            "kv_share": True,
            "kv_share_source": "nas:/export/rigkit-kv",
            "kv_share_mount_point": str(mount_point),
        }
    )
    skip_off_root(tmp_path)
    report = read_l2(local_shell, stack)
    assert (report.path, report.state, report.level) == (str(mount_point / "kv"), "export-unmounted", "fail")


def test_a_shared_store_whose_directory_is_gone_is_judged_on_the_filesystem_below_it(small_fs, tmp_path):
    """Unmounted, an export leaves its mount point empty: no store directory. The probe reads the nearest existing
    parent's filesystem (here "/"), so the unmounted export still shows, and the store itself is unknown."""
    skip_off_root(tmp_path)
    gone = tmp_path / "kv-share" / "kv"
    output = subprocess.run(["sh", "-c", l2_probe_command(str(gone), UNIT, "/x")], capture_output=True, check=True)
    parsed = parse_l2_probe(output.stdout.decode())
    assert parsed.mount == "/", parsed
    assert parsed.fs_free_bytes is not None and parsed.store_bytes is None
    report = classify_l2(parsed, str(gone), BUDGET, 0, janitor_unit=None, shared=True)
    assert (report.state, report.level) == ("export-unmounted", "fail")
    assert any(problem.startswith(f"L2 state of {gone} unknown") for problem in report.problems)
    inside = parse_l2_probe(
        subprocess.run(
            ["sh", "-c", l2_probe_command(str(small_fs / "no" / "kv"), UNIT, "/x")], capture_output=True
        ).stdout.decode()
    )
    assert inside.mount == str(small_fs)  # a store not made yet on a mounted export: that export's filesystem
