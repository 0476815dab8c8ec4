"""A fleet rollout that halts on the first bad rig: canaries first, then batches (`rigkit deploy --canary/--batch`).

    rigkit deploy inventory/lab.py --canary 1 --batch 2 --data serving_image=REPO@sha256:...
    rigkit deploy inventory/lab.py --canary 1 --batch 2 --on-failure rollback
    rigkit deploy inventory/lab.py --recheck-canaries          # prove the canaries again on a re-run

The same as data (rigkit.defaults, section rollout: rollout_canary, rollout_batch, rollout_on_failure,
rollout_cache_proof), the same on every targeted rig; a flag overrides the data.

1. Before any rig is touched: every rig's settings are built from its data (bad input refuses the rollout),
   its wanted rendering computed (rigkit.stack.rendering_for: the hash a deploy will verify), and its state
   read over SSH in one round trip (the verified rendering it runs, rigkit.stack.RELEASE_HASH_FILE, and its
   ledger's current release). A rig that cannot be read refuses the rollout: it would fail in its batch.
2. The first ``canary`` targeted rigs, in inventory order, are deployed (deploy.py with --limit); the serving
   role smokes each and rolls a failing one back itself. Each canary then proves its cache through the SSH
   tunnel with validate.py's own procedure cut short (rigkit.validation.validate_tiers, one salted session,
   no restart): cold, warm-gpu (GPU prefix hits grew), GPU eviction by fillers, warm-connector (external
   hits grew).
3. The other rigs follow ``batch`` at a time. After each stage the rigs are read again: a rig whose run
   failed, whose verified rendering is not the wanted one, or whose cache proof failed halts the rollout.
   Rigs not reached were never in a pyinfra run: they serve their old release untouched.
4. On a halt, ``on_failure`` decides about the rigs this rollout upgraded: left on the new release, or
   rolled back with rollback.py --limit (their stored verified rendering, by digest), then read again.

Where the fleet stands comes from the rigs: a rig already verified on its wanted rendering is not deployed
again. What the ledgers cannot say is kept in a local record (ROLLOUTS_DIR/<inventory>.json, written after
every stage): which release each rig verified before this rollout started (the rollback's check), which
rigs this rollout upgraded (what the rollback knob acts on) and which canaries passed the cache proof. A
re-run of the same rollout (same wanted renderings) after the controller was killed continues from there:
a canary that passed is neither deployed nor proven again unless --recheck-canaries asks.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from rigkit.defaults import ROLLOUT_LEAVE, ROLLOUT_ROLLBACK, ROLLOUT_VARIABLES
from rigkit.errors import ConfigError
from rigkit.ledger import Ledger, Release
from rigkit.paths import ROLLOUTS_DIR

# Set by `rigkit deploy` for every pyinfra run it drives: deploy.py refuses a rollout's data without it.
ROLLOUT_STEP_ENV = "RIGKIT_ROLLOUT_STEP"
ALL_AT_ONCE = "all at once"
CANARY = "canary"
RECORD_SCHEMA = 1
# The summary wraps to the terminal, kept between these widths.
MIN_WIDTH, MAX_WIDTH = 80, 120
STATE_SEPARATOR = "--rigkit-ledger--"
SHORT_DIGEST = 12
# The deploy has just waited for the API: a proof that finds it silent this long fails (the engine died).
PROOF_READY_TIMEOUT_S = 60.0

# Why a rig of a stage failed: the words the summary prints.
NOT_ON_RELEASE = "its deploy reported success but the rig does not run the wanted rendering (verified {got})"
PROOF_FAILED = "cache proof failed: {why}"


@dataclass(frozen=True)
class RolloutSettings:
    canary: int
    batch: int
    on_failure: str
    cache_proof: bool

    @property
    def active(self) -> bool:
        return bool(self.canary or self.batch)

    def describe(self) -> str:
        batch = f"batches of {self.batch}" if self.batch else "the rest in one batch"
        return f"canary {self.canary}, {batch}, on failure: {self.on_failure}"


def rollout_settings(per_rig: Mapping[str, Mapping[str, Any]], overrides: Mapping[str, Any]) -> RolloutSettings:
    """The rollout's settings from each targeted rig's resolved `rollout` section; a flag (``overrides``, by
    variable name, None = not given) wins. Without a flag every rig must carry the same value: a rollout is
    one plan for the fleet."""
    values = {}
    for variable in ROLLOUT_VARIABLES:
        name = variable.name
        if overrides.get(name) is not None:
            values[name] = variable.coerce(overrides[name])
            continue
        seen = {rig: section[name] for rig, section in per_rig.items()}
        distinct = sorted({json.dumps(v) for v in seen.values()})
        if len(distinct) > 1:
            first, other = next(iter(seen)), next(r for r, v in seen.items() if v != next(iter(seen.values())))
            raise ConfigError(name, seen[other], f"differs between rigs ({first}: {seen[first]!r}, {other}: "
                              f"{seen[other]!r}): a rollout is one plan for the whole fleet",
                              f"set {name} once in group data, or pass it as a rigkit deploy flag")
        values[name] = next(iter(seen.values())) if seen else variable.default
    return RolloutSettings(values["rollout_canary"], values["rollout_batch"], values["rollout_on_failure"],
                           values["rollout_cache_proof"])


def refuse_unbatched(rollout_section: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    """deploy.py: a rollout is set but no `rigkit deploy` drives this run, so pyinfra would upgrade every rig at
    once, the outage the canary is there to prevent. Refused before any rig is touched."""
    canary, batch = rollout_section["rollout_canary"], rollout_section["rollout_batch"]
    if (canary or batch) and not environ.get(ROLLOUT_STEP_ENV):
        raise ConfigError("rollout_canary" if canary else "rollout_batch", canary or batch,
                          "a rollout is set, and plain pyinfra deploys every rig at once (only rigkit deploy "
                          "runs canaries and batches)",
                          "run `rigkit deploy INVENTORY` instead, or pass --data rollout_canary=0 --data "
                          "rollout_batch=0 to deploy every rig at once deliberately")


# --- the plan -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Stage:
    label: str  # "canary", "batch 1", ... or "all at once"
    rigs: tuple[str, ...]

    @property
    def canary(self) -> bool:
        return self.label == CANARY


def plan_stages(rigs: Sequence[str], canary: int, batch: int) -> list[Stage]:
    """The canary stage (the first ``canary`` rigs, in inventory order), then batches of ``batch`` (0: the rest
    at once). The order is the inventory's, so a re-run plans the same stages."""
    rigs = list(rigs)
    if not (canary or batch):
        return [Stage(ALL_AT_ONCE, tuple(rigs))]
    stages = [Stage(CANARY, tuple(rigs[:canary]))] if canary else []
    rest = rigs[canary:]
    size = batch or len(rest)
    stages += [Stage(f"batch {i // size + 1}", tuple(rest[i:i + size])) for i in range(0, len(rest), size)]
    return stages


