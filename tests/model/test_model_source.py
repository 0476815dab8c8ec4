"""Model sources pinned by revision, the rendered mount, the fan-out plan, retention, and the rig's store script
(rigkit/files/model_store.py, run here with this machine's python3 on a temporary store)."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from rigkit.errors import ConfigError, RigkitError
from rigkit.model import stage
from rigkit.model.stage import CONTROLLER as FROM_CONTROLLER
from rigkit.model.stage import SHARED_ACTION, STORE_SCRIPT_SOURCE, fan_out_rounds, transfer_plan, verify_shared
from rigkit.serving.ledger import Ledger, Release
from rigkit.serving.render import render_compose, render_env
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.model_source import (
    CONTROLLER,
    HUB,
    MODEL_CONTAINER_PATH,
    SHARED,
    ModelSource,
    directory_files,
    manifest_hash,
    parse_model_source,
    read_directory_manifest,
    resolve_directory,
    revisions_to_remove,
)
from rigkit.status.drift import model_drift

COMMIT = "0123456789abcdef0123456789abcdef01234567"
IMAGE = "vllm/vllm-openai@sha256:" + "a" * 64


@pytest.mark.parametrize(
    "value, problem, fix",
    [
        ("Qwen/Qwen3-8B", "without a revision", "rigkit resolve-model Qwen/Qwen3-8B"),
        ("Qwen/Qwen3-8B@main", "a branch, a tag or a short commit", "rigkit resolve-model Qwen/Qwen3-8B@main"),
        ("Qwen/Qwen3-8B@v1.0", "a branch, a tag or a short commit", "rigkit resolve-model Qwen/Qwen3-8B@v1.0"),
        ("Qwen/Qwen3-8B@0123456", "short commit", "full commit"),
        ("Qwen/Qwen3-8B@" + COMMIT.upper(), "capitals", "rigkit resolve-model"),
        ("/srv/models/tiny", "a path without saying where", "controller:/srv/models/tiny"),
        ("/srv/models/tiny", "a path without saying where", "shared:/srv/models/tiny"),
        ("shared:/mnt/models/tiny", "without its manifest hash", "rigkit resolve-model shared:/mnt/models/tiny"),
        ("shared:mnt@" + "b" * 64, "must be an absolute host path", "shared:/absolute"),
        ("shared:/@" + "b" * 64, "must be an absolute host path", "shared:/absolute"),
        ("shared:/mnt/tiny@main", "not a manifest hash", "rigkit resolve-model shared:/mnt/tiny"),
        (
            "controller:/srv/models/tiny",
            "without its manifest hash",
            "rigkit resolve-model controller:/srv/models/tiny",
        ),
        ("controller:relative@" + "b" * 64, "must be an absolute host path", "controller:/absolute"),
        ("controller:/srv/../etc@" + "b" * 64, "no empty, '.' or '..' parts", "controller:/absolute"),
        ("not a repo@" + COMMIT, "not a hub repository id", "org/name@<40-hex commit>"),
        ("", "no model source", "org/name@"),
    ],
)
def test_an_unpinned_or_malformed_source_is_refused_naming_the_fix(value, problem, fix):
    with pytest.raises(ConfigError) as refused:
        parse_model_source(value)
    assert refused.value.field == "model_source" and problem in refused.value.problem and fix in refused.value.fix


def test_pinned_sources_parse():
    hub = parse_model_source(f"Qwen/Qwen3-8B@{COMMIT}")
    assert (hub.kind, hub.name, hub.revision, hub.slug) == (HUB, "Qwen/Qwen3-8B", COMMIT, "Qwen--Qwen3-8B")
    directory = parse_model_source("controller:/srv/tiny@" + "b" * 64)
    assert (directory.kind, directory.name, directory.slug) == (CONTROLLER, "/srv/tiny", "tiny")
    shared = parse_model_source("shared:/mnt/models/tiny/@" + "b" * 64)
    assert (shared.kind, shared.name, shared.slug, shared.spec) == (
        SHARED,
        "/mnt/models/tiny",
        "tiny",
        "shared:/mnt/models/tiny@" + "b" * 64,
    )


def test_host_data_refuses_a_branch_naming_the_field_before_any_host():
    with pytest.raises(ConfigError) as refused:
        settings_for_host(
            {"serving_profile": "native-offload", "serving_image": IMAGE, "model_source": "Qwen/Qwen3-8B@main"}
        )
    assert refused.value.field == "model_source" and "rigkit resolve-model Qwen/Qwen3-8B@main" in str(refused.value)
    with pytest.raises(ConfigError, match="remove model"):
        settings_for_host(
            {
                "serving_profile": "native-offload",
                "serving_image": IMAGE,
                "model": "x",
                "model_source": f"Qwen/Qwen3-8B@{COMMIT}",
            }
        )


def test_the_staged_revision_is_mounted_read_only_offline_with_the_served_name_unchanged(monkeypatch):
    monkeypatch.setenv("RIGKIT_HF_TOKEN", "hf_never_in_the_container")
    settings = settings_for_host(
        {"serving_profile": "native-offload", "serving_image": IMAGE, "model_source": f"Qwen/Qwen3-8B@{COMMIT}"}
    )
    compose, env = render_compose(settings), render_env(settings)
    assert (
        f"source: /mnt/rigkit-l2/models/Qwen--Qwen3-8B/{COMMIT}\n      target: {MODEL_CONTAINER_PATH}\n"
        "      read_only: true" in compose
    )
    assert "- HF_HUB_OFFLINE=1" in compose and "org.rigkit.model: Qwen/Qwen3-8B@" + COMMIT in compose
    assert "RIGKIT_MODEL='/model'" in env and "RIGKIT_SERVED_MODEL_NAME='Qwen/Qwen3-8B'" in env
    assert "hf_never_in_the_container" not in compose + env and "HF_TOKEN" not in compose + env


def test_a_shared_model_is_mounted_from_the_share_itself_read_only():
    settings = settings_for_host(
        {
            "serving_profile": "native-offload",
            "serving_image": IMAGE,
            "model_source": "shared:/mnt/nfs/qwen@" + "c" * 64,
        }
    )
    assert settings.model_dir == "/mnt/nfs/qwen"  # not a copy in the store
    assert f"source: /mnt/nfs/qwen\n      target: {MODEL_CONTAINER_PATH}\n      read_only: true" in render_compose(
        settings
    )


def test_fan_out_reads_the_source_once_then_doubles_rig_to_rig():
    rounds = fan_out_rounds([], ["r1", "r2", "r3", "r4", "r5"])
    assert rounds == [[(FROM_CONTROLLER, "r1")], [("r1", "r2")], [("r1", "r3"), ("r2", "r4")], [("r1", "r5")]]
    assert fan_out_rounds(["r1"], ["r2"]) == [[("r1", "r2")]]
    assert fan_out_rounds(["r1", "r2"], []) == []


def test_transfer_plan_resumes_each_file_at_its_size():
    files = {"a": {"size": 10}, "b": {"size": 5}, "c": {"size": 3}}
    assert transfer_plan(files, {"a": 4, "b": 5, "c": 9}) == [
        {"path": "a", "offset": 4, "size": 10},
        {"path": "c", "offset": 0, "size": 3},
    ]


def test_retention_keeps_the_newest_and_every_revision_a_release_needs():
    assert revisions_to_remove(["r1", "r2", "r3", "r4"], ["r4", "r3", "r2", "r1"], ["r1"], keep=2) == ["r2"]
    # staged but never deployed (the release about to happen): kept
    assert revisions_to_remove(["r9", "r1"], ["r1"], [], keep=1) == []
    ledger = Ledger(
        [
            Release("i@sha256:1", "p", "k", smoke="pass", model="m@r1", rendering="1" * 64),
            Release("i@sha256:2", "p", "k", smoke="pass", model="m@r2", rendering="2" * 64),
            Release("i@sha256:2", "p", "k", smoke="fail", model="m@r3", rendering="3" * 64),
        ]
    )
    assert set(ledger.models_needed(1)) >= {"m@r2", "m@r3"}  # last known-good and current
    assert ledger.models_newest_first() == ["m@r3", "m@r2", "m@r1"]


def test_a_controller_directory_is_pinned_by_its_manifest_and_a_change_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "w.safetensors").write_bytes(os.urandom(1000))
    source = resolve_directory(str(tmp_path))
    files = read_directory_manifest(source)
    assert manifest_hash(files) == source.revision
    assert files["w.safetensors"]["sha256"] == hashlib.sha256((tmp_path / "w.safetensors").read_bytes()).hexdigest()
    (tmp_path / "w.safetensors").write_bytes(os.urandom(1000))
    with pytest.raises(ConfigError, match="changed since it was pinned"):
        read_directory_manifest(source)


@pytest.mark.parametrize(
    "tamper, named",
    [
        (lambda root: (root / "w.safetensors").write_bytes(b"x" * 1000), "(w.safetensors changed)"),
        (lambda root: (root / "extra.bin").write_bytes(b"x"), "(extra.bin added)"),
        (lambda root: (root / "config.json").unlink(), "(config.json removed)"),
    ],
    ids=["changed", "added", "removed"],
)
def test_a_tampered_controller_file_is_refused_by_its_name(tmp_path, tamper, named):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "w.safetensors").write_bytes(os.urandom(1000))
    (tmp_path / "tokenizer.json").write_text("{}")  # untouched: never named
    source = resolve_directory(str(tmp_path))
    tamper(tmp_path)
    with pytest.raises(ConfigError) as refused:
        read_directory_manifest(source)
    assert refused.value.problem.endswith(f"changed since it was pinned {named}"), refused.value.problem
    assert "tokenizer.json" not in str(refused.value) and refused.value.fix.startswith("restore it, or pin")


def _store(store, *args, stdin=b""):
    done = subprocess.run(
        [sys.executable, str(STORE_SCRIPT_SOURCE), args[0], str(store), "tiny", "rev", *args[1:]],
        input=stdin,
        capture_output=True,
        check=True,
    )
    return json.loads(done.stdout.decode().strip().splitlines()[-1]) if done.stdout.strip() else done.stdout


def _frames(items):
    body = f"{sum(len(data) for _, _, data in items)}\n".encode()
    for path, offset, data in items:
        body += (json.dumps({"path": path, "offset": offset, "size": len(data)}) + "\n").encode() + data
    return body + b"\n"


def test_store_script_never_renames_a_corrupt_copy_resumes_and_detects_damage(tmp_path):
    weights, config = os.urandom(5000), b"{}"
    files = {
        "w": {"size": 5000, "sha256": hashlib.sha256(weights).hexdigest()},
        "c/config.json": {"size": 2, "sha256": hashlib.sha256(config).hexdigest()},
    }
    manifest = json.dumps({"files": files, "hash": manifest_hash(files), "source": "s"}).encode()
    _store(tmp_path, "receive", stdin=_frames([("w", 0, weights[:2000])]))  # a transfer cut short
    assert _store(tmp_path, "state")["partial"] == {"w": 2000}
    assert _store(tmp_path, "finish", stdin=manifest) == {"ok": False, "missing": ["c/config.json", "w"], "bad": []}
    assert not (tmp_path / "tiny" / "rev").exists()
    _store(tmp_path, "receive", stdin=_frames([("w", 2000, b"X" * 3000), ("c/config.json", 0, config)]))
    assert _store(tmp_path, "finish", stdin=manifest) == {"ok": False, "missing": [], "bad": ["w"]}
    assert not (tmp_path / "tiny" / ".partial-rev" / "w").exists()  # the corrupt file is gone, never kept
    _store(tmp_path, "receive", stdin=_frames([("w", 0, weights)]))
    assert _store(tmp_path, "finish", stdin=manifest) == {"ok": True}
    assert (tmp_path / "tiny" / "rev" / "w").read_bytes() == weights
    assert _store(tmp_path, "check") == {"staged": True, "manifest": manifest_hash(files), "damaged": []}
    damaged = tmp_path / "tiny" / "rev" / "w"
    damaged.chmod(0o644)
    damaged.write_bytes(weights[:-1] + b"!")
    assert _store(tmp_path, "check")["damaged"] == [{"path": "w", "why": "sha256 differs from the manifest"}]
    assert _store(tmp_path, "reopen") == {"reopened": ["w"]}
    assert _store(tmp_path, "state")["partial"] == {"c/config.json": 2}  # only the damaged file is sent again


def test_status_shows_a_model_not_staged_or_damaged_as_drift():
    assert model_drift('{"staged": true, "manifest": "m", "damaged": []}', "s") == []
    assert [d.line() for d in model_drift('{"staged": false}', "org/m@c")] == [
        "model: model_source: the rig has <not staged>; today's data renders org/m@c"
    ]
    damaged = '{"staged": true, "damaged": [{"path": "w", "why": "sha256 differs from the manifest"}]}'
    assert [d.line() for d in model_drift(damaged, "s")] == [
        "model: model_source: w: the rig has sha256 differs from the manifest; today's data renders as the manifest"
    ]


def test_a_model_larger_than_the_store_is_refused_naming_model_store_path():
    from types import SimpleNamespace

    from rigkit.errors import RigkitError
    from rigkit.model.stage import STORE_MARGIN_BYTES, FleetStager

    files = {"w": {"size": 10 * 10**9, "sha256": "0" * 64}}
    stager = FleetStager(parse_model_source("org/m@" + COMMIT), None, files, {}, {}, {}, progress=lambda line: None)
    store = SimpleNamespace(name="rig1", store="/mnt/rigkit-l2/models")
    stager._preflight(store, {"partial": {"w": 4 * 10**9}, "free": 6 * 10**9 + STORE_MARGIN_BYTES})  # resumed: fits
    with pytest.raises(RigkitError) as refused:
        stager._preflight(store, {"partial": {}, "free": 6 * 10**9})
    assert refused.value.field == "model_store_path" and "needs 10.00 GB more" in refused.value.problem


def _shared_dir(root):
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "sub" / "w.safetensors").write_bytes(os.urandom(3000))
    (root / ".cache").mkdir()  # a dot-directory: never part of the model (as on the controller)
    (root / ".cache" / "x").write_text("x")
    return resolve_directory(str(root))  # writes .rigkit-manifest.json there: left out of the files too


def test_store_script_hashes_a_shared_directory_in_place_as_the_controller_does(tmp_path):
    share, store = tmp_path / "share", tmp_path / "store"
    pinned = _shared_dir(share)
    assert _store(store, "hash-dir", str(tmp_path / "absent")) == {"exists": False, "files": {}}
    found = _store(store, "hash-dir", str(share))
    assert sorted(found["files"]) == directory_files(share) == ["config.json", "sub/w.safetensors"]
    manifest = {path: {"size": e["size"], "sha256": e["sha256"]} for path, e in found["files"].items()}
    assert manifest_hash(manifest) == pinned.revision
    document = json.dumps({"files": found["files"], "hash": pinned.revision, "source": "s"}).encode()
    assert _store(store, "stamp-shared", str(share), stdin=document) == {"ok": True}
    assert not (store / "tiny" / "rev").exists()  # nothing copied into the store
    assert _store(store, "check") == {"staged": True, "manifest": pinned.revision, "damaged": []}
    assert _store(store, "list") == ["rev"]
    weights = share / "sub" / "w.safetensors"
    stat = weights.stat()
    weights.write_bytes(os.urandom(3000))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size and time: only --deep reads it
    assert _store(store, "check")["damaged"] == []
    assert _store(store, "check", "deep")["damaged"] == [
        {"path": "sub/w.safetensors", "why": "sha256 differs from the manifest"}
    ]
    weights.write_bytes(os.urandom(3000))  # a new mtime: hashed again
    assert (
        _store(store, "hash-dir", str(share))["files"]["sub/w.safetensors"]["sha256"]
        != manifest["sub/w.safetensors"]["sha256"]
    )
    os.rename(share, tmp_path / "unmounted")
    assert _store(store, "check")["damaged"] == [
        {"path": str(share), "why": "the shared directory is not there (the share not mounted?)"}
    ]


class LocalRigStore(stage.RigStore):
    """A rig's store run on this machine (the fake for the SSH connection only; the store script is the real one)."""

    def __init__(self, name, data, store, source):
        self.name, self.data, self.store, self.source = name, data, store, source

    def close(self):
        pass

    def command(self, verb, *args):
        return " ".join(
            subprocess.list2cmdline([part])
            for part in (
                sys.executable,
                str(STORE_SCRIPT_SOURCE),
                verb,
                self.store,
                self.source.slug,
                self.source.revision,
                *args,
            )
        )

    def run(self, command, stdin=None, writer=None, progress=None, agent=False):
        done = subprocess.run(["bash", "-c", command], input=stdin or b"", capture_output=True)
        return done.returncode, done.stdout.decode(), done.stderr.decode()


