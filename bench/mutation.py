"""Mutation check of the modules that decide: mutmut changes their code one small edit at a time and runs, for
each mutant, only the tests that call the function it changed. A mutant no test kills is a bug the suite would
let through, or an equivalent change: docs/mutation.md explains each known survivor.

    .venv/bin/python bench/mutation.py                     # every module below (~25 min on 2 cores)
    .venv/bin/python bench/mutation.py rigkit/validation/ttft.py      # some of them
    .venv/bin/python bench/mutation.py --all-tests         # select from the whole non-lab suite (slower)
    .venv/bin/python bench/mutation.py --show              # also print each survivor's diff

Not part of the test suite (too slow for CI). It works in a copy of the checkout (.mutation/<module>/, one per
module or set of modules run; git-ignored) with mutmut's config written there from the lists below, so the checkout
is never mutated; mutmut keeps its results there and a later run of the same modules tests only the functions that
changed, then retests the survivors against today's tests (--fresh starts over). It prints progress, each
module's mutants (killed / survived / no test / timeout), the survivors, and met / not met: every survivor
explained in docs/mutation.md, and the run within TIME_TARGET_S.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import tomllib

# The modules that decide (paths from the repository root).
MODULES = [
    "rigkit/serving/release.py",  # release state: record, verify, roll back or refuse
    "rigkit/serving/ledger.py",  # release state: last known good, rollback target, pruning
    "rigkit/rollout/state.py",  # release state of each rig in a rollout
    "rigkit/validation/tiers.py",  # tiers: a request's tier from counter deltas
    "rigkit/rollout/proof.py",  # proofs: a canary's cache proof verdict
    "rigkit/validation/ttft.py",  # TTFT cross-check against the server histogram
    "rigkit/rollout/plan.py",  # rollout planning: canaries, batches
    "rigkit/rollout/stage.py",  # rollout halting: which rigs halt a stage, what rolls back
    "rigkit/status/drift.py",  # status drift
    "rigkit/settings/knobs.py",  # knobs and redaction of secrets
    "rigkit/settings/engine_args.py",  # which flag rigkit renders an extra engine argument sets
    "rigkit/settings/variables.py",  # input types and variables
    "rigkit/preflight/findings.py",  # preflight: what the gates read and answer
    "rigkit/preflight/memory.py",  # preflight gates: RAM, /dev/shm
    "rigkit/preflight/l2.py",  # preflight gates: L2 free space
    "rigkit/preflight/gpus.py",  # preflight gates: GPU memory, gpu_mask, tensor parallelism
    "rigkit/preflight/engine.py",  # preflight gates: engine, compose, image, ports
    "rigkit/preflight/__init__.py",  # preflight: the gates run together, force, refusals
    "rigkit/facts/joined.py",  # facts of one kind read by one process: each fact's own lines, or read alone
    "rigkit/facts/serving.py",  # the engine's answers as the gates and the release check read them
    "rigkit/facts/surveyed.py",  # the operations' facts from one read per stage, live again once the rig changes
    "rigkit/disk.py",  # the L2 disk and shared mount: fstab lines, mount options, the seal under a mount
    "rigkit/firewall.py",  # the API firewall's nft ruleset from the rig's settings
    "rigkit/systemd.py",  # a unit's ExecStart= quoted by systemd's own rules
    "rigkit/kv_share.py",  # the shared store's export: its fstab line and mount options
    "rigkit/settings/types.py",  # input types: addresses, hosts, paths, each typed for where it goes
    "rigkit/router.py",  # the router's unit: its command line, API key file, workers
    "rigkit/kv_store.py",  # the shared store's server: its config, unit, firewall and the rigs' connector address
]
# Tests that exercise a module without naming it (the selection is every test file that names one, plus these
# for the modules run).
EXTRA_TESTS: dict[str, list[str]] = {
    # status judges drift in rigkit.status.rig, on a rig made on this machine (tests/status_sandbox.py)
    "rigkit/status/drift.py": ["tests/status/test_status_rig.py"],
    # the knobs' validators are reached through host data (rigkit.settings.hostdata) and the bad-input catalogue
    "rigkit/settings/knobs.py": ["tests/settings/test_hostdata.py", "tests/test_bad_input_catalogue.py"],
    # the knob check and the profile's check read extra engine arguments through it
    "rigkit/settings/engine_args.py": ["tests/settings/test_engine_settings.py", "tests/settings/test_knobs.py"],
    # every knob's value is coerced (Variable.coerce) on its way in: the bad-input catalogue's refusals
    "rigkit/settings/variables.py": ["tests/test_bad_input_catalogue.py"],
    # the joins run inside a FactBatch (rigkit.facts.batch), whose tests read facts through them
    "rigkit/facts/joined.py": ["tests/facts/test_batch.py"],
    # the facts' cases (tests/facts/serving.*) and status, which reads the engine's part of its script through it
    "rigkit/facts/serving.py": ["tests/facts/test_facts.py", "tests/status/test_status_rig.py"],
    # the roles' cases count each operation's round trips on a rig already right: one batch per stage
    "rigkit/facts/surveyed.py": ["tests/roles/test_roles.py"],
    # every variable's value meets its type through the settings (host data, the bad-input catalogue)
    "rigkit/settings/types.py": ["tests/test_bad_input_catalogue.py", "tests/settings/test_hostdata.py"],
}
# Mutants are run among these tests only: the lab's and vLLM's need a lab or minutes each.
PYTEST_ARGS = ["-p", "no:cacheprovider", "-m", "not lab and not vllm", "-o", "addopts="]
# What a developer waits for on 2 cores: the whole list, from scratch.
TIME_TARGET_S = 30 * 60
# tests/conftest.py's hypothesis profile for mutants: no shrinking (a failing example is enough)
HYPOTHESIS_PROFILE_ENV = "RIGKIT_HYPOTHESIS_PROFILE"
MUTMUT = "mutmut"  # its version is pinned in pyproject's "mutation" extra

REPO_ROOT = Path(__file__).resolve().parent.parent
WORK_ROOT = REPO_ROOT / ".mutation"
# A work directory per module set (main sets it): mutmut forgets every verdict when its test selection changes, so
# one module's run would otherwise throw away another's.
WORK_DIR = WORK_ROOT / "all"
EXPLAINED = REPO_ROOT / "docs" / "mutation.md"
# Never copied into the work directory.
LEFT_OUT = {".git", ".venv", ".mutation", "results", "rollouts", "build"}
# a line of `mutmut results`: '    rigkit.validation.ttft.x_ttft_agrees__mutmut_3: survived' (methods: xǁClassǁmethod)
RESULT_LINE = re.compile(r"^\s+(?P<name>[\w.]+__mutmut_\d+): (?P<status>[\w ]+)$")


def pinned_requirement() -> str:
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return next(req for req in extras["mutation"] if req.startswith(MUTMUT))


def ensure_mutmut() -> None:
    """The pinned mutmut in this interpreter, installed with pip when missing or another version."""
    requirement = pinned_requirement()
    wanted = requirement.partition("==")[2]
    try:
        from importlib.metadata import version

        if version(MUTMUT) == wanted:
            return
    except Exception:
        pass
    print(f"installing {requirement} (pyproject's mutation extra) into {sys.prefix}", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", requirement], check=True)


def work_dir(modules: list[str]) -> Path:
    """.mutation/<module> for one module, .mutation/all for MODULES, else one named by the set's hash."""
    if modules == MODULES:
        return WORK_ROOT / "all"
    if len(modules) == 1:
        return WORK_ROOT / dotted(modules[0])
    return WORK_ROOT / ("set-" + hashlib.sha256(" ".join(sorted(modules)).encode()).hexdigest()[:12])