@dataclass(frozen=True)
class RigState:
    """What a rig says before and after each stage: the verified rendering it runs ("" when none: never
    deployed, or a release killed before it was verified), its ledger's current release; or why it is unreadable."""

    verified: str = ""
    current: Optional[Release] = None
    unreadable: str = ""

    def release_words(self) -> str:
        if self.unreadable:
            return f"unreadable ({self.unreadable})"
        if self.current is None:
            return "no release"
        digest = self.current.image.rpartition("@")[2].removeprefix("sha256:")[:SHORT_DIGEST]
        return f"{digest} {self.current.kind} smoke={self.current.smoke or '-'}"


def state_command() -> str:
    from rigkit.ledger import LEDGER_PATH
    from rigkit.stack import RELEASE_HASH_FILE

    return f"cat {RELEASE_HASH_FILE} 2>/dev/null; echo {STATE_SEPARATOR}; cat {LEDGER_PATH} 2>/dev/null; true"


def parse_rig_state(output: str) -> RigState:
    """state_command's output as a RigState."""
    verified, separator, ledger_text = output.partition(STATE_SEPARATOR)
    if not separator:
        return RigState(unreadable="the state command printed nothing")
    try:
        current = Ledger.from_json(ledger_text).current
    except (ValueError, TypeError) as exc:
        return RigState(verified=verified.strip(), unreadable=f"its ledger does not parse: {exc}")
    return RigState(verified=verified.strip(), current=current)


