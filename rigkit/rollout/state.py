"""What a rig says before and after each stage of a rollout, read over SSH in one round trip: the verified
rendering it runs (rigkit.serving.commands.RELEASE_HASH_FILE) and its ledger's current release."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from rigkit.errors import ConfigError
from rigkit.remote.tunnel import connect_ssh
from rigkit.serving.commands import RELEASE_HASH_FILE
from rigkit.serving.ledger import LEDGER_PATH, Ledger, Release

STATE_SEPARATOR = "--rigkit-ledger--"


@dataclass(frozen=True)
class ReleaseState:
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
        return self.current.summary()


def state_command() -> str:

    return f"cat {RELEASE_HASH_FILE} 2>/dev/null; echo {STATE_SEPARATOR}; cat {LEDGER_PATH} 2>/dev/null; true"


def parse_release_state(output: str) -> ReleaseState:
    """state_command's output as a ReleaseState."""
    verified, separator, ledger_text = output.partition(STATE_SEPARATOR)
    if not separator:
        return ReleaseState(unreadable="the state command printed nothing")
    try:
        current = Ledger.from_json(ledger_text).current
    except (ValueError, TypeError) as exc:
        return ReleaseState(verified=verified.strip(), unreadable=f"its ledger does not parse: {exc}")
    return ReleaseState(verified=verified.strip(), current=current)


def read_states(hosts: Mapping[str, Mapping], rigs: Sequence[str]) -> dict[str, ReleaseState]:
    """Every rig's state, in parallel, one SSH round trip each."""
    command = state_command()

    def read(rig: str) -> ReleaseState:
        try:
            client = connect_ssh(hosts[rig]["data"], rig)
        except Exception as exc:  # a rig that is down is a state, not a crash of the rollout
            return ReleaseState(unreadable=str(exc))
        try:
            _, stdout, _ = client.exec_command(command, timeout=30)
            return parse_release_state(stdout.read().decode())
        except Exception as exc:
            return ReleaseState(unreadable=f"{type(exc).__name__}: {exc}")
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(rigs)))) as pool:
        return dict(zip(rigs, pool.map(read, rigs)))


def refuse_unreadable(states: dict[str, ReleaseState]) -> dict[str, ReleaseState]:
    """``states`` when every rig could be read; else ConfigError naming the first that could not and why: read
    before a rollout (or a rolling rollback) starts, such a rig would fail in its batch."""
    unreadable = {name: state.unreadable for name, state in states.items() if state.unreadable}
    if unreadable:
        rig, why = next(iter(unreadable.items()))
        raise ConfigError(
            f"{rig}",
            why,
            "cannot be read before the rollout starts (it would fail in its batch)",
            f"bring {', '.join(unreadable)} back, or leave it out with --limit",
        )
    return states
