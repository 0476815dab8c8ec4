"""The GPU gates: GPU memory free, gpu_mask and tensor parallelism against the rig's GPUs (nvidia-smi's, or
the PCI bus's before the driver)."""

from __future__ import annotations

import math
from typing import Optional

from rigkit.nvidia_smi import GpuMemoryReading, parse_gpu_memory
from rigkit.preflight.findings import Finding
from rigkit.settings.hostdata import Settings
from rigkit.settings.knobs import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION


def _tensor_parallel_refusal(settings: Settings, available: int, where: str) -> Optional[Finding]:
    """A refusal (never forceable) when tensor parallelism needs more GPUs than the stack gets: one per rank."""
    tensor_parallel = settings.knobs["tensor_parallel_size"]
    if tensor_parallel <= available:
        return None
    return Finding(
        "refuse",
        "gpu",
        "tensor_parallel_size",
        tensor_parallel,
        f"needs {tensor_parallel} GPUs, one per rank, but {where} {available}",
        f"set tensor_parallel_size to at most {available}, or give the stack more GPUs",
    )


def _absent_gpus_refusal(settings: Settings, absent: list[int], what_the_rig_has: str) -> list[Finding]:
    """gpu_mask selects GPUs the rig lacks: refused, whatever force says."""
    if not absent:
        return []
    return [
        Finding(
            "refuse",
            "gpu",
            "gpu_mask",
            settings.knobs["gpu_mask"],
            f"GPU(s) {absent} not on this rig ({what_the_rig_has})",
            "fix gpu_mask for this host",
        )
    ]


def check_gpus(settings: Settings, gpu_memory_csv: Optional[str]) -> list[Finding]:
    profile = settings.profile
    if not profile.needs_gpus:
        return [Finding("ok", "gpu", "serving_profile", profile.name, "profile needs no GPUs: skipped")]
    gpus: list[GpuMemoryReading] = parse_gpu_memory(gpu_memory_csv) if gpu_memory_csv else []
    if not gpus:
        return [
            Finding(
                "refuse",
                "gpu",
                "serving_profile",
                profile.name,
                f"profile {profile.name} needs {profile.resources.gpus} GPU(s) but the rig reports none",
                "install the NVIDIA driver (the driver role) or pick a CPU profile such as cpu-lab",
            )
        ]
    by_index = {gpu.index: gpu for gpu in gpus}
    selected = settings.gpu_ids or sorted(by_index)
    absent = [index for index in selected if index not in by_index]
    if absent:
        return _absent_gpus_refusal(settings, absent, f"it has {sorted(by_index)}")
    if len(selected) < profile.resources.gpus:
        return [
            Finding(
                "refuse",
                "gpu",
                "serving_profile",
                profile.name,
                f"{len(selected)} GPU(s) selected, profile needs {profile.resources.gpus}",
                "select more GPUs or pick another profile",
            )
        ]
    # a gpu_mask narrower than tensor_parallel_size never gets here: the settings refuse it (hostdata)
    too_wide = _tensor_parallel_refusal(settings, len(selected), "the rig has")
    if too_wide:
        return [too_wide]
    minimum = settings.knobs["gpu_free_fraction_min"]
    # vLLM itself refuses to start when a GPU has less free than gpu_memory_utilization of its memory
    # (vllm/v1/worker/utils.py request_memory, 0.26), its own default when unset: a bar no force can lower
    asked = settings.knobs["gpu_memory_utilization"]
    utilization = VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if asked is None else asked
    # at equality the bar is vLLM's too: below it the engine would not start, whatever force says
    engine_bar = utilization >= minimum
    field, minimum = ("gpu_memory_utilization", utilization) if engine_bar else ("gpu_free_fraction_min", minimum)
    unset_note = f" (gpu_memory_utilization unset: vLLM's default {utilization})" if asked is None else ""
    findings = []
    for index in selected:
        gpu = by_index[index]
        if gpu.free_fraction < minimum:
            fix = f"stop what holds GPU {index} (nvidia-smi shows it) or exclude it via gpu_mask"
            findings.append(
                Finding(
                    "refuse",
                    "gpu",
                    field,
                    minimum,
                    f"GPU {index} has {gpu.free_fraction:.1%} free ({gpu.free_mib} of {gpu.total_mib} MiB) "
                    f"< {minimum:.0%}" + (f" (vLLM would not start){unset_note}" if engine_bar else ""),
                    fix
                    + (
                        f", or {'set' if asked is None else 'lower'} gpu_memory_utilization to at most "
                        f"{math.floor(gpu.free_fraction * 100) / 100:.2f}"
                        if engine_bar
                        else ""
                    ),
                    forceable=not engine_bar,
                )
            )
        else:
            findings.append(Finding("ok", "gpu", "gpu_mask", index, f"GPU {index} {gpu.free_fraction:.1%} free"))
    return findings


def check_gpus_before_driver(
    settings: Settings, gpu_memory_csv: Optional[str], nvidia_pci_gpus: int, declared_gpus: int
) -> list[Finding]:
    """Before the nvidia_driver role: where nvidia-smi answers, ``check_gpus``; without it (``gpu_memory_csv``
    None) the PCI bus must show the GPUs the profile needs and those gpu_mask selects, and ``gpus`` must let the
    driver role install."""
    profile = settings.profile
    if not profile.needs_gpus or gpu_memory_csv is not None:
        return check_gpus(settings, gpu_memory_csv)
    needed = profile.resources.gpus
    if nvidia_pci_gpus == 0:
        return [
            Finding(
                "refuse",
                "gpu",
                "serving_profile",
                profile.name,
                f"profile {profile.name} needs {needed} GPU(s) but the rig reports none "
                "(no nvidia-smi, no NVIDIA GPU on its PCI bus)",
                "pick a CPU profile such as cpu-lab, or a rig with GPUs",
            )
        ]
    if nvidia_pci_gpus < needed:
        return [
            Finding(
                "refuse",
                "gpu",
                "serving_profile",
                profile.name,
                f"profile {profile.name} needs {needed} GPU(s); the rig's PCI bus shows {nvidia_pci_gpus}",
                "pick a profile for fewer GPUs, or a rig with more",
            )
        ]
    # the driver numbers the bus's GPUs 0..n-1: a gpu_mask beyond them is refused now, not once the driver is in
    absent = [index for index in settings.gpu_ids if index >= nvidia_pci_gpus]
    if absent:
        return _absent_gpus_refusal(settings, absent, f"its PCI bus shows {nvidia_pci_gpus} NVIDIA GPU(s)")
    # every GPU the stack gets is on the bus now: tensor parallelism needs no more than the bus shows
    too_wide = _tensor_parallel_refusal(settings, nvidia_pci_gpus, "the rig's PCI bus shows")
    if too_wide:
        return [too_wide]
    if declared_gpus < needed:
        return [
            Finding(
                "refuse",
                "gpu",
                "gpus",
                declared_gpus,
                f"the rig has {nvidia_pci_gpus} NVIDIA GPU(s) and no driver yet, but gpus={declared_gpus} "
                f"makes the driver roles skip it (profile {profile.name} needs {needed})",
                f"set gpus: {nvidia_pci_gpus} for this host",
            )
        ]
    return [
        Finding(
            "ok",
            "gpu",
            "gpus",
            declared_gpus,
            f"{nvidia_pci_gpus} NVIDIA GPU(s) on the PCI bus, no driver yet: "
            "their memory is checked once the nvidia_driver role installed it",
        )
    ]