# --- the local record -------------------------------------------------------------------------------------

def fingerprint(wanted: Mapping[str, str]) -> str:
    """One rollout = one set of wanted renderings over one set of rigs."""
    return hashlib.sha256(json.dumps(dict(sorted(wanted.items()))).encode()).hexdigest()[:16]


@dataclass
class RolloutRecord:
    target: str  # fingerprint(wanted)
    inventory: str
    # rig -> {"rendering": verified hash, "image": current image} when this rollout first read it
    before: dict[str, dict[str, str]] = field(default_factory=dict)
    upgraded: list[str] = field(default_factory=list)  # rigs this rollout brought onto their wanted rendering
    proven: list[str] = field(default_factory=list)  # canaries whose cache proof passed on the wanted rendering
    halted: str = ""  # the last run's halt, in words ("" while running or after it completed)
    # rig -> the routers this rollout took it out of and has not put it back into (rigkit.rollout_drain)
    out_of_router: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"schema": RECORD_SCHEMA, **asdict(self)}, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Optional["RolloutRecord"]:
        """None for a record this rigkit cannot read (another schema, damaged): a new rollout starts."""
        try:
            data = json.loads(text)
            if data.pop("schema", None) != RECORD_SCHEMA:
                return None
            return cls(**data)
        except (ValueError, TypeError):
            return None


def resume_record(existing: Optional[RolloutRecord], inventory: str, wanted: Mapping[str, str],
                  states: Mapping[str, RigState]) -> RolloutRecord:
    """The record of the same rollout (same wanted renderings), or a new one holding every rig's state now."""
    target = fingerprint(wanted)
    if existing is not None and existing.target == target:
        for rig in wanted:  # a rig the killed run never read
            existing.before.setdefault(rig, _before(states[rig]))
        return existing
    return RolloutRecord(target=target, inventory=inventory, before={rig: _before(states[rig]) for rig in wanted})


def _before(state: RigState) -> dict[str, str]:
    return {"rendering": state.verified, "image": state.current.image if state.current else ""}


def record_path(inventory: str, directory: Path = ROLLOUTS_DIR) -> Path:
    return directory / f"{Path(inventory).stem}.json"


