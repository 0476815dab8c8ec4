"""The served-right check's power: how small a damage to a tier's store it catches, on this rig and this model.

Self-test sessions of their own (salted, never the measured ones) are prefilled and stored; before the restart that
opens the persistent tier, the files each one stored are damaged, one kind of damage per session (DAMAGES, largest
first); after it, each is asked again and judged by the same verdict as every tier (rigkit.validation.greedy). A
damage is caught when that tier would not pass. The measured sessions' entries are never touched, so the card's own
tiers are proved on an undamaged store. The tier procedure (rigkit.validation.procedure) runs these steps
(prefill_selftest, damage_selftest, measure_power) with its own measured request (Ask).

A damage works on a stored file's payload: a safetensors file's tensor data (its header is kept, so it still
loads), any other file whole. "one layer" flips the sign bit of every 16-bit element in one 1/L slice of each file
(L: the model's layers), as a store laid out layer by layer keeps one layer; in another layout it is the same bytes
of several.
"""

from __future__ import annotations

import json
import os
import random
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Protocol, Sequence

from rigkit.prompts import Prompt, PromptSpec
from rigkit.remote.client import ServingClient
from rigkit.validation.card import Power, PowerRow
from rigkit.validation.greedy import Tolerance
from rigkit.validation.tier_run import TierRun
from rigkit.validation.tiers import Tier

FEW_BLOCKS = 3  # whole stored files overwritten by the "few blocks" damage
FEW_BYTES = 256  # bytes overwritten in each stored file by the "few bytes" damage
DEFAULT_LAYERS = 32  # the slice of "one layer" when the model's layer count is unknown
# Self-test sessions are salted this far above the measured sessions' seeds (seed + index): never one of theirs.
SELFTEST_SEED_OFFSET = 10_000
# Waiting for a connector that writes its store after the request returned (the native fs tier writes through
# asynchronously): the store is settled once its file list and sizes did not change over this long.
SETTLE_S, SETTLE_MAX_S = 1.0, 30.0


@dataclass(frozen=True)
class Damage:
    name: str
    description: str


DAMAGES = (
    Damage("every-block", "the middle half of every stored file random"),
    Damage("one-layer", "one layer's share (1/L) of every stored file sign-flipped"),
    Damage("few-blocks", f"{FEW_BLOCKS} stored files random, the rest untouched"),
    Damage("few-bytes", f"{FEW_BYTES} bytes in the middle of every stored file random"),
)
DAMAGE_NAMES = tuple(d.name for d in DAMAGES)


def payload_span(data: bytes) -> tuple[int, int]:
    """(start, end) of a stored file's payload: a safetensors file's tensor data, else the whole file."""
    if len(data) >= 8:
        header_size = struct.unpack("<Q", data[:8])[0]
        if 2 <= header_size <= len(data) - 8 and data[8:9] == b"{":
            try:
                json.loads(data[8 : 8 + header_size])
            except ValueError:
                pass
            else:
                return 8 + header_size, len(data)
    return 0, len(data)


