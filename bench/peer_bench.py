"""rigkit beside the peer users would pick (Ansible), on the same lab rigs in one run; printed, never asserted.

    sudo .venv/bin/python bench/peer_bench.py [--rigs rig1,rig2,rig4,rig5] [--repeat 3] [--knob max_num_seqs=16]

The lab must be up with host-network rigs (`rigkit lab up --rigs 4 --netns-rigs 0`): the bench polls each
rig's API from here. ansible-core (pinned in bench/ansible/requirements.txt) is installed on first use into
bench/.venv-ansible, never into the main venv. One run:
- converges the rigs with rigkit's deploy (release 1 of group_data/lab.py), so every no-op below is one;
- renders the Ansible play's inputs with rigkit's renderer (bench/ansible_peer.py): the same compose.yml and
  .env bytes;
- times, --repeat times each, on 1 rig and on all of them: pyinfra's floor (`pyinfra INVENTORY fact
  server.Hostname`: connect, one trivial fact, per rig), rigkit's no-op (deploy.py: every role, preflights),
  Ansible's no-op with its ControlPersist masters cold (a fresh control directory) and warm (right after);
- knob change -> recreated and serving, on the first rig: Ansible sets the knob (--knob), then rigkit sets it
  back, each timed with the API polled every 0.2 s; the engine start is the serving container's start to the
  moment /v1/models answers again, the tool's overhead the rest of its wall time;
- prints the table and whether each target of issue 14 was met.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import requests

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import ansible_peer  # noqa: E402
from cpu_account import precompile  # noqa: E402
from deploy_bench import INVENTORY, REPO_ROOT, Availability, load_average, progress, pyinfra, rig_shell  # noqa: E402

from rigkit.errors import ConfigError  # noqa: E402
from rigkit.fleet.inventory import load_inventory  # noqa: E402
from rigkit.fleet.pyinfra_args import pyinfra_executable  # noqa: E402
from rigkit.lab.lab_model import stage_on_lab_rigs  # noqa: E402
from rigkit.lab.state import RigState, read_state  # noqa: E402
from rigkit.serving.commands import rendering_for  # noqa: E402
from rigkit.serving.render import CONTAINER_NAME, KNOBS_HASH_LABEL  # noqa: E402
from rigkit.settings.hostdata import RigSettings, rig_settings  # noqa: E402
from rigkit.settings.knobs import KNOBS_BY_NAME  # noqa: E402

FLOOR, RIGKIT, ANSIBLE_WARM, ANSIBLE_COLD = "pyinfra floor", "rigkit", "Ansible warm", "Ansible cold"
ANSIBLE = "Ansible"  # the knob change has one Ansible run (masters cold)
NOOP_TOOLS = (FLOOR, RIGKIT, ANSIBLE_WARM, ANSIBLE_COLD)
NO_CHANGE = "no change"
FLOOR_FACT = "server.Hostname"
DEFAULT_KNOB = "max_num_seqs=16"
# Issue 14's targets, on 4 rigs, in the same run.
TARGET_NOOP_VS_ANSIBLE = 5.0  # rigkit's no-op at least this many times faster than Ansible's
TARGET_NOOP_VS_FLOOR = 2.0  # and at most this many times pyinfra's floor
TARGET_RIGS = 4


@dataclass(frozen=True)
class Sample:
    """One timed run: its wall time and what it reported ("no change", "changed"; "fact" for the floor)."""

    seconds: float
    outcome: str


@dataclass(frozen=True)
class KnobChange:
    """One knob change brought up by one tool on one rig."""

    tool: str
    what: str  # e.g. "sets max_num_seqs=16"
    wall_s: float
    engine_start_s: Optional[float]  # the new container's start -> /v1/models answered again; None: not seen
    recreated: bool  # another container than before the run
    serving: bool  # carries the expected knobs hash and /v1/models answers

    @property
    def valid(self) -> bool:
        return self.recreated and self.serving and self.engine_start_s is not None

    @property
    def overhead_s(self) -> Optional[float]:
        return None if self.engine_start_s is None else self.wall_s - self.engine_start_s


@dataclass
class Results:
    rigs: list[str]
    noop: dict[str, dict[int, list[Sample]]] = field(default_factory=lambda: {tool: {} for tool in NOOP_TOOLS})
    knob: dict[str, KnobChange] = field(default_factory=dict)

    def add(self, tool: str, count: int, sample: Sample) -> None:
        self.noop[tool].setdefault(count, []).append(sample)

    def median(self, tool: str, count: int) -> Optional[float]:
        samples = self.noop[tool].get(count)
        return statistics.median(s.seconds for s in samples) if samples else None

    def all_no_change(self, tool: str, count: int) -> bool:
        return all(s.outcome == NO_CHANGE for s in self.noop[tool].get(count, []))

    @property
    def counts(self) -> list[int]:
        return sorted({count for by_count in self.noop.values() for count in by_count})


@dataclass(frozen=True)
class Verdict:
    target: str
    detail: str
    met: Optional[bool]  # None: not judged (a run was not what the target compares), the detail says why

    def line(self) -> str:
        mark = {True: "met", False: "NOT MET", None: "not judged"}[self.met]
        return f"[{mark}] {self.target}: {self.detail}"


def verdicts(results: Results) -> list[Verdict]:
    """Issue 14's three targets, judged on the largest rig count measured."""
    top = max(results.counts)
    scope = f"{top} rigs" + ("" if top >= TARGET_RIGS else f" (the target names {TARGET_RIGS})")
    rigkit, warm, cold, floor = (results.median(tool, top) for tool in (RIGKIT, ANSIBLE_WARM, ANSIBLE_COLD, FLOOR))
    not_noops = [tool for tool in (RIGKIT, ANSIBLE_WARM, ANSIBLE_COLD) if not results.all_no_change(tool, top)]
    out = []
    if None in (rigkit, warm, cold, floor):
        return [Verdict("no-op targets", f"not measured on {scope}", None)]
    noop_why = f"; {', '.join(not_noops)} changed something, so it was no no-op" if not_noops else ""
    out.append(
        Verdict(
            f"rigkit's no-op at least {TARGET_NOOP_VS_ANSIBLE:g}x faster than Ansible's, {scope}",
            f"rigkit {rigkit:.2f} s, Ansible {warm:.2f} s with warm SSH masters ({warm / rigkit:.2f}x), "
            f"{cold:.2f} s cold ({cold / rigkit:.2f}x); judged on warm, Ansible's tuned best{noop_why}",
            None if not_noops else warm / rigkit >= TARGET_NOOP_VS_ANSIBLE,
        )
    )
    out.append(
        Verdict(
            f"rigkit's no-op within {TARGET_NOOP_VS_FLOOR:g}x of pyinfra's floor, {scope}",
            f"rigkit {rigkit:.2f} s, floor {floor:.2f} s ({rigkit / floor:.2f}x){noop_why if RIGKIT in not_noops else ''}",
            None if RIGKIT in not_noops else rigkit / floor <= TARGET_NOOP_VS_FLOOR,
        )
    )
    ours, theirs = results.knob.get(RIGKIT), results.knob.get(ANSIBLE)
    if ours is None or theirs is None:
        out.append(Verdict("knob change: rigkit's overhead no more than Ansible's", "not measured", None))
    elif not (ours.valid and theirs.valid):
        broken = [
            f"{k.tool} ({'not recreated' if not k.recreated else 'not serving' if not k.serving else 'engine start not seen'})"
            for k in (ours, theirs)
            if not k.valid
        ]
        out.append(Verdict("knob change: rigkit's overhead no more than Ansible's", ", ".join(broken), None))
    else:
        out.append(
            Verdict(
                "knob change -> serving: rigkit's overhead on top of the engine start no more than Ansible's",
                f"rigkit {ours.overhead_s:.1f} s (wall {ours.wall_s:.1f} s, engine {ours.engine_start_s:.1f} s), "
                f"Ansible {theirs.overhead_s:.1f} s (wall {theirs.wall_s:.1f} s, engine {theirs.engine_start_s:.1f} s)",
                ours.overhead_s <= theirs.overhead_s,
            )
        )
    return out