def save_record(record: RolloutRecord, path: Path) -> None:
    """Written whole, then renamed: a controller killed while writing leaves the previous record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(record.to_json())
    partial.replace(path)


# --- decisions per stage ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StageWork:
    deploy: tuple[str, ...]  # rigs to run deploy.py on
    prove: tuple[str, ...]  # canaries to prove the cache on
    already: tuple[str, ...]  # rigs already verified on their wanted rendering (left alone)


def stage_work(stage: Stage, states: Mapping[str, RigState], wanted: Mapping[str, str], proven: Sequence[str],
               recheck_canaries: bool = False, cache_proof: bool = True) -> StageWork:
    """What a stage still has to do, from where its rigs stand: a rig on its wanted rendering is not deployed
    again, a canary that passed its proof is not proven again, unless ``recheck_canaries``."""
    on_target = [rig for rig in stage.rigs if states[rig].verified == wanted[rig]]
    deploy = [rig for rig in stage.rigs if rig not in on_target]
    if not stage.canary:
        return StageWork(tuple(deploy), (), tuple(on_target))
    if recheck_canaries:
        deploy = list(stage.rigs)
    # a canary deployed again (rolled back since its proof, say) is proven again
    prove = [rig for rig in stage.rigs if cache_proof and (recheck_canaries or rig not in proven or rig in deploy)]
    return StageWork(tuple(deploy), tuple(prove), tuple(r for r in on_target if r not in deploy))


@dataclass(frozen=True)
class Proof:
    passed: bool
    words: str  # what it proved, or why not


@dataclass(frozen=True)
class Failure:
    rig: str
    step: str
    why: str


def stage_failures(work: StageWork, outcomes: Mapping[str, Any], states: Mapping[str, RigState],
                   wanted: Mapping[str, str], proofs: Mapping[str, Proof]) -> list[Failure]:
    """Every rig of the stage that halts the rollout: its run failed (``outcomes``: rigkit.fleet.RigOutcome by
    rig), it does not run its wanted rendering afterwards, or its cache proof failed."""
    from rigkit.fleet import OK

    failures = []
    for rig in dict.fromkeys(work.deploy + work.prove):
        outcome = outcomes.get(rig)
        if outcome is not None and outcome.status != OK:
            failures.append(Failure(rig, outcome.step or outcome.status, outcome.reason or outcome.status))
        elif states[rig].unreadable:
            failures.append(Failure(rig, "read the rig", states[rig].unreadable))
        elif states[rig].verified != wanted[rig]:
            got = states[rig].verified[:SHORT_DIGEST] or "none"
            failures.append(Failure(rig, "verify", NOT_ON_RELEASE.format(got=got)))
        elif rig in proofs and not proofs[rig].passed:
            failures.append(Failure(rig, "cache proof", PROOF_FAILED.format(why=proofs[rig].words)))
    return failures


def newly_upgraded(record: RolloutRecord, rigs: Sequence[str], states: Mapping[str, RigState],
                   wanted: Mapping[str, str]) -> list[str]:
    """Rigs of ``rigs`` now verified on their wanted rendering that ran another one when the rollout began."""
    return [rig for rig in rigs if states[rig].verified == wanted[rig]
            and record.before[rig]["rendering"] != wanted[rig] and rig not in record.upgraded]


def rollback_choice(on_failure: str, record: RolloutRecord, states: Mapping[str, RigState],
                    wanted: Mapping[str, str]) -> tuple[list[str], list[tuple[str, str]]]:
    """(rigs to roll back, [(rig, why it is left)]) for the rigs this rollout upgraded, after a halt."""
    upgraded = [rig for rig in record.upgraded if states[rig].verified == wanted[rig]]
    if on_failure != ROLLOUT_ROLLBACK:
        return [], [(rig, f"left on the new release (rollout_on_failure={ROLLOUT_LEAVE})") for rig in upgraded]
    roll_back, left = [], []
    for rig in upgraded:
        if record.before[rig]["rendering"]:
            roll_back.append(rig)
        else:
            left.append((rig, "left on the new release: it ran no verified release before this rollout"))
    # on it before this record began (another run, another controller): whose upgrade it was is unknown
    left += [(rig, "left on the new release: it ran it already when this rollout's record began "
                   "(roll it back by hand if this rollout upgraded it)")
             for rig, before in record.before.items() if before["rendering"] == wanted.get(rig)
             and states.get(rig, RigState()).verified == wanted[rig]]
    return roll_back, left


def rolled_back_words(rig: str, record: RolloutRecord, state: RigState) -> tuple[bool, str]:
    """Whether rollback.py brought ``rig`` back to the rendering it verified before the rollout, in words."""
    before = record.before[rig]
    if state.verified and state.verified == before["rendering"]:
        return True, f"{rig}: rolled back, serves {state.release_words()} (as before the rollout)"
    got = state.unreadable or (state.verified[:SHORT_DIGEST] or "no verified rendering")
    return False, (f"{rig}: NOT back on its release from before the rollout ({before['image']}, rendering "
                   f"{before['rendering'][:SHORT_DIGEST]}): now {got}; roll it back by hand: pyinfra -y INVENTORY "
                   f"rollback.py --limit {rig} --data rollback_to={before['image']}")


# --- the summary ------------------------------------------------------------------------------------------

@dataclass
class StageResult:
    stage: Stage
    work: StageWork
    proofs: dict[str, Proof] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)


def summary_width(columns: Optional[int] = None) -> int:
    columns = shutil.get_terminal_size((100, 24)).columns if columns is None else columns
    return max(MIN_WIDTH, min(MAX_WIDTH, columns))


def _wrapped(text: str, width: int, indent: str = "  ") -> list[str]:
    return textwrap.wrap(" ".join(text.split()), width=width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_long_words=True, break_on_hyphens=False) or [indent]


def format_summary(settings: RolloutSettings, stages: Sequence[Stage], results: Sequence[StageResult],
                   states: Mapping[str, RigState], left: Sequence[tuple[str, str]] = (),
                   rollback_lines: Sequence[str] = (), width: int = 100, router_lines: Sequence[str] = ()) -> str:
    """What happened, stage by stage, and what to do next; no line longer than ``width``."""
    lines = [f"--> rigkit rollout: {settings.describe()}"]
    done = {result.stage.label: result for result in results}
    halted = next((result for result in results if result.failures), None)
    for index, stage in enumerate(stages, 1):
        head = f"{stage.label} ({index}/{len(stages)}): {', '.join(stage.rigs)}"
        result = done.get(stage.label)
        if result is None:
            lines += _wrapped(f"{head}: not reached, untouched (each serves its old release)", width, "")
            continue
        lines += _wrapped(f"{head}: {'HALTED' if result.failures else 'passed'}", width, "")
        failed = {failure.rig for failure in result.failures}
        for rig in stage.rigs:
            if rig in failed:
                continue
            what = ("already on this release, left alone" if rig in result.work.already
                    else "upgraded and verified" if rig in result.work.deploy else "on this release")
            proof = result.proofs.get(rig)
            if proof is not None:
                what += f"; {proof.words}"
            elif stage.canary and rig not in result.work.prove and settings.cache_proof:
                what += "; cache proof passed in an earlier run (--recheck-canaries proves it again)"
            lines += _wrapped(f"{rig}: {what}; now {states[rig].release_words()}", width)
    lines += [line for text in router_lines for line in _wrapped(text, width)]
    if halted is None:
        lines.append(f"rollout complete: {sum(len(s.rigs) for s in stages)} rigs on the new release")
        return "\n".join(lines)
    stage = halted.stage
    lines.append("")
    lines += _wrapped(f"HALTED in {stage.label} ({stages.index(stage) + 1} of {len(stages)}):", width, "")
    for failure in halted.failures:
        lines += _wrapped(f"{failure.rig} failed at step \"{failure.step}\": {failure.why}", width)
        lines += _wrapped(f"{failure.rig} now serves: {states[failure.rig].release_words()}", width, "    ")
    for rig, why in left:
        lines += _wrapped(f"{rig}: {why}", width)
    lines += [line for text in rollback_lines for line in _wrapped(text, width)]
    lines += _wrapped("Next: fix what the failed rig reports (its own log: docker logs rigkit-serving), then run "
                      "the same command again: the rollout continues from where the fleet stands; rigs already "
                      "verified on the new release are not deployed again.", width, "")
    return "\n".join(lines)


# --- the thin parts: pyinfra runs, SSH reads, the cache proof through the tunnel ------------------------------

def read_states(hosts: Mapping[str, Mapping], rigs: Sequence[str]) -> dict[str, RigState]:
    """Every rig's state, in parallel, one SSH round trip each."""
    from rigkit.tunnel import connect_ssh

    command = state_command()

    def read(rig: str) -> RigState:
        try:
            client = connect_ssh(hosts[rig]["data"], rig)
        except Exception as exc:  # a rig that is down is a state, not a crash of the rollout
            return RigState(unreadable=str(exc))
        try:
            _, stdout, _ = client.exec_command(command, timeout=30)
            return parse_rig_state(stdout.read().decode())
        except Exception as exc:
            return RigState(unreadable=f"{type(exc).__name__}: {exc}")
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(rigs)))) as pool:
        return dict(zip(rigs, pool.map(read, rigs)))