def test_a_shared_model_is_verified_on_each_rig_never_copied_and_refused_when_absent_or_changed(tmp_path, monkeypatch):
    monkeypatch.setattr(stage, "RigStore", LocalRigStore)
    share = tmp_path / "share"
    pinned = _shared_dir(share)
    source = ModelSource(SHARED, str(share), pinned.revision)
    rigs = {"rig1": {}, "rig2": {}}
    stores = {"rig1": str(tmp_path / "s1"), "rig2": str(tmp_path / "s2")}
    report = verify_shared(source, rigs, stores, progress=lambda line: None)
    assert {o.action for o in report.outcomes.values()} == {SHARED_ACTION} and report.source_bytes == 0
    assert all(o.sent_bytes == 0 for o in report.outcomes.values())
    assert json.loads((tmp_path / "s2" / "share" / f"{pinned.revision}.verified.json").read_text())["directory"] == str(
        share
    )
    absent = ModelSource(SHARED, str(tmp_path / "nfs-not-mounted"), pinned.revision)
    with pytest.raises(RigkitError) as refused:
        verify_shared(absent, rigs, stores, progress=lambda line: None)
    assert refused.value.field == "model_source" and "rig1: no directory" in refused.value.problem
    assert "mount the share at" in refused.value.fix
    (share / "config.json").write_text('{"changed": true}')
    with pytest.raises(RigkitError) as changed:
        verify_shared(source, rigs, stores, progress=lambda line: None)
    now = resolve_directory(str(share)).revision
    assert f"hash to {now}, not the pinned {pinned.revision}" in changed.value.problem
    assert f"shared:{share}@{now}" in changed.value.fix
    resolve_directory(str(share))
    unmounted = {"rig1": os.path.join(stores["rig1"], "nvme-not-mounted")}
    with pytest.raises(RigkitError) as hidden:
        verify_shared(
            ModelSource(SHARED, str(share), resolve_directory(str(share)).revision),
            {"rig1": {}},
            {"rig1": unmounted["rig1"]},
            progress=lambda line: None,
            store_mounts=unmounted,
        )
    assert hidden.value.field == "model_store_path" and "nothing is mounted at" in hidden.value.problem


