"""The status table, fit to a terminal, and each rig's details under it."""

from __future__ import annotations

from typing import Optional, Sequence

from rigkit.serving.ledger import short_digest
from rigkit.status.drift import for_reading
from rigkit.status.gpu import FAIL, NO_TOOLING
from rigkit.status.rig import OK, RigStatus

TABLE_WIDTH = 100
REVISION_SHOWN = 12  # characters of a pinned revision (a hub commit, a manifest hash) in the table
LAST_COLUMN_MIN = 16


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def fit_table(rows: Sequence[Sequence[str]], width: int = TABLE_WIDTH, gap: int = 2) -> list[str]:
    """Rows as aligned lines no longer than ``width``: the last column (the one the details repeat in full)
    gives up characters first, down to LAST_COLUMN_MIN, then the widest others."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    floor = [min(w, max(len(rows[0][i]), 4)) for i, w in enumerate(widths)]
    floor[-1] = min(widths[-1], max(floor[-1], LAST_COLUMN_MIN))
    while sum(widths) + gap * (len(widths) - 1) > width and widths != floor:
        if widths[-1] > floor[-1]:
            widths[-1] -= 1
            continue
        i = max(range(len(widths)), key=lambda k: widths[k] - floor[k])
        widths[i] -= 1
    return [
        (" " * gap).join(_cut(cell, widths[i]).ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    ]


def _digest(image: Optional[str]) -> str:
    return short_digest(image) if image else "-"


def _release_cell(ledger: Optional[dict]) -> str:
    if not ledger:
        return "-"
    if "error" in ledger:
        return "unreadable"
    when = (ledger.get("deployed_at") or "")[5:16].replace("T", " ")
    return f"{ledger['kind']} {ledger.get('smoke') or '-'} {when}".strip()


def _l2_cell(l2: Optional[dict]) -> str:
    if not l2:
        return "-"
    if l2.get("store_bytes") is None:
        return l2["state"]
    used = f"{100 * l2['store_bytes'] / l2['budget_bytes']:.0f}%"
    return used if l2["state"] == "ok" else f"{used} {l2['state']}"


def _model_cell(model: Optional[dict]) -> str:
    """The pinned revision, short, and whether the staged copy matches it."""
    if not model:
        return "-"
    return f"{model['revision'][:REVISION_SHOWN]} {model['staged']}"


def model_line(model: Optional[dict]) -> Optional[str]:
    """The details' model line: the whole pin and its staged copy."""
    if not model:
        return None
    line = f"model {model['source']} ({model['kind']}): staged copy {model['staged']}"
    return line + (f" ({', '.join(model['damaged'])})" if model["damaged"] else "")


def _gpu_cell(status: RigStatus) -> str:
    """The rig's GPUs in a few characters: how many, the hottest, power drawn of the enforced limits."""
    gpu = status.gpu
    if gpu is None:
        return "?"
    if not gpu["tooling"]:
        return "no nvidia-smi" if gpu["findings"] else NO_TOOLING
    if gpu["query_error"]:
        return "nvidia-smi failed"
    gpus = gpu["gpus"]
    temps = [g["temperature_c"] for g in gpus if g["temperature_c"] is not None]
    draw = [g["power_draw_w"] for g in gpus if g["power_draw_w"] is not None]
    limit = [g["power_limit_w"] for g in gpus if g["power_limit_w"] is not None]
    cell = f"{len(gpus)}x"
    if temps:
        cell += f" {max(temps):.0f}C"
    if draw and limit:
        cell += f" {sum(draw):.0f}/{sum(limit):.0f}W"
    return cell


def _number(value, unit: str, digits: int = 0) -> str:
    return "?" if value is None else f"{value:.{digits}f}{unit}"