def proof_verdict(validation: Any, connector_configured: bool) -> Proof:
    """A short cache proof's verdict (rigkit.validation.TierValidation) in words."""
    from rigkit.tiers import Tier

    problems = list(validation.failures)
    proved = []
    expected = [Tier.COLD, Tier.WARM_GPU] + ([Tier.WARM_CONNECTOR] if connector_configured else [])
    for tier in expected:
        run = validation.tier(tier)
        if run is None or not run.labels:
            problems.append(f"{tier.value}: not measured")
            continue
        result = run.result()
        got = run.labels[-1]
        if not result.passed:
            aborted = f", request aborted in {result.aborted[0]}" if result.aborted else ""
            problems.append(f"{tier.value} expected, measured {got.tier.value} (GPU hits +{got.gpu_hits:.0f}, "
                            f"external hits +{got.external_hits:.0f}{aborted})")
        elif tier == Tier.WARM_GPU:
            proved.append(f"warm-gpu +{got.gpu_hits:.0f} GPU hits")
        elif tier == Tier.WARM_CONNECTOR:
            proved.append(f"warm-connector +{got.external_hits:.0f} external hits after "
                          f"{validation.fillers_sent} fillers")
    if problems:
        return Proof(False, "; ".join(problems))
    scope = "" if connector_configured else " (no KV connector: GPU prefix cache only)"
    return Proof(True, "cache proof passed: " + ", ".join(proved) + scope)