def _cell(results: Results, tool: str, count: int) -> str:
    value = results.median(tool, count)
    if value is None:
        return "-"
    # a "no-op" that changed something is marked: it is not the run the row names
    return f"{value:.2f} s" + ("" if tool == FLOOR or results.all_no_change(tool, count) else " *")


def format_table(results: Results, repeat: int) -> str:
    """The side-by-side table: no-ops per rig count, then the knob change per tool."""
    widths = (24, 5, 14, 10, 13, 13)
    head = ("measurement", "rigs", *NOOP_TOOLS)
    lines = ["  ".join(f"{text:<{w}}" if i == 0 else f"{text:>{w}}" for i, (text, w) in enumerate(zip(head, widths)))]
    for count in results.counts:
        cells = (f"no-op (median of {repeat})", str(count), *(_cell(results, tool, count) for tool in NOOP_TOOLS))
        lines.append("  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(cells, widths))))
    if any(not results.all_no_change(tool, count) for tool in NOOP_TOOLS[1:] for count in results.counts):
        lines.append("  * a run reported a change: not a no-op")
    if results.knob:
        lines.append("")
        lines.append("knob change -> recreated and serving, 1 rig:")
        for change in results.knob.values():
            engine = "not seen" if change.engine_start_s is None else f"{change.engine_start_s:.1f} s"
            overhead = "-" if change.overhead_s is None else f"{change.overhead_s:.1f} s"
            lines.append(
                f"  {change.tool:<8} {change.what:<28} wall {change.wall_s:6.1f} s  engine start {engine:>8}  "
                f"overhead {overhead:>7}  recreated {'yes' if change.recreated else 'NO'}, "
                f"serving {'yes' if change.serving else 'NO'}"
            )
    return "\n".join(lines)


def parse_knob(text: str) -> tuple[str, Any]:
    """``name=value`` as pyinfra's --data reads it (JSON where it parses: 16 is a number, true a boolean)."""
    name, sep, raw = text.partition("=")
    if not sep or name not in KNOBS_BY_NAME:
        raise ConfigError(
            "--knob",
            text,
            "is not NAME=VALUE with a serving knob's name",
            f"give a knob of rigkit/settings/knobs.py, e.g. {DEFAULT_KNOB}",
        )
    try:
        return name, json.loads(raw)
    except ValueError:
        return name, raw


def knob_changed(data: Mapping[str, Any], name: str, value: Any) -> RigSettings:
    """The rig's settings with the knob changed; refused when that renders the same files (nothing to time)."""
    changed = rig_settings({**data, name: value})
    if rendering_for(changed.stack) == rendering_for(rig_settings(dict(data)).stack):
        raise ConfigError(
            "--knob",
            f"{name}={value}",
            "renders the same compose.yml and .env as the rig's data",
            "pick a value (or a knob the profile renders) that changes the stack",
        )
    return changed


def parse_docker_time(text: str) -> float:
    """Docker's RFC 3339 time with nanoseconds (2026-12-01T10:00:00.123456789Z) as a Unix time."""
    text = text.strip()
    if "." in text:
        whole, fraction = text.split(".", 1)
        digits = "".join(ch for ch in fraction if ch.isdigit())
        zone = fraction[len(digits) :]
        text = f"{whole}.{digits[:6]}{zone}"
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# --- runs against the lab ---------------------------------------------------------------------------------------


def timed(argv: Sequence[str], env: Optional[Mapping[str, str]] = None, cwd: Path = REPO_ROOT) -> tuple[float, str]:
    started = time.monotonic()
    result = subprocess.run(list(argv), cwd=cwd, env=dict(env) if env else None, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:1])} failed:\n{output[-4000:]}")
    return elapsed, output


