"""rigkit.validation.power: each damage changes what it says it changes, a safetensors header survives, the files a
request stored are the ones that appeared, and the smallest damage caught is read from the rows."""

from __future__ import annotations

import json
import random
import struct

import pytest

from rigkit.validation.card import PowerRow
from rigkit.validation.power import (
    DAMAGE_NAMES,
    FEW_BLOCKS,
    FEW_BYTES,
    LocalStore,
    SelfTest,
    clean_up_selftest,
    damage_bytes,
    new_files,
    payload_span,
    settled_files,
    smallest_caught,
)
from rigkit.validation.tier_run import TierRun
from rigkit.validation.tiers import Tier


def safetensors(payload: bytes) -> bytes:
    header = json.dumps({"kv": {"dtype": "BF16", "shape": [len(payload) // 2], "data_offsets": [0, len(payload)]}})
    return struct.pack("<Q", len(header)) + header.encode() + payload


def changed(a: bytes, b: bytes) -> list[int]:
    return [i for i, (x, y) in enumerate(zip(a, b)) if x != y]


def test_a_safetensors_payload_is_its_tensor_data_and_any_other_file_is_whole():
    data = safetensors(bytes(64))
    assert payload_span(data) == (len(data) - 64, len(data))
    assert payload_span(b"\x00" * 40) == (0, 40)
    assert payload_span(b"\xff" * 40) == (0, 40)  # a length no header has


@pytest.mark.parametrize("damage", DAMAGE_NAMES)
def test_every_damage_stays_in_the_payload_and_changes_something(damage):
    original = safetensors(bytes(range(256)) * 16)
    data = bytearray(original)
    count = damage_bytes(data, damage, layers=8, rng=random.Random(1))
    start, _ = payload_span(original)
    where = changed(original, bytes(data))
    assert count > 0 and where and min(where) >= start and len(data) == len(original)


def test_each_damage_has_its_size():
    size = 4096
    rng = random.Random(1)
    every = bytearray(size)
    assert damage_bytes(every, "every-block", 8, rng) == size // 2
    assert (
        max(changed(bytes(size), bytes(every))) < size * 3 // 4 and min(changed(bytes(size), bytes(every))) >= size // 4
    )
    few = bytearray(size)
    assert damage_bytes(few, "few-bytes", 8, rng) == FEW_BYTES
    assert len(changed(bytes(size), bytes(few))) <= FEW_BYTES
    layer = bytearray(size)
    assert damage_bytes(layer, "one-layer", 8, rng) == size // 8 // 2  # one sign byte per 16-bit element
    where = changed(bytes(size), bytes(layer))
    assert all(layer[i] == 0x80 and i % 2 == 1 for i in where) and where[0] == size // 8 * 4 + 1
    with pytest.raises(ValueError, match="unknown damage 'other'"):
        damage_bytes(bytearray(16), "other", 8, rng)


def test_a_few_blocks_damages_that_many_files_and_the_others_every_file(tmp_path):
    for i in range(7):
        (tmp_path / f"block{i}").write_bytes(bytes(1024))
    store = LocalStore(tmp_path)
    names = sorted(store.files())
    assert store.damage(names, "few-blocks", 8) == (FEW_BLOCKS, FEW_BLOCKS * 1024)
    assert sum(1 for n in names if (tmp_path / n).read_bytes() != bytes(1024)) == FEW_BLOCKS
    assert store.damage(names, "few-bytes", 8) == (7, 7 * FEW_BYTES)


def test_the_files_a_request_stored_are_those_that_appeared():
    assert new_files({"a": 1, "b": 2}, {"a": 5, "b": 2, "c": 3, "d": 1}) == ["c", "d"]
    assert new_files({"a": 1}, {"a": 1}) == []


def test_a_store_is_settled_once_it_stops_changing():
    states = iter([{"a": 1}, {"a": 1, "b": 1}, {"a": 1, "b": 2}, {"a": 1, "b": 2}, {"a": 9}])

    class Store:
        def files(self):
            return next(states)

    now = [0.0]
    assert settled_files(Store(), clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)) == {
        "a": 1,
        "b": 2,
    }


def row(damage: str, caught: bool) -> PowerRow:
    return PowerRow(damage=damage, description="", files=1, bytes_damaged=1, label="x", verdict="x", caught=caught)


def test_the_smallest_damage_caught_is_the_last_before_the_first_miss():
    assert smallest_caught([row("every-block", True), row("one-layer", True), row("few-bytes", False)]) == "one-layer"
    assert smallest_caught([row("every-block", True), row("few-bytes", True)]) == "few-bytes"
    assert smallest_caught([row("every-block", False)]) is None
    # the H100's unsure model on LMCache's L2: one layer missed, a few bytes caught (NaN logits): not a finer check
    missed_one_layer = [
        row("every-block", True),
        row("one-layer", False),
        row("few-blocks", True),
        row("few-bytes", True),
    ]
    assert smallest_caught(missed_one_layer) == "every-block"


def test_the_self_tests_damaged_entries_are_deleted_and_nothing_else(tmp_path):
    for name in ("s1/a", "s1/b", "s2/a", "measured/a"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"kv")
    selftest = SelfTest(TierRun(Tier.COLD), TierRun(Tier.WARM_GPU), [["s1/a", "s1/b"], ["s2/a", "gone/x"]])
    assert clean_up_selftest(LocalStore(tmp_path), selftest) == 3
    assert sorted(LocalStore(tmp_path).files()) == ["measured/a"]