def prove_cache(client: Any, data: Mapping[str, Any], connector_configured: bool,
                ready_timeout_s: float = PROOF_READY_TIMEOUT_S) -> Proof:
    """validate.py's tier procedure cut short: one salted session, no restart, no soak or A/B."""
    from rigkit.validation import ValidationSettings, validate_tiers

    settings = replace(ValidationSettings.from_data(data), sessions=1, restart=False, decode_ab=False,
                       soak_sessions=0)
    try:
        client.wait_ready(timeout_s=ready_timeout_s)
        return proof_verdict(validate_tiers(client, None, settings, connector_configured=connector_configured),
                             connector_configured)
    except Exception as exc:  # a dead engine, a refused request: the proof failed, in its own words
        return Proof(False, f"{type(exc).__name__}: {exc}")


def prove_rig(rig: str, data: Mapping[str, Any], stack: Any) -> Proof:
    """The cache proof on one rig, through the SSH tunnel to its serving API (rigkit.tunnel)."""
    from rigkit.client import ServingClient
    from rigkit.tunnel import serving_url

    knobs = stack.knobs
    try:
        with serving_url(data, knobs["bind_address"], knobs["serving_port"], inventory_name=rig) as url:
            client = ServingClient(url, model=knobs["served_model_name"])
            return prove_cache(client, data, stack.profile.connector is not None)
    except Exception as exc:  # the tunnel itself
        return Proof(False, f"{type(exc).__name__}: {exc}")


@contextlib.contextmanager
def rollout_step(label: str) -> Iterator[None]:
    """Marks the pyinfra runs started inside as driven by rigkit deploy (deploy.py checks it)."""
    previous = os.environ.get(ROLLOUT_STEP_ENV)
    os.environ[ROLLOUT_STEP_ENV] = label
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ROLLOUT_STEP_ENV, None)
        else:
            os.environ[ROLLOUT_STEP_ENV] = previous


def without_limits(pyinfra_args: Sequence[str]) -> list[str]:
    """The operator's pyinfra arguments minus --limit (each stage passes its own rigs)."""
    from rigkit.fleet import split_limits

    args, out = split_limits(pyinfra_args), []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--limit":
            skip = True
        else:
            out.append(arg)
    return out


def data_pairs(pyinfra_args: Sequence[str]) -> list[str]:
    """The KEY=VALUE of every --data, as pyinfra reads them."""
    pairs = []
    for i, arg in enumerate(pyinfra_args):
        if arg == "--data" and i + 1 < len(pyinfra_args):
            pairs.append(pyinfra_args[i + 1])
        elif arg.startswith("--data="):
            pairs.append(arg.split("=", 1)[1])
    return pairs


def run_stage_deploy(label: str, deploy: str, rigs: Sequence[str], inventory: str, passthrough: Sequence[str],
                     run: Optional[Callable] = None) -> dict[str, Any]:
    """pyinfra on ``rigs`` only; rigkit.fleet.RigOutcome by rig."""
    from rigkit import fleet

    run = fleet.run_pyinfra_streaming if run is None else run
    limits = [arg for rig in rigs for arg in ("--limit", rig)]
    print(f"\n--> rigkit rollout, {label}: {deploy} on {', '.join(rigs)}", flush=True)
    with rollout_step(label):
        _, output = run([fleet.pyinfra_executable(), "-y", *passthrough, *limits, inventory, deploy])
    return fleet.summarize(output, rigs)


