"""The L2 gates: free space where the L2 disk tier lives, against its budget."""

from __future__ import annotations

from typing import Optional

from rigkit.preflight.findings import Finding, _gb
from rigkit.settings.hostdata import Settings

L2_FREE_WARN_GB = 50  # below this the L2 tier holds only a few long sessions
# ... unless the declared budget is that small on purpose (the lab's 0.5 GB on a 2 GB disk): then free space under
# this many budgets is the warning (a disk that also holds other files can push the store past its floor)
L2_FREE_BUDGETS_WARN = 2


def check_l2(settings: Settings, free_bytes: Optional[int]) -> list[Finding]:
    if not settings.l2_active:
        return [Finding("ok", "l2", "l2_enabled", False, "no L2 disk tier: skipped")]
    path, budget = settings.knobs["l2_path"], settings.knobs["l2_budget_gb"]
    if free_bytes is None:
        return [
            Finding(
                "warn",
                "l2",
                "l2_path",
                path,
                f"free space under {path} unknown",
                "check that the L2 disk is mounted (the L2 disk role)",
            )
        ]
    free = _gb(free_bytes)
    if free < budget:
        return [
            Finding(
                "refuse",
                "l2",
                "l2_budget_gb",
                budget,
                f"{path} has {free:g} GB free < L2 budget {budget:g} GB",
                f"free space on {path} or set l2_budget_gb to at most {free:g}",
                forceable=True,
            )
        ]
    warn_below = min(L2_FREE_WARN_GB, L2_FREE_BUDGETS_WARN * budget)
    if free < warn_below:
        return [
            Finding(
                "warn",
                "l2",
                "l2_path",
                path,
                f"{path} has only {free:g} GB free (< {warn_below:g} GB: "
                f"{L2_FREE_WARN_GB} GB, or {L2_FREE_BUDGETS_WARN} x l2_budget_gb when that is less)",
                "use a larger disk for the L2 tier",
            )
        ]
    return [Finding("ok", "l2", "l2_path", path, f"{path} has {free:g} GB free >= budget {budget:g} GB")]


def check_l2_if_mounted(settings: Settings, free_bytes: Optional[int]) -> list[Finding]:
    """Before the l2_disk role: ``free_bytes`` None means the L2 disk is not mounted yet (serving checks it later)."""
    if free_bytes is None and settings.l2_active:
        return [
            Finding(
                "ok",
                "l2",
                "l2_path",
                settings.knobs["l2_path"],
                "L2 disk not mounted yet: its free space is checked once the l2_disk role mounted it",
            )
        ]
    return check_l2(settings, free_bytes)