def pyinfra_floor(rigs: Sequence[RigState]) -> Sample:
    limits = [arg for rig in rigs for arg in ("--limit", rig.name)]
    pyinfra_bin = pyinfra_executable()
    seconds, _ = timed([pyinfra_bin, "-y", *limits, str(INVENTORY), "fact", FLOOR_FACT])
    return Sample(seconds, "fact")


def rigkit_deploy(rigs: Sequence[RigState]) -> Sample:
    seconds, outcome = pyinfra(list(rigs), "deploy.py")
    return Sample(seconds, outcome)


def ansible_deploy(playbook: Path, inventory_file: Path, rigs: Sequence[RigState], control_dir: Path) -> Sample:
    names = [rig.name for rig in rigs]
    seconds, output = timed(
        ansible_peer.playbook_argv(playbook, inventory_file, names),
        env=ansible_peer.playbook_env(control_dir),
        cwd=ansible_peer.ANSIBLE_DIR,
    )
    outcome = ansible_peer.run_outcome(ansible_peer.parse_recap(output), names)
    if outcome is None:
        raise SystemExit(f"ansible-playbook did not complete on {names}:\n{output[-4000:]}")
    return Sample(seconds, outcome)


def serving_container(rig: RigState) -> tuple[str, Optional[float], str]:
    """(id, start as Unix time, knobs-hash label) of the rig's serving container ("" when there is none)."""
    out = rig_shell(
        rig,
        "docker inspect --format '{{.Id}} {{.State.StartedAt}} "
        f'{{{{index .Config.Labels "{KNOBS_HASH_LABEL}"}}}}\' {CONTAINER_NAME} 2>/dev/null',
    ).split()
    if len(out) < 3:
        return "", None, ""
    return out[0], parse_docker_time(out[1]), out[2]


