"""The L2 disk tier of a rig as it is now: a shell probe (df, du, the janitor's unit and status file), its output
parsed, and a verdict worst first (full, janitor-down, unknown, low, over-budget). validate.py puts it on the card,
`rigkit status` shows it."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Callable, Optional

from rigkit.files.l2_janitor import (
    L2_JANITOR_MIN_FREE_BYTES,
    L2_JANITOR_UNIT,
    STATE_BELOW_FLOOR,
    STATE_REFUSED,
    STATUS_FILE,
)
from rigkit.settings.sizing import GB
from rigkit.validation.card import L2Report, fmt_bytes

# The janitor runs every few seconds: a store this much over its budget between two rounds is normal.
L2_OVER_BUDGET_TOLERANCE = 0.05
ROOT_MOUNT = "/"
# A janitor whose status file is older than this is stuck (it writes one every round).
L2_JANITOR_STALE_S = 60.0


@dataclass
class L2Probe:
    """What the rig says about its L2 tier (l2_probe_command's output, parsed); None: not readable."""

    mount: Optional[str] = None
    fs_size_bytes: Optional[int] = None
    fs_free_bytes: Optional[int] = None
    store_bytes: Optional[int] = None
    janitor: Optional[str] = None
    now: Optional[float] = None
    janitor_status: Optional[dict] = None


def l2_probe_command(path: str, janitor_unit: str, janitor_status_file: str) -> str:
    """One shell command, run on the rig, printing key=value lines that parse_l2_probe reads."""
    quoted = shlex.quote(path)
    # df of the store, or of its nearest existing parent when it is gone (a shared export unmounted leaves no store
    # directory: the filesystem its mount point sits on is what the engine's next writes would fill)
    df = 'df -B1 --output={} -- "$l2_df" 2>/dev/null | tail -n 1'
    return "; ".join(
        [
            f'l2_df={quoted}; while [ ! -e "$l2_df" ] && [ "$l2_df" != / ]; do l2_df=$(dirname -- "$l2_df"); done',
            f'echo "mount=$({df.format("target")})"',
            f"echo \"fs_size=$({df.format('size')} | tr -d ' ')\"",
            f"echo \"fs_free=$({df.format('avail')} | tr -d ' ')\"",
            f'echo "store_bytes=$(du -sb -- {quoted} 2>/dev/null | cut -f1)"',
            f'echo "janitor=$(systemctl is-active {shlex.quote(janitor_unit)} 2>/dev/null)"',
            'echo "now=$(date +%s)"',
            f'echo "janitor_status=$(cat {shlex.quote(janitor_status_file)} 2>/dev/null)"',
        ]
    )


def parse_l2_probe(text: str) -> L2Probe:
    values = dict(line.split("=", 1) for line in text.split("\n") if "=" in line)  # as the shell wrote them

    def number(key: str) -> Optional[int]:
        value = values.get(key, "").strip()
        return int(value) if value.isdigit() else None

    try:
        status = json.loads(values.get("janitor_status", "")) or None
    except ValueError:
        status = None
    return L2Probe(
        mount=values.get("mount", "").strip() or None,
        fs_size_bytes=number("fs_size"),
        fs_free_bytes=number("fs_free"),
        store_bytes=number("store_bytes"),
        janitor=values.get("janitor", "").strip() or None,
        now=float(number("now")) if number("now") is not None else None,
        janitor_status=status if isinstance(status, dict) else None,
    )


def classify_l2(
    probe: L2Probe,
    path: str,
    budget_bytes: int,
    min_free_bytes: int,
    janitor_unit: Optional[str],
    now: Optional[float] = None,
    shared: bool = False,
) -> L2Report:
    """The L2 tier's state from the rig's numbers. janitor_unit: the unit that must keep the store under its
    budget (None when the connector evicts by itself); shared: the store lives on the shared export (kv_share).
    Worst first: export-unmounted, full, janitor-down, unknown, low, over-budget."""
    status = probe.janitor_status or {}
    mount = probe.mount or path
    found: list[tuple[str, str, str]] = []  # (state, level, problem with its fix)
    if shared and probe.mount == ROOT_MOUNT:
        # the export's mount point is a plain directory again. The running engine's container keeps its own bind of
        # the export (measured in the lab: a new entry still landed there). Its next start would bind the root disk's
        # directory instead (docker makes a missing bind source), were the directory under the mount not sealed by the
        # kv_share role (rigkit.disk): docker's mkdir there fails, and the start with it
        found.append(
            (
                "export-unmounted",
                "fail",
                f"shared KV export not mounted: the store {path} is on the rig's root filesystem: the running "
                "engine still writes to the export through its own bind; its next start (a reboot, a restart) is "
                "refused (the directory under the mount is immutable: docker cannot make the store there); mount the "
                "export again (mount -a, or `rigkit deploy`), then deploy to start a stack that stopped meanwhile",
            )
        )
    free, store = probe.fs_free_bytes, probe.store_bytes
    if free is not None and free < min_free_bytes:
        why = (
            "the store is empty: something else fills the disk"
            if status.get("state") == STATE_BELOW_FLOOR or not store
            else f"the store holds {fmt_bytes(store)}"
        )
        found.append(
            (
                "full",
                "fail",
                f"L2 full: {mount} has {fmt_bytes(free)} free, below the floor "
                f"{fmt_bytes(min_free_bytes)} ({why}): free space on {mount} or lower l2_budget_gb",
            )
        )
    if janitor_unit:
        if probe.janitor != "active":
            found.append(
                (
                    "janitor-down",
                    "fail",
                    f"L2 janitor {janitor_unit} is {probe.janitor or 'unknown'}: nothing "
                    f"keeps the store under l2_budget_gb nor {mount} above its floor: run deploy.py "
                    f"(journalctl -u {janitor_unit} says why it stopped)",
                )
            )
        elif status.get("state") == STATE_REFUSED:
            found.append(("janitor-down", "fail", f"L2 janitor refuses to work: {status.get('message')}"))
        elif not status:
            found.append(
                (
                    "unknown",
                    "warn",
                    f"L2 janitor {janitor_unit} is active but wrote no status: "
                    f"run deploy.py (an older janitor writes none)",
                )
            )
        else:
            now = probe.now if now is None else now
            age = (now - status.get("updated_at", 0)) if now is not None else 0
            if age > L2_JANITOR_STALE_S:
                found.append(
                    (
                        "janitor-down",
                        "warn",
                        f"L2 janitor {janitor_unit} last reported {age:.0f} s ago: "
                        f"it is stuck; journalctl -u {janitor_unit}, then systemctl restart {janitor_unit}",
                    )
                )
    if free is None or store is None:
        found.append(
            (
                "unknown",
                "warn",
                f"L2 state of {path} unknown (df/du read nothing on the rig): "
                "check that the path exists there (run deploy.py)",
            )
        )
    else:
        headroom, room_to_budget = free - min_free_bytes, budget_bytes - store
        if 0 <= headroom < room_to_budget:
            most = (store + headroom) / GB
            found.append(
                (
                    "low",
                    "warn",
                    f"L2 low: {mount} has {fmt_bytes(free)} free: the store ({fmt_bytes(store)}) "
                    f"can grow only {fmt_bytes(headroom)} more before the floor {fmt_bytes(min_free_bytes)}, not "
                    f"the {fmt_bytes(room_to_budget)} its budget allows: free space on {mount} or lower "
                    f"l2_budget_gb to at most {most:.3g}",
                )
            )
        if store > budget_bytes * (1 + L2_OVER_BUDGET_TOLERANCE):
            found.append(
                (
                    "over-budget",
                    "warn",
                    f"L2 store {fmt_bytes(store)} over its budget {fmt_bytes(budget_bytes)}"
                    + (
                        ": the janitor is not keeping up"
                        if janitor_unit
                        else ": the connector does not evict to l2_budget_gb; lower its own disk limit"
                    ),
                )
            )
    level = "fail" if any(f[1] == "fail" for f in found) else "warn" if found else "ok"
    last = status.get("last_eviction") or {}
    return L2Report(
        path=path,
        mount=probe.mount,
        fs_size_bytes=probe.fs_size_bytes,
        fs_free_bytes=free,
        min_free_bytes=min_free_bytes,
        store_bytes=store,
        budget_bytes=budget_bytes,
        janitor=probe.janitor if janitor_unit else None,
        janitor_state=status.get("state"),
        evicted_entries=status.get("evicted_entries", 0),
        evicted_bytes=status.get("evicted_bytes", 0),
        last_eviction_reason=last.get("reason"),
        state=next((f[0] for f in found if f[1] == level), "ok"),
        level=level,
        problems=[f[2] for f in found],
    )


def l2_probe_for(stack) -> str:
    """The L2 probe of a stack (hostdata.Settings) with an L2 tier: its path, the janitor's unit and status file."""
    return l2_probe_command(stack.knobs["l2_path"], L2_JANITOR_UNIT, STATUS_FILE)


def read_l2(shell: Callable[[str], Optional[str]], stack) -> Optional[L2Report]:
    """The L2 tier of a rig now, read through `shell` (runs a command on the rig, returns its stdout or
    None); None when the stack (hostdata.Settings) has no L2 tier."""
    if not stack.l2_active:
        return None
    path = stack.knobs["l2_path"]
    janitor_unit = L2_JANITOR_UNIT if stack.runs_l2_janitor else None
    probe = parse_l2_probe(shell(l2_probe_for(stack)) or "")
    budget = int(stack.knobs["l2_budget_gb"] * GB)
    return classify_l2(
        probe, path, budget, L2_JANITOR_MIN_FREE_BYTES, janitor_unit, shared=bool(stack.knobs["kv_share"])
    )