def run_rollout(inventory: str, deploy: str, pyinfra_args: Sequence[str], hosts: Mapping[str, Mapping],
                names: Sequence[str], settings: RolloutSettings, recheck_canaries: bool = False,
                records: Path = ROLLOUTS_DIR) -> tuple[int, str]:
    """The rollout over ``names`` (targeted rigs, connection data checked); (exit status, summary). With a router
    in the inventory each rig leaves it for its deploy (rigkit.rollout_drain)."""
    from rigkit import rollout_drain
    from rigkit.hostdata import rig_settings
    from rigkit.stack import rendering_for

    rigs = {name: rig_settings(dict(hosts[name]["data"])) for name in names}  # bad input: nothing touched yet
    wanted = {name: rendering_for(rig.stack).hash for name, rig in rigs.items()}
    stages = plan_stages(names, settings.canary, settings.batch)
    path = record_path(inventory, records)
    existing = RolloutRecord.from_json(path.read_text()) if path.exists() else None
    out_of_router = existing.out_of_router if existing is not None else {}
    with rollout_drain.router_session(hosts, names, out_of_router) as router:
        router.refuse_full_drain(stages)  # before any rig is touched
        states = read_states(hosts, names)
        unreadable = {name: state.unreadable for name, state in states.items() if state.unreadable}
        if unreadable:
            rig, why = next(iter(unreadable.items()))
            raise ConfigError(f"{rig}", why, "cannot be read before the rollout starts (it would fail in its "
                              "batch)", f"bring {', '.join(unreadable)} back, or leave it out with --limit")
        record = resume_record(existing, inventory, wanted, states)
        record.halted, record.out_of_router = "", router.out
        save_record(record, path)
        passthrough = without_limits(pyinfra_args)
        results: list[StageResult] = []
        for stage in stages:
            work = stage_work(stage, states, wanted, record.proven, recheck_canaries, settings.cache_proof)
            results.append(result := _run_stage(stage, work, router, record, path, hosts, rigs, states, wanted,
                                                inventory, deploy, passthrough))
            if result.failures:
                break
        halted = next((result for result in results if result.failures), None)
        left: list[tuple[str, str]] = []
        rollback_lines: list[str] = []
        if halted is not None:
            roll_back, left = rollback_choice(settings.on_failure, record, states, wanted)
            # through a router one rig at a time, each drained and restored; without one, in one run
            for group in ([[rig] for rig in roll_back] if router.active else [roll_back] if roll_back else []):
                rollback_lines += _roll_back(group, router, record, hosts, states, inventory, passthrough)
            record.halted = f"{halted.stage.label}: " + "; ".join(f"{f.rig} at {f.step}" for f in halted.failures)
            save_record(record, path)
        summary = format_summary(settings, stages, results, states, left, rollback_lines, summary_width(),
                                 router_lines=([router.describe()] if router.active else []) + router.lines)
    return (1 if halted is not None else 0), summary


def _run_stage(stage: Stage, work: StageWork, router: Any, record: RolloutRecord, path: Path,
               hosts: Mapping[str, Mapping], rigs: Mapping[str, Any], states: dict[str, RigState],
               wanted: Mapping[str, str], inventory: str, deploy: str, passthrough: Sequence[str]) -> StageResult:
    """One stage: drain, deploy (which smokes), read, prove the canaries, restore the rigs that passed."""
    from rigkit.fleet import OK
    from rigkit.rollout_drain import DRAIN_STEP, RESTORE_STEP

    not_drained = {rig: why for rig in work.deploy if (why := router.drain(rig))}
    record.out_of_router = router.out
    save_record(record, path)
    work = replace(work, deploy=tuple(r for r in work.deploy if r not in not_drained),
                   prove=tuple(r for r in work.prove if r not in not_drained))
    result = StageResult(stage, work)
    outcomes = run_stage_deploy(stage.label, deploy, work.deploy, inventory, passthrough) if work.deploy else {}
    states.update(read_states(hosts, stage.rigs))
    record.upgraded += newly_upgraded(record, stage.rigs, states, wanted)
    save_record(record, path)
    for rig in work.prove:
        if (rig in outcomes and outcomes[rig].status != OK) or states[rig].verified != wanted[rig]:
            continue  # failed already: stage_failures names why
        print(f"--> rigkit rollout, {stage.label}: cache proof on {rig}", flush=True)
        result.proofs[rig] = proof = prove_rig(rig, hosts[rig]["data"], rigs[rig].stack)
        if proof.passed and rig not in record.proven:
            record.proven.append(rig)
        save_record(record, path)
    result.failures = [Failure(rig, DRAIN_STEP, why) for rig, why in not_drained.items()]
    result.failures += stage_failures(work, outcomes, states, wanted, result.proofs)
    failed = {failure.rig: failure.step for failure in result.failures}
    for rig in stage.rigs:
        if rig in failed:
            router.keep_out(rig, f"it failed at {failed[rig]}")
        elif why := router.restore(rig):
            result.failures.append(Failure(rig, RESTORE_STEP, why))
    record.out_of_router = router.out
    save_record(record, path)
    return result


