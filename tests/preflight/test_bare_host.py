"""The bare-host gate (rigkit.preflight.bare_host_preflight): what the preflight role refuses before any role
changes the rig. nvidia-smi outputs are real (2x H200); the PCI counts are what that host's bus shows (2)."""

import subprocess
from dataclasses import replace

import pytest

from rigkit.errors import PreflightError
from rigkit.facts.nvidia import NvidiaPciGpus, nvidia_pci_gpus_command
from rigkit.preflight import Finding, HostFacts, bare_host_preflight, preflight, refusals
from rigkit.preflight.gpus import check_gpus_before_driver
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.sizing import GB, GIB
from tests.preflight import common
from tests.preflight.common import BUSY, IDLE, LMCACHE, MIB

CPU_LAB = {**common.CPU_LAB, "serving_port": 8104}


def bare(**changes) -> HostFacts:
    """A bare host: no engine, no compose, no image (none of which this gate may read)."""
    base = dict(
        meminfo={"MemAvailable": 200 * GB, "MemTotal": 256 * GB},
        host_shm_bytes=128 * 2**30,
        l2_free_bytes=None,
        gpu_memory_csv=None,
        has_engine=False,
        compose_command=None,
        image_present=False,
        port_listeners=[],
    )
    return HostFacts(**{**base, **changes})


def run(data, pci=2, declared=2, **fact_changes):
    return bare_host_preflight(settings_for_host(data, variables=[]), bare(**fact_changes), pci, declared)


def only(findings, check) -> Finding:
    (found,) = [f for f in findings if f.check == check]
    return found


def test_a_fresh_gpu_host_passes_without_engine_driver_or_l2_disk():
    findings = run({**LMCACHE, "l2_enabled": True})
    assert refusals(findings) == []
    assert {f.check for f in findings} == {"ram", "host-shm", "l2", "gpu", "port"}  # nothing needs the engine
    assert "not mounted yet" in only(findings, "l2").message
    assert "nvidia_driver role" in only(findings, "gpu").message
    # the serving gate on the same host refuses the missing engine: that check belongs there, not here
    full = preflight(settings_for_host(LMCACHE, variables=[]), bare(gpu_memory_csv=IDLE))
    assert [f.field for f in refusals(full)] == ["docker"]


def test_ram_gate_refuses_before_anything_changes_even_forced():
    for force in (False, True):
        ram = only(
            refusals(run({**LMCACHE, "force": force}, meminfo={"MemAvailable": 80 * GIB, "MemTotal": 256 * GB})), "ram"
        )
        assert ram.field == "l1_size_gb" and ram.value == 60 and "at most 52" in ram.fix


def test_rig_shm_too_small_for_the_engine():
    shm = only(refusals(run(CPU_LAB, pci=0, declared=0, host_shm_bytes=64 * 2**20)), "host-shm")
    assert shm.field == "/dev/shm" and shm.value == "64 MiB" and "remount" in shm.fix


def test_foreign_listener_on_the_serving_port_refused_rigkits_own_stack_is_not():
    stack = "c" * 64
    ours = {"pid": 900, "containers": [stack], "command": "python3"}
    foreign = {"pid": 4242, "containers": [], "command": "python3"}
    port = only(refusals(run(CPU_LAB, pci=0, declared=0, port_listeners=[foreign])), "port")
    assert port.field == "serving_port" and port.value == 8104 and "pid 4242 (python3)" in port.message
    assert refusals(run(CPU_LAB, pci=0, declared=0, port_listeners=[ours], stack_container_ids=(stack[:12],))) == []


def test_gpu_profile_on_a_host_without_nvidia_gpus_refused_even_forced():
    for force in (False, True):
        gpu = only(refusals(run({**LMCACHE, "force": force}, pci=0, declared=1)), "gpu")
        assert gpu.field == "serving_profile" and "but the rig reports none" in gpu.message
        assert "cpu-lab" in gpu.fix


def test_fewer_gpus_on_the_bus_than_the_profile_needs():
    # every shipped GPU profile needs one GPU: a four-GPU variant of lmcache-mp stands in for a bigger one
    settings = settings_for_host(LMCACHE, variables=[])
    profile = settings.profile.model_copy(
        update={"resources": settings.profile.resources.model_copy(update={"gpus": 4})}
    )
    findings = bare_host_preflight(replace(settings, profile=profile), bare(), nvidia_pci_gpus=2, declared_gpus=4)
    gpu = only(refusals(findings), "gpu")
    assert gpu.field == "serving_profile" and "needs 4 GPU(s); the rig's PCI bus shows 2" in gpu.message