def gpu_lines(status: RigStatus) -> list[str]:
    """The details' GPU lines: driver, CUDA and where Xids were read, then one line per GPU with every figure."""
    gpu = status.gpu
    if not gpu or not gpu["tooling"] or gpu["query_error"]:
        return []
    log = gpu["kernel_log"] or {}
    xids = sum(x["count"] for x in gpu["xids"])
    lines = [
        f"gpu driver {status.driver or '?'}, CUDA {status.cuda or '?'}; Xids since boot: {xids}, read from "
        f"{log.get('what', '?')}"
    ]
    for g in gpu["gpus"]:
        reasons = ", ".join(g["clock_reasons"]) if g["clock_reasons"] is not None else "?"
        ecc = (
            "ECC not reported"
            if g["ecc_corrected_volatile"] is None
            else f"ECC {g['ecc_corrected_volatile']} corrected, {g['ecc_uncorrected_volatile']} uncorrected"
        )
        persistence = {True: "on", False: "off", None: "?"}[g["persistence"]]
        lines.append(
            f"GPU{g['index']} {' '.join(filter(None, (g['name'], g['bus_id'])))}: {g['state']}; "
            f"{_number(g['temperature_c'], ' °C')}, {_number(g['power_draw_w'], '')}/"
            f"{_number(g['power_limit_w'], ' W')}, PCIe Gen{g['pcie_gen'] or '?'} x{g['pcie_width'] or '?'} "
            f"(max Gen{g['pcie_gen_max'] or '?'} x{g['pcie_width_max'] or '?'}), VRAM "
            f"{_number(g['memory_used_mib'], '')}/{_number(g['memory_total_mib'], ' MiB')}, {ecc}, clock reasons: "
            f"{reasons or 'none'}, persistence {persistence}"
        )
    return lines


def _problems_cell(status: RigStatus) -> str:
    """What is wrong, shortest first: unhealthy parts, then the knobs that drifted (details name them all)."""
    if not status.reachable:
        return " ".join(status.error.split())
    bad = [f"{what} down" for what, text in status.health.items() if not text.startswith("ok")]
    if status.l2 and status.l2["level"] == "fail":
        bad.append(f"L2 {status.l2['state']}")
    knobs = [d.knob for d in for_reading(status.drift)]
    findings = sorted((status.gpu or {}).get("findings", []), key=lambda f: f["level"] != FAIL)
    gpus = [f"{f['gpu']} {f['short']}" for f in findings]
    return ", ".join(bad + gpus + knobs) or "-"


DRIFT_LEGEND = (
    "drift: the rig against what today's data renders (the inventory, group_data and --data of this "
    "run: what the next deploy would put on the rig)"
)


def format_report(statuses: Sequence[RigStatus], width: int = TABLE_WIDTH) -> str:
    """The table (at most ``width`` columns), then each rig's details: every drift, problem and warning."""
    # the model column only where a rig pins one (model_source): a table of rigs without one keeps its width
    with_model = any(s.model for s in statuses)
    header = ("rig", "state", "image", "last release", *(("model",) if with_model else ()), "gpu", "L2", "what")
    rows = [header] + [
        (
            s.rig,
            s.state,
            _digest(s.image),
            _release_cell(s.ledger),
            *((_model_cell(s.model),) if with_model else ()),
            _gpu_cell(s),
            _l2_cell(s.l2),
            _problems_cell(s),
        )
        for s in statuses
    ]
    lines = fit_table(rows, width)
    if any(status.drift for status in statuses):
        lines.append(DRIFT_LEGEND)
    for status in statuses:
        details = [f"unreachable: {status.error}"] if not status.reachable else []
        details += [line for line in [model_line(status.model)] if line]
        details += [f"drift {d.line()}" for d in for_reading(status.drift)]
        details += [f"unhealthy {problem}" for problem in status.unhealthy]
        details += [f"warning {warning}" for warning in status.warnings]
        details += gpu_lines(status)
        if status.ledger and status.ledger.get("note") and status.state != OK:
            details.append(f"last release note: {status.ledger['note']}")
        if details:
            lines.append(f"{status.rig}:")
            lines += [f"  {line}" for line in details]
    bad = [s.rig for s in statuses if s.state != OK]
    lines.append(
        f"{len(statuses) - len(bad)} of {len(statuses)} rigs ok" + (f"; not ok: {', '.join(bad)}" if bad else "")
    )
    return "\n".join(lines)


def exit_status(statuses: Sequence[RigStatus]) -> int:
    """`rigkit status`'s exit status: 0 when every rig is reachable, healthy and without drift, else 1."""
    return 0 if all(s.state == OK for s in statuses) else 1
