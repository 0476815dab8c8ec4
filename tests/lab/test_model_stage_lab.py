"""The lab's model staged as a pinned artifact (rigkit.model.stage) onto real lab rigs over real SSH:
- a fresh rig gets the model from another rig, not from the source (the source is read once: counted);
- a second staging copies nothing;
- a damaged file on a rig is found by `rigkit stage --check` and `rigkit status` (model drift) and repaired by
  the next staging, from a rig;
- a hub commit (the real huggingface_hub client, the loopback stand-in) is fetched once for two rigs;
- a rollback to the previous revision copies nothing and mounts it again;
- `rigkit deploy` with model_source stages, then serves the engine from the read-only mount, offline, under
  the served name it had (the engine's /v1/models answer).

The model is rigkit.lab.lab_weights.lab_model_dir() (the trained lab model where the checkout has it, else
the tiny model out of the serving image). Host-network rigs only: rig to rig needs the receiving rig's sshd
reachable from the sending rig (rig1 and rig2 share the host's loopback).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from rigkit.lab.lab_weights import lab_model_source
from rigkit.model.source import manifest_size, parse_model_source, read_directory_manifest, resolve_directory
from rigkit.paths import REPO_ROOT
from tests.hub_standin import HubRepo, HubStandIn
from tests.lab.conftest import LAB_INVENTORY

pytestmark = pytest.mark.lab


STORE = "/var/tmp/rigkit-model-store-test"


@pytest.fixture(scope="module")
def model(lab, serving_image):
    return lab_model_source(serving_image["releases"]["1"])


@pytest.fixture(scope="module")
def pair(lab):
    rigs = [rig for rig in lab.rigs if not rig.netns][:2]
    if len(rigs) < 2:
        pytest.skip("needs two lab rigs on the host network")
    return rigs


def _rigkit(*args: str, timeout: float = 900, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """A rigkit command in its own process, as a user runs it. Staging never runs in the test process: gevent, which
    pyinfra_cli patches into any process that imports it (other test modules do), turns paramiko's agent-forwarding
    thread into a greenlet, and the rig-to-rig transfer deadlocked there (15 min, a whole-suite run)."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("rigkit")), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _stage(model: str, names, *extra: str, env: Optional[dict] = None, store: str = STORE) -> dict:
    """`rigkit stage --json` onto ``names``: the one model's report (bytes exact), its progress in "stderr"."""
    done = _rigkit(
        "stage",
        str(LAB_INVENTORY),
        *(part for name in names for part in ("--limit", name)),
        "--data",
        f"model_source={model}",
        "--data",
        f"model_store_path={store}",
        "--json",
        *extra,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (report,) = json.loads(done.stdout)["reports"]
    return {**report, "stderr": done.stderr}


def test_fresh_rig_from_another_rig_then_nothing_then_repair(model, pair, rig_exec):
    names = [rig.name for rig in pair]
    for rig in pair:
        rig_exec(rig, f"rm -rf {STORE}")
    total = manifest_size(read_directory_manifest(parse_model_source(model)))
    first = _stage(model, names)
    assert first["outcomes"][names[0]]["action"] == "from controller"
    assert first["outcomes"][names[1]]["action"] == f"from {names[0]}", first["stderr"]
    assert first["source_bytes"] == total  # the source read once for two rigs
    assert any("MB" in line and "from" in line for line in first["stderr"].splitlines())  # progress was shown

    second = _stage(model, names)
    assert {outcome["action"] for outcome in second["outcomes"].values()} == {"already staged"}
    assert second["source_bytes"] == 0 and not any(outcome["sent_bytes"] for outcome in second["outcomes"].values())

    source = parse_model_source(model)
    damaged = f"{STORE}/{source.slug}/{source.revision}/config.json"
    rig_exec(pair[1], f"chmod u+w {damaged} && echo ' ' >> {damaged}")
    check = _rigkit(
        "stage",
        str(LAB_INVENTORY),
        "--check",
        "--limit",
        names[1],
        "--data",
        f"model_source={model}",
        "--data",
        f"model_store_path={STORE}",
        timeout=300,
    )
    assert check.returncode == 1 and "DAMAGED" in check.stdout and "config.json" in check.stdout, check.stdout
    status = _rigkit(
        "status",
        str(LAB_INVENTORY),
        "--limit",
        names[1],
        "--json",
        "--data",
        f"model_source={model}",
        "--data",
        f"model_store_path={STORE}",
        timeout=300,
    )
    drift = [item for rig in json.loads(status.stdout)["rigs"] for item in rig["drift"] if item["source"] == "model"]
    assert [item["knob"] for item in drift] == ["model_source: config.json"], status.stdout[-3000:]
    repair = _stage(model, names)
    assert repair["outcomes"][names[1]]["action"] == f"from {names[0]}" and repair["source_bytes"] == 0
    assert 0 < repair["outcomes"][names[1]]["sent_bytes"] < total  # only the damaged file
    served = rig_exec(pair[1], f"cat {damaged}").stdout
    assert served == Path(source.name, "config.json").read_text()


def test_deploy_serves_the_staged_model_read_only_offline_under_its_name(model, pair, rig_exec, deployed):
    rig = pair[0]
    result = _rigkit("deploy", str(LAB_INVENTORY), "--limit", rig.name, "--data", f"model_source={model}")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    inspect = json.loads(rig_exec(rig, "docker inspect rigkit-serving").stdout)[0]
    mount = next(m for m in inspect["Mounts"] if m["Destination"] == "/model")
    source = parse_model_source(model)
    assert mount["Source"].endswith(f"/models/{source.slug}/{source.revision}") and mount["RW"] is False
    env = inspect["Config"]["Env"]
    assert "HF_HUB_OFFLINE=1" in env and not any(item.startswith("HF_TOKEN=") for item in env)
    models = rig_exec(rig, f"curl -s http://127.0.0.1:{rig.serving_port}/v1/models").stdout
    assert '"id":"tiny"' in models.replace(" ", ""), models


def test_a_hub_commit_is_fetched_once_onto_the_controller_then_rig_to_rig(model, pair, rig_exec, tmp_path):
    """The hub path end to end: the real huggingface_hub client (in `rigkit stage`, HF_ENDPOINT pointing it at the
    loopback stand-in, tests/hub_standin.py) serving the lab model's files; the stand-in serves each file once for
    two rigs."""
    directory = Path(parse_model_source(model).name)
    files = {path: (directory / path).read_bytes() for path in read_directory_manifest(parse_model_source(model))}
    commit = "c" * 40
    names = [rig.name for rig in pair]
    for rig in pair:
        rig_exec(rig, f"rm -rf {STORE}")
    with HubStandIn([HubRepo("rigkit/lab-tiny", commit, files, lfs={p for p in files if p.endswith(".json")})]) as hub:
        environment = {
            **os.environ,
            "HF_ENDPOINT": hub.endpoint,
            "RIGKIT_MODEL_CACHE": str(tmp_path / "cache"),
            "HF_HOME": str(tmp_path / "hf-home"),
        }
        report = _stage(f"rigkit/lab-tiny@{commit}", names, env=environment)
    assert hub.served_bytes == sum(map(len, files.values()))  # once, for two rigs
    assert report["outcomes"][names[1]]["action"] == f"from {names[0]}"
    staged = rig_exec(pair[1], f"cat {STORE}/rigkit--lab-tiny/{commit}/config.json").stdout
    assert staged == files["config.json"].decode()


def test_rollback_to_the_previous_revision_copies_nothing_and_mounts_it(model, pair, rig_exec, deployed, tmp_path):
    """Revision A deployed, then revision B (the same model plus one file: another manifest); rollback.py brings
    back A's stored rendering: the engine serves from A's directory, nothing was staged or sent."""
    rig = pair[0]
    other = Path("/var/tmp/rigkit-lab-model-revision-b")
    if other.exists():
        shutil.rmtree(other)
    shutil.copytree(parse_model_source(model).name, other)
    (other / "REVISION-B.txt").write_text("a second revision of the lab model\n")
    revision_b = resolve_directory(str(other)).spec
    for spec in (model, revision_b):
        done = _rigkit("deploy", str(LAB_INVENTORY), "--limit", rig.name, "--data", f"model_source={spec}")
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    a, b = parse_model_source(model), parse_model_source(revision_b)
    store = f"/mnt/rigkit-l2/models/{a.slug}"
    before = rig_exec(rig, f"find {store} -printf '%p %s %T@\\n' | sort").stdout
    rolled = _rigkit(
        "deploy",
        str(LAB_INVENTORY),
        "--deploy",
        "rollback.py",
        "--limit",
        rig.name,
        "--data",
        f"model_source={revision_b}",
    )
    assert rolled.returncode == 0, rolled.stdout[-4000:] + rolled.stderr[-2000:]
    assert "staging onto" not in rolled.stdout  # a rollback stages nothing
    assert rig_exec(rig, f"find {store} -printf '%p %s %T@\\n' | sort").stdout == before  # nothing copied
    inspect = json.loads(rig_exec(rig, "docker inspect rigkit-serving").stdout)[0]
    mount = next(m for m in inspect["Mounts"] if m["Destination"] == "/model")
    assert mount["Source"] == f"{store}/{a.revision}" != f"{store}/{b.revision}"
    ledger = json.loads(rig_exec(rig, "cat /var/lib/rigkit/ledger.json").stdout)["releases"]
    assert ledger[-1]["kind"] == "rollback" and ledger[-1]["model"] == model
    models = rig_exec(rig, f"curl -s http://127.0.0.1:{rig.serving_port}/v1/models").stdout
    assert '"id":"tiny"' in models.replace(" ", ""), models