def test_gpus_on_the_bus_but_declared_zero_the_driver_role_would_skip_them():
    gpu = only(refusals(run(LMCACHE, pci=2, declared=0)), "gpu")
    assert gpu.field == "gpus" and gpu.value == 0 and "set gpus: 2" in gpu.fix


def test_gpu_memory_checked_where_nvidia_smi_answers():
    below_the_gate = {**LMCACHE, "gpu_memory_utilization": 0.7}  # vLLM would start: only rigkit's gate refuses
    gpu = only(refusals(run(below_the_gate, gpu_memory_csv=BUSY)), "gpu")
    assert gpu.field == "gpu_free_fraction_min" and "GPU 0" in gpu.message
    assert refusals(run({**below_the_gate, "force": True}, gpu_memory_csv=BUSY)) == []  # forceable, as in serving
    assert refusals(run(LMCACHE, gpu_memory_csv=IDLE)) == []
    # unset, vLLM's default 0.92 needs 92% free: not forceable here either
    gpu = only(refusals(run({**LMCACHE, "force": True}, gpu_memory_csv=BUSY)), "gpu")
    assert gpu.field == "gpu_memory_utilization" and not gpu.forceable


def test_cpu_profile_needs_no_gpu_anywhere():
    assert only(run(CPU_LAB, pci=0, declared=0), "gpu").level == "ok"


@pytest.mark.parametrize("free_gb, level", [(None, "ok"), (39, "refuse"), (900, "ok")])
def test_l2_free_space_only_once_mounted(free_gb, level):
    data = {**LMCACHE, "l2_enabled": True, "l2_budget_gb": 40}
    l2 = only(run(data, l2_free_bytes=None if free_gb is None else free_gb * GB), "l2")
    assert l2.level == level
    if level == "refuse":
        assert l2.field == "l2_budget_gb" and "at most 39" in l2.fix


def test_a_refusal_raised_elsewhere_keeps_field_value_and_fix():
    error = PreflightError("l2_device", "/dev/disk/by-id/nvme-typo", "no block device at this path", "set l2_device")
    finding = Finding.refused_by("l2-device", error)
    assert (finding.level, finding.field, finding.value, finding.fix) == (
        "refuse",
        "l2_device",
        "/dev/disk/by-id/nvme-typo",
        "set l2_device",
    )
    assert str(finding) == "[refuse] l2-device: no block device at this path. Fix: set l2_device"


def test_ram_gate_without_l1_names_the_reserve():
    # cpu-lab has no L1 tier: "set l1_size_gb to at most 0" would be no fix at all
    ram = only(refusals(run(CPU_LAB, pci=0, declared=0, meminfo={"MemAvailable": 3 * GIB, "MemTotal": 16 * GB})), "ram")
    assert ram.field == "ram_reserve_gb" and ram.value == 4 and "at most 3" in ram.fix