def damage_bytes(data: bytearray, damage: str, layers: int, rng: random.Random) -> int:
    """Damage one stored file's bytes in place (module docstring); returns how many bytes changed."""
    start, end = payload_span(data)
    size = end - start
    if size <= 0:
        return 0
    if damage == "every-block":
        offset, count = start + size // 4, size // 2
    elif damage == "few-bytes":
        count = min(FEW_BYTES, size)
        offset = start + (size - count) // 2
    elif damage == "few-blocks":
        offset, count = start, size
    elif damage == "one-layer":
        share = size // max(layers, 1)
        first = start + share * (max(layers, 1) // 2)
        first += (first - start) % 2  # on an element boundary
        flipped = 0
        for sign in range(first + 1, min(first + share, end), 2):
            data[sign] ^= 0x80
            flipped += 1
        return flipped
    else:
        raise ValueError(f"unknown damage {damage!r}; known: {', '.join(DAMAGE_NAMES)}")
    data[offset : offset + count] = rng.randbytes(count)
    return count


class StoreAccess(Protocol):
    """A connector's store as validation can reach it: list its files, damage some of them."""

    def files(self) -> Mapping[str, int]: ...

    def damage(self, names: Sequence[str], damage: str, layers: int) -> tuple[int, int]: ...

    def remove(self, names: Sequence[str]) -> int: ...


@dataclass
class LocalStore:
    """A store directory this process can read and write (the GPU check's host directory, the lab rig's through
    /proc/<pid>/root)."""

    root: Path
    seed: int = 20261206

    def files(self) -> dict[str, int]:
        return {str(p.relative_to(self.root)): p.stat().st_size for p in self.root.rglob("*") if p.is_file()}

    def damage(self, names: Sequence[str], damage: str, layers: int) -> tuple[int, int]:
        """(files changed, bytes changed): "few-blocks" takes FEW_BLOCKS of `names` (the middle ones), the others
        every one."""
        rng = random.Random(self.seed)
        chosen = sorted(names)
        if damage == "few-blocks" and len(chosen) > FEW_BLOCKS:
            middle = (len(chosen) - FEW_BLOCKS) // 2
            chosen = chosen[middle : middle + FEW_BLOCKS]
        files = changed = 0
        for name in chosen:
            path = self.root / name
            data = bytearray(path.read_bytes())
            count = damage_bytes(data, damage, layers, rng)
            if count:
                path.write_bytes(bytes(data))
                os.sync()
                files, changed = files + 1, changed + count
        return files, changed

    def remove(self, names: Sequence[str]) -> int:
        """The files of `names` that were there, deleted; their count."""
        removed = 0
        for name in names:
            path = self.root / name
            if path.is_file():
                path.unlink()
                removed += 1
        os.sync()
        return removed


def settled_files(store: StoreAccess, clock: Callable[[], float] = time.monotonic, sleep=time.sleep) -> dict:
    """The store's files once they stopped changing (SETTLE_S), or as they are after SETTLE_MAX_S."""
    deadline, last = clock() + SETTLE_MAX_S, dict(store.files())
    while clock() < deadline:
        sleep(SETTLE_S)
        now = dict(store.files())
        if now == last:
            return now
        last = now
    return last


def new_files(before: Mapping[str, int], after: Mapping[str, int]) -> list[str]:
    """Files a request stored: those that appeared (an entry rewritten in place is not the request's own)."""
    return sorted(set(after) - set(before))


def clean_up_selftest(store: StoreAccess, selftest: SelfTest) -> int:
    """The self-test's damaged entries deleted: nothing asks for them again, and no engine may load them."""
    return store.remove([name for names in selftest.stored for name in names])


def smallest_caught(rows: Sequence, order: Sequence[str] = DAMAGE_NAMES) -> Optional[str]:
    """The smallest damage of `order` (largest first) caught with every larger one caught too; None when the largest
    was missed. A smaller damage caught past a miss (a few bytes giving NaN logits) does not make the check finer."""
    caught = {row.damage: row.caught for row in rows}
    smallest = None
    for name in (name for name in order if name in caught):
        if not caught[name]:
            break
        smallest = name
    return smallest


class Ask(Protocol):
    """The procedure's measured request: one prompt asked, its /metrics window labelled, all kept in `run`."""

    def __call__(self, run: TierRun, prompt: Prompt, after_restart: bool = False) -> None: ...


@dataclass
class SelfTest:
    """The self-test sessions, one per damage (DAMAGES order): their cold and warm-gpu runs (the references a damaged
    session is judged against) and the store files each one's prefill added."""

    cold: TierRun
    warm_gpu: TierRun
    stored: list[list[str]]


def prefill_selftest(
    client: ServingClient, store: StoreAccess, prompt_kind: str, prompt_tokens: int, seed: int, ask: Ask
) -> SelfTest:
    """One salted session per damage: cold, then warm-gpu, and the store files its prefill added, read once the store
    settled."""
    cold, warm_gpu = TierRun(Tier.COLD), TierRun(Tier.WARM_GPU)
    stored: list[list[str]] = []
    for index, _ in enumerate(DAMAGES):
        prompt = client.build_prompt(PromptSpec(prompt_kind, prompt_tokens, seed + SELFTEST_SEED_OFFSET + index))
        before = settled_files(store)
        ask(cold, prompt)
        ask(warm_gpu, prompt)
        stored.append(new_files(before, settled_files(store)))
    return SelfTest(cold, warm_gpu, stored)


def damage_selftest(store: StoreAccess, selftest: SelfTest, layers: Optional[int]) -> list[tuple[int, int]]:
    """Each session's stored files damaged by its damage, before the restart; (files, bytes) changed for each."""
    return [
        store.damage(files, damage.name, layers or DEFAULT_LAYERS) for damage, files in zip(DAMAGES, selftest.stored)
    ]


def measure_power(selftest: SelfTest, damaged: Sequence[tuple[int, int]], tolerance: Tolerance, ask: Ask) -> Power:
    """After the restart: each damaged session asked again, judged as the persistent tier is."""
    rows = []
    for damage, prompt, (files, changed) in zip(DAMAGES, selftest.cold.prompts, damaged):
        asked = TierRun(Tier.WARM_PERSISTENT, reference=selftest.cold, same_path=selftest.warm_gpu, tolerance=tolerance)
        ask(asked, prompt, after_restart=True)
        result = asked.result()
        check = result.greedy[0] if result.greedy else None
        rows.append(
            PowerRow(
                damage=damage.name,
                description=damage.description,
                files=files,
                bytes_damaged=changed,
                label=result.counters_label,
                verdict=check.verdict if check else "no output",
                shift_nats=check.shift_nats if check else None,
                caught=not result.passed,
            )
        )
    return Power(
        tier=Tier.WARM_PERSISTENT.value,
        tolerance_nats=tolerance.nats,
        rows=rows,
        smallest_caught=smallest_caught(rows),
        note=tolerance.source,
    )