def test_a_store_under_an_l2_disk_not_mounted_yet_is_refused_before_any_copy(tmp_path):
    from rigkit.fleet.stage import store_mounts
    from rigkit.model.stage import FleetStager

    hosts = {
        "fresh": {"data": {"l2_device": "/dev/nvme1n1"}},
        "own-mount": {"data": {"l2_device": "/dev/nvme1n1", "l2_mount_point": "/srv/l2/"}},
        "no-disk": {"data": {}},
    }
    stores = {"fresh": "/mnt/rigkit-l2/models", "own-mount": "/srv/models", "no-disk": "/mnt/rigkit-l2/models"}
    assert store_mounts(hosts, stores) == {"fresh": "/mnt/rigkit-l2"}
    files = {"w": {"size": 10, "sha256": "0" * 64}}
    stager = FleetStager(
        parse_model_source("org/m@" + COMMIT),
        None,
        files,
        {},
        {},
        {},
        lambda line: None,
        store_mounts={"fresh": "/mnt/rigkit-l2"},
    )
    from types import SimpleNamespace

    fresh = SimpleNamespace(name="fresh", store="/mnt/rigkit-l2/models")
    with pytest.raises(RigkitError) as refused:
        stager._preflight(fresh, {"partial": {}, "free": 10**12, "store_mount": "/"})
    assert refused.value.field == "model_store_path" and "nothing is mounted at /mnt/rigkit-l2" in refused.value.problem
    stager._preflight(fresh, {"partial": {}, "free": 10**12, "store_mount": "/mnt/rigkit-l2"})
    # the rig's script says where the store is: the mount point holding it (or holding where it would be made)
    state = _store(tmp_path / "not" / "made", "state")
    expected = os.path.realpath(tmp_path)
    while not os.path.ismount(expected):
        expected = os.path.dirname(expected)
    assert state["store_mount"] == expected


def test_resolve_model_pins_a_shared_directory_at_the_rigs_path(tmp_path):
    from rigkit.model.resolve import resolve_model

    pinned = _shared_dir(tmp_path / "share")
    link = tmp_path / "mnt-models"
    link.symlink_to(tmp_path / "share")
    # the path as declared (the rigs'), not the controller's resolved one
    assert resolve_model(f"shared:{link}/") == f"shared:{link}@{pinned.revision}"
    with pytest.raises(ConfigError) as refused:
        resolve_model(f"shared:{tmp_path}/not-mounted")
    assert "where the controller mounts the share" in refused.value.problem and "mount the share" in refused.value.fix