def answers(rig: RigState) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{rig.serving_port}/v1/models", timeout=5).status_code == 200
    except requests.RequestException:
        return False


def knob_change(tool: str, what: str, rig: RigState, run: Callable[[], Sample], expected_hash: str) -> KnobChange:
    before, _, _ = serving_container(rig)
    with Availability(rig) as availability:
        sample = run()
    after, started_at, knobs_hash = serving_container(rig)
    engine = (
        availability.back_at - started_at
        if availability.back_at is not None and started_at is not None and availability.back_at >= started_at
        else None
    )
    return KnobChange(
        tool,
        what,
        sample.seconds,
        engine,
        recreated=bool(after) and after != before,
        serving=knobs_hash == expected_hash and answers(rig),
    )


def pick_rigs(names: Optional[str]) -> list[RigState]:
    state = read_state()
    by_name = {rig.name: rig for rig in state.rigs}
    chosen = names.split(",") if names else [rig.name for rig in state.rigs if not rig.netns][-TARGET_RIGS:]
    rigs = [by_name[name] for name in chosen]
    in_netns = [rig.name for rig in rigs if rig.netns]
    if in_netns:
        raise ConfigError(
            "--rigs",
            ",".join(in_netns),
            "are in their own network namespace: the bench polls the API from here",
            "name host-network rigs (`rigkit lab up --rigs 4 --netns-rigs 0`)",
        )
    return rigs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rigs", help=f"comma-separated host-network rigs (default: the last {TARGET_RIGS})")
    parser.add_argument("--repeat", type=int, default=3, help="runs per no-op figure (the median is shown)")
    parser.add_argument("--knob", default=DEFAULT_KNOB, help="NAME=VALUE Ansible sets and rigkit sets back")
    args = parser.parse_args()
    rigs = pick_rigs(args.rigs)
    names = [rig.name for rig in rigs]
    knob_name, knob_value = parse_knob(args.knob)

    load_at_start = load_average()
    progress(f"rigs {', '.join(names)}; {load_at_start}")
    progress(f"ansible-core: {ansible_peer.pinned_requirement()} in {ansible_peer.VENV_DIR}")
    playbook = ansible_peer.ensure_ansible()
    hosts = load_inventory(str(INVENTORY))
    baseline = {name: (hosts[name]["data"], rig_settings(hosts[name]["data"])) for name in names}
    changed = knob_changed(baseline[names[0]][0], knob_name, knob_value)

    progress("writing the checkout's bytecode (bench/cpu_account.py precompile: an installed rigkit has it)")
    precompile(REPO_ROOT)
    progress("staging the lab's model on every lab rig (rigkit stage; a no-op when staged)")
    staged = stage_on_lab_rigs(INVENTORY, REPO_ROOT)
    if staged.returncode != 0:
        raise SystemExit(f"rigkit stage failed:\n{(staged.stdout + staged.stderr)[-4000:]}")
    progress(f"converging {', '.join(names)} with rigkit's deploy (release 1)")
    rigkit_deploy(rigs)
    inventory_file = ansible_peer.write_inputs(baseline)

    results = Results(names)
    counts = sorted({1, len(rigs)})
    control_root = Path(tempfile.mkdtemp(prefix="cp-", dir=ansible_peer.GENERATED_DIR))
    try:
        for attempt in range(args.repeat):
            for count in counts:
                group = rigs[:count]
                progress(
                    f"run {attempt + 1}/{args.repeat}, {count} rig(s): pyinfra's floor, rigkit, Ansible cold, warm"
                )
                results.add(FLOOR, count, pyinfra_floor(group))
                results.add(RIGKIT, count, rigkit_deploy(group))
                control_dir = control_root / f"{attempt}-{count}"
                control_dir.mkdir()
                results.add(ANSIBLE_COLD, count, ansible_deploy(playbook, inventory_file, group, control_dir))
                results.add(ANSIBLE_WARM, count, ansible_deploy(playbook, inventory_file, group, control_dir))
                ansible_peer.close_masters(control_dir)

        rig, data = rigs[0], baseline[names[0]][0]
        progress(f"knob change on {rig.name}: Ansible sets {knob_name}={knob_value}, rigkit sets it back")
        changed_inventory = ansible_peer.write_inputs({rig.name: (data, changed)}, ansible_peer.GENERATED_DIR / "knob")
        control_dir = control_root / "knob"
        control_dir.mkdir()
        results.knob[ANSIBLE] = knob_change(
            ANSIBLE,
            f"sets {knob_name}={knob_value}",
            rig,
            lambda: ansible_deploy(playbook, changed_inventory, [rig], control_dir),
            changed.stack.knobs_hash,
        )
        ansible_peer.close_masters(control_dir)
        results.knob[RIGKIT] = knob_change(
            RIGKIT, f"sets {knob_name} back", rig, lambda: rigkit_deploy([rig]), baseline[names[0]][1].stack.knobs_hash
        )
    finally:
        for directory in control_root.iterdir():
            ansible_peer.close_masters(directory)
        shutil.rmtree(control_root, ignore_errors=True)
        ansible_peer.write_inputs(baseline)  # the generated inventory says what the rigs run again

    ram_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    print(
        f"\nmachine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, {ram_gib} GiB RAM; "
        f"rigs {', '.join(names)}; {ansible_peer.pinned_requirement()}\n  at the start: {load_at_start}\n"
        f"  at the end:   {load_average()}\n  (a load above the core count means other work shared the cores)"
    )
    print(format_table(results, args.repeat))
    print(
        "\nrigkit's no-op is deploy.py as a user runs it (every role, the preflights); it runs no smoke when "
        "nothing changed (no smoke-lite is built). Ansible's play does the minimal job only and ends with a "
        "/v1/models check."
    )
    print("targets:")
    for verdict in verdicts(results):
        print("  " + verdict.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
