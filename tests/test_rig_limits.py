"""rigkit/files/rig_limits.py, the rig probe of issue 42: its parsing, its maths, and its disk half on a real
directory here (the GPU half needs torch and a GPU: bench/gpu/pays.py runs it on the device)."""

import json

import pytest

from rigkit.files import rig_limits

MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
/dev/nvme0n1p1 /mnt/rigkit-l2 xfs rw,noatime 0 0
/dev/nvme1n1 /mnt/rigkit-l2/with\\040space ext4 rw 0 0
tmpfs /dev/shm tmpfs rw 0 0
"""


def test_gpu_identity_from_nvidia_smi_csv():
    text = "0, NVIDIA H100 80GB HBM3, 5, 5, 16, 16\n1, NVIDIA GeForce RTX 3090, 3, 4, 8, 16\n2, X, [N/A], 4, 16, 16\n"
    gpus = rig_limits.parse_gpu_identity(text)
    assert gpus[0] == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "pcie_gen": 5,
        "pcie_gen_max": 5,
        "pcie_width": 16,
        "pcie_width_max": 16,
    }
    assert (gpus[1]["pcie_gen"], gpus[1]["pcie_width"]) == (3, 8)  # a 3090 in a x8 slot: the card says so
    assert gpus[2]["pcie_gen"] is None


def test_gpu_fields_are_nvidia_smis_health_names():
    from rigkit.nvidia_smi import HEALTH_FIELDS

    assert set(rig_limits.GPU_FIELDS) - {"index", "name"} <= set(HEALTH_FIELDS)


def test_mount_of_takes_the_longest_mount_point_and_unescapes():
    assert rig_limits.mount_of("/mnt/rigkit-l2/cache", MOUNTS) == ("/dev/nvme0n1p1", "xfs", "/mnt/rigkit-l2")
    assert rig_limits.mount_of("/mnt/rigkit-l2/with space/x", MOUNTS)[0] == "/dev/nvme1n1"
    assert rig_limits.mount_of("/mnt/rigkit-l2x", MOUNTS)[2] == "/"  # a prefix of a name is not a mount
    assert rig_limits.mount_of("/srv", MOUNTS) == ("/dev/vda", "ext4", "/")


def test_rate():
    assert rig_limits.rate(2_000_000_000, 0.5) == 4e9
    assert rig_limits.rate(1, 0) is None


def test_disk_half_reads_what_it_wrote_and_leaves_nothing(tmp_path, capsys):
    rig_limits.main(
        ["--l2-dir", str(tmp_path), "--file-bytes", "300000,1048576", "--threads", "1,3", "--disk-bytes", "3000000"]
    )
    out = json.loads(capsys.readouterr().out)
    assert out["disk"]["path"] == str(tmp_path)
    reads = out["disk"]["reads"]
    # every file size x thread count x read path that this filesystem allows (tmpfs refuses O_DIRECT: an error)
    assert {(r["file_bytes"], r["threads"]) for r in reads} == {(300000, 1), (300000, 3), (1048576, 1), (1048576, 3)}
    for r in reads:
        assert r["bytes"] == r["files"] * r["file_bytes"]  # each file read whole, the unaligned tail included
        assert r["bytes_per_s"] > 0
    assert {r["files"] for r in reads if r["file_bytes"] == 300000} == {10}
    assert list(tmp_path.iterdir()) == []
    assert out["gpus"] == [] or all("name" in g for g in out["gpus"])


def test_o_direct_refused_is_an_error_not_a_crash(tmp_path, monkeypatch):
    def refuse(path, o_direct, file_bytes):
        if o_direct:
            raise OSError(22, "Invalid argument")
        return file_bytes

    monkeypatch.setattr(rig_limits, "read_whole", refuse)
    errors = []
    disk = rig_limits.measure_disk(str(tmp_path), [4096], [1], 8192, [True, False], errors)
    assert [r["o_direct"] for r in disk["reads"]] == [False]
    assert errors and "O_DIRECT=True" in errors[0]


def test_gpu_half_without_torch_says_so(monkeypatch):
    def no_torch(name):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(rig_limits.importlib, "import_module", no_torch)
    errors = []
    rig_limits.measure_gpus([], 1024, 2, 1, errors)
    assert "serving image's python" in errors[0]


@pytest.mark.parametrize("text,expected", [("1,16", [1, 16]), ("4", [4]), ("1, 2,", [1, 2])])
def test_int_list(text, expected):
    assert rig_limits.int_list(text) == expected


def test_no_nvidia_smi_is_no_gpu_not_an_error(monkeypatch):
    def missing(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "nvidia-smi")

    monkeypatch.setattr(rig_limits.subprocess, "run", missing)
    errors = []
    assert rig_limits.gpu_identity(errors) == ([], "no nvidia-smi on this machine") and errors == []


def test_a_cpu_build_of_torch_is_no_gpu(monkeypatch):
    class CpuTorch:
        class cuda:
            is_available = staticmethod(lambda: False)
            device_count = staticmethod(lambda: 0)

    monkeypatch.setattr(rig_limits.importlib, "import_module", lambda name: CpuTorch)
    errors, gpus = [], []
    assert rig_limits.measure_gpus(gpus, 1024, 2, 1, errors) == "torch sees no CUDA device"
    assert errors == [] and gpus == []


def test_the_disk_half_writes_at_most_a_share_of_the_free_space(tmp_path, monkeypatch):
    real = rig_limits.os.statvfs

    class Small:
        f_frsize, f_bavail = 4096, 4 * 100  # 1.6 MB free: the probe may write 400 KB

    monkeypatch.setattr(rig_limits.os, "statvfs", lambda path: Small if path == str(tmp_path) else real(path))
    errors = []
    disk = rig_limits.measure_disk(str(tmp_path), [100_000, 1_000_000], [1], 10**9, [False], errors)
    assert disk["bytes_capped_to"] == 409_600
    assert [(r["file_bytes"], r["files"]) for r in disk["reads"]] == [(100_000, 4)]
    assert "under 1000000 bytes free to write" in errors[0]
