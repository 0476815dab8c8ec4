"""The memory gates: RAM (MemAvailable against L1 + reserve, MemTotal against the profile) and the rig's
/dev/shm."""

from __future__ import annotations

import math
from typing import Optional

from rigkit.preflight.findings import Finding, _gb, _gib
from rigkit.settings.hostdata import Settings
from rigkit.settings.sizing import GIB

# vLLM's engine message queue lives in /dev/shm (160 MiB measured on the CPU build; it died at 64 MiB free)
ENGINE_SHM_MIN_MB = 256


def check_ram(settings: Settings, meminfo: dict[str, int]) -> list[Finding]:
    """The memory knobs count GiB (rigkit.settings.sizing): MemAvailable is compared in bytes, printed in GiB."""
    knobs = settings.knobs
    available_bytes = meminfo.get("MemAvailable", 0)
    available = _gib(available_bytes)
    l1, reserve = settings.l1_gib, knobs["ram_reserve_gb"]
    needed = l1 + reserve
    findings = []
    if available_bytes < needed * GIB:
        problem = (
            f"MemAvailable {available:g} GiB < L1 {l1} + reserve {reserve} = {needed} GiB "
            "(an oversized cache once OOM'd the host; force does not override this)"
        )
        most = available_bytes // GIB
        if l1:
            # l1_size_gb takes 1 GiB at least: "at most 0" would be a fix the settings refuse
            fix = (
                f"set l1_size_gb to at most {most - reserve} (GiB) or free memory"
                if most - reserve >= 1
                else f"free memory on the rig or lower ram_reserve_gb: {most} GiB leaves no GiB for L1 beside it"
            )
            findings.append(Finding("refuse", "ram", "l1_size_gb", l1, problem, fix))
        else:  # no L1 in this profile: the reserve alone is over what the rig has free
            findings.append(
                Finding(
                    "refuse",
                    "ram",
                    "ram_reserve_gb",
                    reserve,
                    problem,
                    f"free memory on the rig or set ram_reserve_gb to at most {most} (GiB)",
                )
            )
    else:
        findings.append(
            Finding("ok", "ram", "l1_size_gb", l1, f"MemAvailable {available:g} GiB >= L1 + reserve {needed} GiB")
        )
    total = _gb(meminfo.get("MemTotal", 0))
    minimum = settings.profile.resources.min_ram_gb
    if total < minimum:
        findings.append(
            Finding(
                "refuse",
                "ram",
                "serving_profile",
                settings.profile.name,
                f"MemTotal {total:g} GB < {minimum} GB that profile {settings.profile.name} needs",
                "pick a smaller profile or a bigger rig",
                forceable=True,
            )
        )
    return findings


def check_host_shm(settings: Settings, shm_bytes: Optional[int], shm_free: Optional[dict] = None) -> list[Finding]:
    """The stack runs with `ipc: host`, so its /dev/shm is the rig's own: compose's shm_size does not apply. Its size
    first, then what is FREE: stale CPU-tier segments of stopped engines fill it while its size stays the same."""
    if shm_bytes is None:
        return [
            Finding(
                "warn",
                "host-shm",
                "/dev/shm",
                None,
                "size of the rig's /dev/shm unknown",
                "check `df -h /dev/shm` on the rig",
            )
        ]
    size_mb, l1 = shm_bytes // 2**20, settings.l1_gib
    if size_mb < ENGINE_SHM_MIN_MB:
        return [
            Finding(
                "refuse",
                "host-shm",
                "/dev/shm",
                f"{size_mb} MiB",
                f"the rig's /dev/shm is {size_mb} MiB < {ENGINE_SHM_MIN_MB} MiB the engine needs "
                "(ipc: host shares it with the container)",
                f"remount /dev/shm larger on the rig (mount -o remount,size={max(l1, 1)}G /dev/shm)",
            )
        ]
    connector = settings.profile.connector
    in_shm = bool(connector and connector.l1_in_shm)
    needed_mb = l1 * 1024 * in_shm + ENGINE_SHM_MIN_MB
    if in_shm and size_mb < needed_mb:
        return [
            Finding(
                "refuse",
                "host-shm",
                "/dev/shm",
                f"{size_mb} MiB",
                f"the rig's /dev/shm is {size_mb} MiB < L1 {l1} GiB + {ENGINE_SHM_MIN_MB} MiB for the engine: "
                f"profile {settings.profile.name} keeps its CPU tier in /dev/shm and fills it at start "
                "(ipc: host shares it with the container)",
                f"remount /dev/shm with size >= {math.ceil(needed_mb / 1024)}G on the rig "
                f"(mount -o remount,size={math.ceil(needed_mb / 1024)}G /dev/shm) or lower l1_size_gb",
            )
        ]
    if shm_free is not None:
        free_mb, offload_mb = shm_free["free_bytes"] // 2**20, shm_free["offload_bytes"] // 2**20
        if free_mb + offload_mb < needed_mb:
            what = (
                f"L1 {l1} GiB + {ENGINE_SHM_MIN_MB} MiB for the engine"
                if in_shm
                else f"{ENGINE_SHM_MIN_MB} MiB the engine needs"
            )
            return [
                Finding(
                    "refuse",
                    "host-shm",
                    "/dev/shm",
                    f"{free_mb} MiB free",
                    f"the rig's /dev/shm has {free_mb} MiB free (+{offload_mb} MiB of vLLM CPU-tier segments "
                    f"the restart frees) < {what}: something else fills it",
                    "list it (ls -la /dev/shm on the rig) and remove what no running process uses"
                    + (", or lower l1_size_gb" if in_shm else ""),
                )
            ]
    if size_mb < l1 * 1024:
        return [
            Finding(
                "warn",
                "host-shm",
                "/dev/shm",
                f"{size_mb} MiB",
                f"the rig's /dev/shm {size_mb} MiB < L1 {l1} GiB (ipc: host shares it with the container)",
                f"remount /dev/shm with size >= {l1}G",
            )
        ]
    free = "" if shm_free is None else f", {shm_free['free_bytes'] // 2**20} MiB free"
    return [Finding("ok", "host-shm", "/dev/shm", f"{size_mb} MiB", f"rig /dev/shm large enough{free}")]