def dotted(module_path: str) -> str:
    return module_path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def selected_tests(modules: list[str], all_tests: bool) -> list[str]:
    """Every non-lab test file that names one of the modules (as rigkit.x or `from rigkit import x`)."""
    if all_tests:
        return ["tests"]
    patterns = []
    for module in modules:
        package, _, name = dotted(module).rpartition(".")
        patterns.append(
            re.compile(rf"\b{re.escape(package)}\.{name}\b|from {re.escape(package)} import [^\n]*\b{name}\b")
        )
    selected = {
        str(path.relative_to(REPO_ROOT))
        for path in (REPO_ROOT / "tests").rglob("test_*.py")
        if "lab" not in path.relative_to(REPO_ROOT / "tests").parts[:-1]
        and any(p.search(path.read_text()) for p in patterns)
    }
    return sorted(selected | {test for module in modules for test in EXTRA_TESTS.get(module, [])})


def tracked_files() -> list[str]:
    """The checkout's files as git sees them (tracked, and new ones not ignored)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [name for name in out.split("\0") if name and name.split("/")[0] not in LEFT_OUT]


def sync_copy(files: list[str]) -> None:
    """The work directory holds exactly these files of the checkout; unchanged ones keep their times, so
    mutmut retests only what changed."""
    wanted = set(files)
    for name in files:
        source, target = REPO_ROOT / name, WORK_DIR / name
        if not source.is_file():
            continue
        if target.is_file() and target.read_bytes() == source.read_bytes():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    for path in list(WORK_DIR.rglob("*")):
        relative = path.relative_to(WORK_DIR)
        if relative.parts[0] in {"mutants", "pyproject.toml"} or "__pycache__" in relative.parts:
            continue
        if path.is_file() and str(relative) not in wanted:
            path.unlink()


def toml_list(values: list[str]) -> str:
    return "[" + ", ".join(f'"{value}"' for value in values) + "]"


def write_config(modules: list[str], tests: list[str], files: list[str]) -> None:
    """The checkout's pyproject.toml with mutmut's section: mutate the modules, copy the rest for the tests."""
    sources = sorted({module.split("/")[0] for module in modules})
    others = sorted({name.split("/")[0] for name in files} - set(sources) - {"pyproject.toml"})
    config = (
        f"\n[tool.mutmut]\nsource_paths = {toml_list(sources)}\nonly_mutate = {toml_list(modules)}\n"
        f"also_copy = {toml_list(others)}\npytest_add_cli_args_test_selection = {toml_list(tests)}\n"
        f"pytest_add_cli_args = {toml_list(PYTEST_ARGS)}\n"
    )
    target = WORK_DIR / "pyproject.toml"
    text = (REPO_ROOT / "pyproject.toml").read_text() + config
    if not target.is_file() or target.read_text() != text:
        target.write_text(text)


def mutmut_run(jobs: int, mutants: list[str] = ()) -> subprocess.CompletedProcess:
    """`mutmut run` in the work directory: every mutant not judged yet, or these (again)."""
    return subprocess.run(
        [sys.executable, "-m", MUTMUT, "run", "--max-children", str(jobs), *mutants],
        cwd=WORK_DIR,
        env={**os.environ, HYPOTHESIS_PROFILE_ENV: "mutation"},
    )


def explained_survivors() -> set[str]:
    """Mutant names docs/mutation.md explains (in backticks; ``__mutmut_*``: every mutant of that function)."""
    if not EXPLAINED.is_file():
        return set()
    return set(re.findall(r"`([\w.]+__mutmut_(?:\d+|\*))`", EXPLAINED.read_text()))


def is_explained(mutant: str, explained: set[str]) -> bool:
    return any(fnmatch.fnmatchcase(mutant, name) for name in explained)


def results() -> dict[str, str]:
    """mutant name -> status, from `mutmut results --all true`."""
    out = subprocess.run(
        [sys.executable, "-m", MUTMUT, "results", "--all", "true"],
        cwd=WORK_DIR,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {m["name"]: m["status"].strip() for m in map(RESULT_LINE.match, out.splitlines()) if m}


def module_of(mutant: str, modules: list[str]) -> str:
    # the longest match: a package's own mutants (rigkit.preflight.x_...) share its modules' prefix
    return max((m for m in modules if mutant.startswith(dotted(m) + ".")), key=lambda m: len(dotted(m)), default="?")


def report(modules: list[str], statuses: dict[str, str], elapsed_s: float, show: bool) -> bool:
    by_module: dict[str, Counter] = {module: Counter() for module in modules}
    for mutant, status in statuses.items():
        by_module.setdefault(module_of(mutant, modules), Counter())[status] += 1
    print(f"\n{'module':32} {'mutants':>7} {'killed':>7} {'survived':>8} {'no tests':>8} {'timeout':>7} {'other':>5}")
    total = Counter()
    for module, counts in by_module.items():
        total.update(counts)
        other = sum(counts.values()) - sum(counts[s] for s in ("killed", "survived", "no tests", "timeout"))
        print(
            f"{module:32} {sum(counts.values()):7} {counts['killed']:7} {counts['survived']:8} "
            f"{counts['no tests']:8} {counts['timeout']:7} {other:5}"
        )
    mutants = sum(total.values())
    judged = total["killed"] + total["survived"] + total["no tests"]
    rate = 100.0 * (total["killed"] + total["timeout"]) / mutants if mutants else 0.0
    print(
        f"{'all':32} {mutants:7} {total['killed']:7} {total['survived']:8} {total['no tests']:8} "
        f"{total['timeout']:7}  kill rate {rate:.1f}% ({judged} judged) in {elapsed_s / 60:.1f} min"
    )
    alive = sorted(m for m, status in statuses.items() if status in ("survived", "no tests"))
    explained = explained_survivors()
    unexplained = [m for m in alive if not is_explained(m, explained)]
    if alive:
        print(
            f"\nsurvivors ({len(alive)}; {len(alive) - len(unexplained)} explained as equivalent in "
            f"{EXPLAINED.relative_to(REPO_ROOT)}):"
        )
        for mutant in alive:
            print(f"  {mutant}: {statuses[mutant]}{'' if mutant in unexplained else ' (explained)'}")
            if show:
                diff = subprocess.run(
                    [sys.executable, "-m", MUTMUT, "show", mutant], cwd=WORK_DIR, capture_output=True, text=True
                ).stdout
                print("    " + diff.strip().replace("\n", "\n    "))
    stale = sorted(
        name
        for name in explained
        if module_of(name, modules) != "?" and not any(fnmatch.fnmatchcase(m, name) for m in alive)
    )
    if stale:
        print(
            f"\nexplained in {EXPLAINED.relative_to(REPO_ROOT)} but not surviving now (remove them): "
            + ", ".join(stale)
        )
    every_one = not unexplained
    print(
        f"\nevery survivor killed or explained: {'met' if every_one else 'not met'}"
        + ("" if every_one else f" ({len(unexplained)} unexplained: kill each with a test or explain it)")
    )
    in_time = elapsed_s <= TIME_TARGET_S
    print(f"within {TIME_TARGET_S // 60} min: {'met' if in_time else 'not met'} ({elapsed_s / 60:.1f} min)")
    return every_one


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"some of MODULES (default: all {len(MODULES)})")
    parser.add_argument("--all-tests", action="store_true", help="select among the whole non-lab suite")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="mutants run at once")
    parser.add_argument("--fresh", action="store_true", help="forget earlier results and mutate anew")
    parser.add_argument("--show", action="store_true", help="print each survivor's diff")
    args = parser.parse_args()
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"not in MODULES: {', '.join(unknown)}; one of: {', '.join(MODULES)}")
    modules = args.modules or MODULES
    missing = [m for m in modules if not (REPO_ROOT / m).is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}: update MODULES at the top of {Path(__file__).name}")

    ensure_mutmut()
    global WORK_DIR
    WORK_DIR = work_dir(modules)
    if args.fresh and WORK_DIR.exists():
        shutil.rmtree(WORK_DIR)
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    files = tracked_files()
    tests = selected_tests(modules, args.all_tests)
    print(f"mutating {len(modules)} modules; tests: {len(tests)} files ({', '.join(tests)})", flush=True)
    sync_copy(files)
    write_config(modules, tests, files)
    earlier = (WORK_DIR / "mutants").is_dir()
    started = time.monotonic()
    run = mutmut_run(args.jobs)
    # mutmut keeps a survivor's verdict until its function changes: a test written since may kill it
    survivors = sorted(
        m for m, status in results().items() if status in ("survived", "no tests") and module_of(m, modules) != "?"
    )
    if run.returncode == 0 and earlier and survivors:
        print(f"retesting the {len(survivors)} survivors against today's tests", flush=True)
        run = mutmut_run(args.jobs, survivors)
    elapsed = time.monotonic() - started
    if run.returncode != 0:
        print(f"mutmut run failed (exit {run.returncode}); its files are in {WORK_DIR}", file=sys.stderr)
        return run.returncode
    statuses = {m: s for m, s in results().items() if module_of(m, modules) != "?"}
    return 0 if report(modules, statuses, elapsed, args.show) else 1


if __name__ == "__main__":
    sys.exit(main())