def _roll_back(group: Sequence[str], router: Any, record: RolloutRecord, hosts: Mapping[str, Mapping],
               states: dict[str, RigState], inventory: str, passthrough: Sequence[str]) -> list[str]:
    """rollback.py on ``group`` (drained first, restored when back on its release); the summary's lines."""
    lines = []
    not_drained = {rig: why for rig in group if (why := router.drain(rig))}
    lines += [f"{rig}: not rolled back ({why})" for rig, why in not_drained.items()]
    group = [rig for rig in group if rig not in not_drained]
    if group:
        run_stage_deploy("rollback", "rollback.py", group, inventory, passthrough)
        states.update(read_states(hosts, group))
    for rig in group:
        back, words = rolled_back_words(rig, record, states[rig])
        lines.append(words)
        if back:  # no longer on the release: a re-run deploys and proves it again
            record.upgraded.remove(rig)
            record.proven = [r for r in record.proven if r != rig]
            if why := router.restore(rig):
                router.keep_out(rig, f"the router did not take it back: {why}")
        else:
            router.keep_out(rig, "its rollback failed")
    record.out_of_router = router.out
    return lines


def rollout_command(args: Any) -> Optional[int]:
    """`rigkit deploy` with a rollout asked (flags or data): run it and print its summary; None when no rollout
    is asked (rigkit.fleet then runs every rig at once). ConfigError before any rig is touched."""
    from rigkit import fleet
    from rigkit.kv_share import check_inventory
    from rigkit.router_admin import rigs_only
    from rigkit.variables import resolve

    flags = {"rollout_canary": args.canary, "rollout_batch": args.batch, "rollout_on_failure": args.on_failure}
    asked = any(value is not None for value in flags.values()) or bool(args.recheck_canaries)
    if Path(args.deploy).name != fleet.DEFAULT_DEPLOY:
        if asked:
            raise ConfigError("--deploy", args.deploy, "a rollout batches deploy.py only",
                              "run it without --canary/--batch/--on-failure/--recheck-canaries (with --limit to "
                              "choose the rigs)")
        return None  # rollout data applies to deploys, not to rollback.py
    pyinfra_args = fleet.split_limits(args.pyinfra_args)
    hosts = fleet.load_inventory(args.inventory, data_args=data_pairs(pyinfra_args))
    check_inventory((name, host["groups"], host["data"]) for name, host in hosts.items())
    names = rigs_only(hosts, fleet.targeted(hosts, fleet.limit_from(pyinfra_args)))  # a router host is no rig
    if not names:
        return None  # fleet_deploy refuses it, naming the inventory's hosts
    sections = {name: resolve(ROLLOUT_VARIABLES, dict(hosts[name]["data"])) for name in names}
    settings = rollout_settings(sections, flags)
    if not settings.active:
        return None
    for name in names:
        fleet.check_connection_data(name, hosts[name]["data"])
    status, summary = run_rollout(args.inventory, args.deploy, pyinfra_args, hosts, names, settings,
                                  recheck_canaries=bool(args.recheck_canaries))
    print("\n" + summary)
    return status
