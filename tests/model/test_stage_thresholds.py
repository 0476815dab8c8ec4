"""The stager's threshold and filter, each from both sides (issue 43): the free-space margin at its boundary, and a
staged copy counted as already staged only when it is the pinned revision and undamaged."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rigkit.errors import RigkitError
from rigkit.model import stage
from rigkit.model.stage import STORE_MARGIN_BYTES, FleetStager
from rigkit.settings.model_source import manifest_hash, parse_model_source

COMMIT = "0123456789abcdef0123456789abcdef01234567"
FILES = {"w": {"size": 10 * 10**9, "sha256": "0" * 64}, "config.json": {"size": 2, "sha256": "1" * 64}}
NEEDED = 10 * 10**9 + 2


def stager(rigs=()) -> FleetStager:
    names = list(rigs)
    return FleetStager(
        parse_model_source("org/m@" + COMMIT),
        None,
        FILES,
        {name: {} for name in names},
        {name: "/mnt/rigkit-l2/models" for name in names},
        {name: 2 for name in names},
        progress=lambda line: None,
    )


@pytest.mark.parametrize(
    "free, partial, fits",
    [
        (NEEDED + STORE_MARGIN_BYTES, {}, True),  # exactly the margin left after it
        (NEEDED + STORE_MARGIN_BYTES - 1, {}, False),  # a byte into the margin
        (NEEDED, {}, False),  # fits the disk, not the margin
        (2 + STORE_MARGIN_BYTES, {"w": 10 * 10**9}, True),  # resumed: only what is missing counts
        (1 + STORE_MARGIN_BYTES, {"w": 10 * 10**9}, False),
        (NEEDED + STORE_MARGIN_BYTES - 1, {"w": 20 * 10**9}, True),  # an oversized partial counts as its manifest size
    ],
)
def test_staging_keeps_its_free_space_margin(free, partial, fits):
    store = SimpleNamespace(name="rig1", store="/mnt/rigkit-l2/models")
    state = {"partial": partial, "free": free}
    if fits:
        stager()._preflight(store, state)
    else:
        with pytest.raises(RigkitError) as refused:
            stager()._preflight(store, state)
        assert refused.value.field == "model_store_path" and "GB margin" in refused.value.problem


class FakeStore:
    """A rig's model store answering as rigkit/files/model_store.py does (its state, reopen)."""

    states: dict = {}
    calls: list = []

    def __init__(self, name, data, store, source):
        self.name, self.store = name, store

    def call(self, verb, *args, stdin=None):
        FakeStore.calls.append((self.name, verb))
        if verb == "reopen":
            FakeStore.states[self.name] = {**FakeStore.states[self.name], "verified": None, "damaged": []}
            return {"reopened": ["w"]}
        if verb == "list":
            return []
        return {"partial": {}, "free": 10**13, "store_mount": "/mnt/rigkit-l2", **FakeStore.states[self.name]}

    def close(self):
        pass


@pytest.mark.parametrize(
    "state, already",
    [
        ({"verified": manifest_hash(FILES), "damaged": []}, True),
        ({"verified": manifest_hash(FILES)}, True),
        ({"verified": manifest_hash(FILES), "damaged": [{"path": "w", "why": "missing"}]}, False),
        ({"verified": "f" * 64, "damaged": []}, False),  # another revision's stamp
        ({"verified": None}, False),
    ],
    ids=["verified", "verified-no-damage-key", "damaged", "other-revision", "not-staged"],
)
def test_only_an_undamaged_copy_of_the_pinned_revision_is_already_staged(state, already, monkeypatch):
    FakeStore.states, FakeStore.calls = {"rig1": state}, []
    monkeypatch.setattr(stage, "RigStore", FakeStore)
    monkeypatch.setattr(stage, "check_store_mounted", lambda *args: None)
    staged = []
    monkeypatch.setattr(FleetStager, "_stage_one", lambda self, sender, receiver, stores: staged.append(receiver.name))
    monkeypatch.setattr(FleetStager, "_retain", lambda self, name, store: None)
    report = stager(["rig1"]).stage()
    assert (report.outcomes.get("rig1") is not None and report.outcomes["rig1"].action == "already staged") == already
    assert staged == ([] if already else ["rig1"])
    assert (("rig1", "reopen") in FakeStore.calls) == (bool(state.get("damaged")) or state["verified"] == "f" * 64)