def test_nvidia_pci_gpu_count_reads_vendor_and_class_from_sysfs(tmp_path):
    # no NVIDIA device on this machine: a sysfs-shaped directory stands in for the bus of a 2-GPU rig
    devices = {
        "0000:17:00.0": ("0x10de", "0x030200"),  # H200 (3D controller)
        "0000:65:00.0": ("0x10de", "0x030200"),
        "0000:65:00.1": ("0x10de", "0x040300"),  # an NVIDIA audio function: not a GPU
        "0000:00:02.0": ("0x8086", "0x030000"),
    }  # Intel VGA: not NVIDIA
    for name, (vendor, pci_class) in devices.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "vendor").write_text(vendor + "\n")
        (tmp_path / name / "class").write_text(pci_class + "\n")
    out = subprocess.run(
        ["sh", "-c", nvidia_pci_gpus_command(str(tmp_path))], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert NvidiaPciGpus().process(out) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (
        subprocess.run(
            ["sh", "-c", nvidia_pci_gpus_command(str(empty))], capture_output=True, text=True, check=True
        ).stdout
        == ""
    )


def test_tensor_parallel_wider_than_the_pci_bus_is_refused():
    gpu = only(refusals(run({**LMCACHE, "tensor_parallel_size": 4}, pci=2, declared=2)), "gpu")
    assert gpu.field == "tensor_parallel_size" and "PCI bus shows 2" in gpu.message
    assert refusals(run({**LMCACHE, "tensor_parallel_size": 2}, pci=2, declared=2)) == []


# --- before the driver, word for word ---------------------------------------------------------------------------
# (nvidia-smi does not answer yet: the PCI bus and the declared gpus decide)


def with_gpus(settings, gpus: int):
    """The same settings with a profile that needs ``gpus`` GPUs (every shipped GPU profile needs one)."""
    resources = settings.profile.resources.model_copy(update={"gpus": gpus})
    return replace(settings, profile=settings.profile.model_copy(update={"resources": resources}))


BEFORE_THE_DRIVER = [
    # id, data, GPUs the profile needs, PCI GPUs, declared gpus, the finding
    (
        "no NVIDIA GPU on the bus",
        LMCACHE,
        1,
        0,
        1,
        Finding(
            "refuse",
            "gpu",
            "serving_profile",
            "lmcache-mp",
            "profile lmcache-mp needs 1 GPU(s) but the rig reports none (no nvidia-smi, no NVIDIA GPU on its PCI bus)",
            "pick a CPU profile such as cpu-lab, or a rig with GPUs",
        ),
    ),
    (
        "fewer on the bus than the profile needs",
        LMCACHE,
        4,
        2,
        4,
        Finding(
            "refuse",
            "gpu",
            "serving_profile",
            "lmcache-mp",
            "profile lmcache-mp needs 4 GPU(s); the rig's PCI bus shows 2",
            "pick a profile for fewer GPUs, or a rig with more",
        ),
    ),
    (
        "as many on the bus as the profile needs",
        LMCACHE,
        2,
        2,
        2,
        Finding(
            "ok",
            "gpu",
            "gpus",
            2,
            "2 NVIDIA GPU(s) on the PCI bus, no driver yet: their memory is checked once the nvidia_driver role "
            "installed it",
        ),
    ),
    (
        # the driver numbers the bus's GPUs 0..n-1: index 2 of a 2-GPU bus is refused before anything changes
        "gpu_mask beyond the bus",
        {**LMCACHE, "gpu_mask": "1,2"},
        1,
        2,
        2,
        Finding(
            "refuse",
            "gpu",
            "gpu_mask",
            "1,2",
            "GPU(s) [2] not on this rig (its PCI bus shows 2 NVIDIA GPU(s))",
            "fix gpu_mask for this host",
        ),
    ),
    (
        "gpu_mask on the bus",
        {**LMCACHE, "gpu_mask": "1"},
        1,
        2,
        2,
        Finding(
            "ok",
            "gpu",
            "gpus",
            2,
            "2 NVIDIA GPU(s) on the PCI bus, no driver yet: their memory is checked once the nvidia_driver role "
            "installed it",
        ),
    ),
    (
        "tensor parallelism wider than the bus",
        {**LMCACHE, "tensor_parallel_size": 4},
        1,
        2,
        2,
        Finding(
            "refuse",
            "gpu",
            "tensor_parallel_size",
            4,
            "needs 4 GPUs, one per rank, but the rig's PCI bus shows 2",
            "set tensor_parallel_size to at most 2, or give the stack more GPUs",
        ),
    ),
    (
        "declared gpus below what the profile needs",
        LMCACHE,
        1,
        2,
        0,
        Finding(
            "refuse",
            "gpu",
            "gpus",
            0,
            "the rig has 2 NVIDIA GPU(s) and no driver yet, but gpus=0 makes the driver roles skip it "
            "(profile lmcache-mp needs 1)",
            "set gpus: 2 for this host",
        ),
    ),
]


@pytest.mark.parametrize(
    "data,needed,pci,declared,expected",
    [case[1:] for case in BEFORE_THE_DRIVER],
    ids=[case[0] for case in BEFORE_THE_DRIVER],
)
def test_before_the_driver_word_for_word(data, needed, pci, declared, expected):
    settings = with_gpus(settings_for_host(data, variables=[]), needed)
    assert check_gpus_before_driver(settings, None, pci, declared) == [expected]
    assert only(bare_host_preflight(settings, bare(), pci, declared), "gpu") == expected


def test_a_gpu_count_not_given_is_zero():
    # a caller that counts neither the bus nor the declared gpus gets the refusal, not a pass
    settings = settings_for_host(LMCACHE, variables=[])
    assert only(bare_host_preflight(settings, bare()), "gpu").message.endswith(
        "(no nvidia-smi, no NVIDIA GPU on its PCI bus)"
    )
    declared = only(bare_host_preflight(settings, bare(), nvidia_pci_gpus=1), "gpu")
    assert (declared.level, declared.field, declared.value) == ("refuse", "gpus", 0)


def test_the_bare_host_gate_reads_what_is_free_in_the_rig_shm():
    full = {"free_bytes": 10 * MIB, "offload_bytes": 0}
    shm = only(run(CPU_LAB, pci=0, declared=0, host_shm_free=full), "host-shm")
    assert (shm.level, shm.value) == ("refuse", "10 MiB free")
