"""The lab's model staged as a pinned artifact (rigkit.model.stage) onto real lab rigs over real SSH:
- a fresh rig gets the model from another rig, not from the source (the source is read once: counted);
- a second staging copies nothing;
- a damaged file on a rig is found by `rigkit stage --check` and `rigkit status` (model drift) and repaired by
  the next staging, from a rig;
- a hub commit (the real huggingface_hub client, the loopback stand-in) is fetched once for two rigs;
- a rollback to a release with another revision (other weights) copies nothing, mounts the old revision and the
  engine answers with its weights again (tokens and logprobs as before, not as the other revision's);
- a model on a shared mount (the lab's shared directory, bind-mounted into every rig, as an NFS export would be)
  is verified in place and not copied, served from the share read-only, and refused when it is not there;
- `rigkit deploy` with model_source stages, then serves the engine from the read-only mount, offline, under
  the served name it had (the engine's /v1/models answer).

The model is the lab's own (rigkit.lab.lab_weights.lab_model_source(), the trained lab model, which every lab deploy
stages from the lab state's model_source: the serving image holds none). Host-network rigs only: rig to rig needs the receiving rig's sshd
reachable from the sending rig (rig1 and rig2 share the host's loopback).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Optional

import pytest

from rigkit.fleet.pyinfra_args import rigkit_executable
from rigkit.lab.lab_weights import lab_model_source, other_weights_revision
from rigkit.lab.rigs import KV_SHARE_DIR, KV_SHARE_IN_RIG, LAB_MODEL_STORE
from rigkit.model.stage import SHARED_ACTION
from rigkit.paths import REPO_ROOT
from rigkit.settings.model_source import manifest_size, parse_model_source, read_directory_manifest, resolve_directory
from tests.hub_standin import HubRepo, HubStandIn
from tests.lab.conftest import DEPLOY_TIMEOUT_S, LAB_INVENTORY

pytestmark = pytest.mark.lab


STORE = "/var/tmp/rigkit-model-store-test"
PROMPT = "def fibonacci(n):\n    "


@pytest.fixture(scope="module")
def model(lab):
    assert lab.model_source == lab_model_source(), "the lab state pins another model than the lab's own"
    return lab.model_source


@pytest.fixture(scope="module")
def pair(lab):
    rigs = [rig for rig in lab.rigs if not rig.netns][:2]
    if len(rigs) < 2:
        pytest.skip("needs two lab rigs on the host network")
    return rigs


SHARED_COPY = KV_SHARE_DIR / "rigkit-model-test"


@pytest.fixture(scope="module")
def restored(pair, deployed, run_pyinfra, rig_exec):
    """The rig these tests deploy to (the first of ``pair``) gets the standard deploy back after the module, as the
    `deployed` fixture left it for the tests after these; the test stores and the shared copy are removed."""
    yield pair[0]
    done = run_pyinfra(args=["--limit", pair[0].name], deploy="deploy.py", timeout=DEPLOY_TIMEOUT_S)
    assert done.returncode == 0, f"restoring the standard deploy failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    for rig in pair:
        rig_exec(rig, f"rm -rf {STORE}")
    shutil.rmtree(SHARED_COPY, ignore_errors=True)


def _rigkit(*args: str, timeout: float = 900, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """A rigkit command in its own process, as a user runs it. Staging never runs in the test process: gevent, which
    pyinfra_cli patches into any process that imports it (other test modules do), turns paramiko's agent-forwarding
    thread into a greenlet, and the rig-to-rig transfer deadlocked there (15 min, a whole-suite run)."""
    return subprocess.run(
        [rigkit_executable(), *args],
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


def test_deploy_serves_the_staged_model_read_only_offline_under_its_name(model, pair, rig_exec, restored):
    rig = restored
    result = _rigkit("deploy", str(LAB_INVENTORY), "--limit", rig.name, "--data", f"model_source={model}")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    inspect = json.loads(rig_exec(rig, "docker inspect rigkit-serving").stdout)[0]
    mount = next(m for m in inspect["Mounts"] if m["Destination"] == "/model")
    source = parse_model_source(model)
    assert mount["Source"] == f"{LAB_MODEL_STORE}/{source.slug}/{source.revision}" and mount["RW"] is False
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


def _completion(rig, rig_exec) -> dict:
    """The engine's greedy answer to one prompt: its text and each token with its logprob (what the weights say)."""
    request = json.dumps(
        {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 1, "seed": 0}
    )
    out = rig_exec(
        rig,
        f"curl -s -H 'Content-Type: application/json' -d {shlex.quote(request)} "
        f"http://127.0.0.1:{rig.serving_port}/v1/completions",
    ).stdout
    choice = json.loads(out)["choices"][0]
    logprobs = choice["logprobs"]
    return {
        "text": choice["text"],
        "tokens": list(zip(logprobs["tokens"], [round(value, 3) for value in logprobs["token_logprobs"]])),
    }


def _store_listing(rig, rig_exec, store: str) -> dict[str, tuple[int, str]]:
    lines = rig_exec(rig, f"find {store} -type f -printf '%p %s %T@\\n'").stdout.splitlines()
    return {path: (int(size), mtime) for path, size, mtime in (line.rsplit(" ", 2) for line in lines)}


def test_rollback_to_a_release_with_other_weights_serves_them_again_copying_nothing(model, pair, rig_exec, restored):
    """Revision A (the lab model) deployed, then revision B (the same files, the final norm's weights negated: another
    manifest, another answer); rollback.py brings back A's stored rendering: the engine answers as A did, from A's
    staged directory, and not a byte was staged or copied."""
    rig = pair[0]
    a = parse_model_source(model)
    # the same directory name: B is another revision of the same model (one store directory, two revisions)
    other = other_weights_revision(Path(a.name), Path("/var/tmp/rigkit-lab-model-revision-b") / Path(a.name).name)
    revision_b = resolve_directory(str(other)).spec
    b = parse_model_source(revision_b)
    assert a.slug == b.slug and a.revision != b.revision
    answers = {}
    for name, spec in (("A", model), ("B", revision_b)):
        done = _rigkit("deploy", str(LAB_INVENTORY), "--limit", rig.name, "--data", f"model_source={spec}")
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        answers[name] = _completion(rig, rig_exec)
    assert answers["A"] != answers["B"], answers  # the weights differ, so does the answer
    store = f"{LAB_MODEL_STORE}/{a.slug}"  # the lab group's model_store_path
    before = _store_listing(rig, rig_exec, store)
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
    after = _store_listing(rig, rig_exec, store)
    copied = sum(size for path, (size, mtime) in after.items() if before.get(path) != (size, mtime))
    print(
        f"rollback to revision {a.revision[:12]} on {rig.name}: {copied} bytes copied "
        f"({len(after)} files in the store, both revisions staged, unchanged)"
    )
    assert copied == 0 and after == before
    inspect = json.loads(rig_exec(rig, "docker inspect rigkit-serving").stdout)[0]
    mount = next(m for m in inspect["Mounts"] if m["Destination"] == "/model")
    assert mount["Source"] == f"{store}/{a.revision}" and mount["RW"] is False
    ledger = json.loads(rig_exec(rig, "cat /var/lib/rigkit/ledger.json").stdout)["releases"]
    assert ledger[-1]["kind"] == "rollback" and ledger[-1]["model"] == model
    rolled_back = _completion(rig, rig_exec)
    print(
        f"answers: A {answers['A']['text']!r}, B {answers['B']['text']!r}, after the rollback {rolled_back['text']!r}"
    )
    assert rolled_back == answers["A"] != answers["B"]  # A's weights again: the same tokens, the same logprobs


def test_a_model_on_a_shared_mount_is_verified_in_place_never_copied_and_served_from_it(
    model, pair, rig_exec, restored
):
    """The lab's shared directory (the host's KV_SHARE_DIR, bind-mounted at KV_SHARE_IN_RIG into every rig: the
    NFS export's stand-in) holds a copy of the lab model; shared:<path in the rigs>@<its manifest hash> is hashed
    where it is on each rig, nothing lands in the store, and the engine mounts the share itself read-only."""
    names = [rig.name for rig in pair]
    on_host = SHARED_COPY / "tiny"
    relative = on_host.relative_to(KV_SHARE_DIR)
    if on_host.exists():
        shutil.rmtree(on_host)
    shutil.copytree(parse_model_source(model).name, on_host, ignore=shutil.ignore_patterns(".*"))
    # pinned where the controller sees the share (here: the host's path), declared at the rigs' path
    revision = resolve_directory(str(on_host)).revision
    in_rigs = f"{KV_SHARE_IN_RIG}/{relative}"
    spec = f"shared:{in_rigs}@{revision}"
    for rig in pair:
        rig_exec(rig, f"rm -rf {STORE}")
    report = _stage(spec, names)
    assert {outcome["action"] for outcome in report["outcomes"].values()} == {SHARED_ACTION}, report
    assert report["source_bytes"] == 0 and not any(outcome["sent_bytes"] for outcome in report["outcomes"].values())
    for rig in pair:
        stamp = json.loads(rig_exec(rig, f"cat {STORE}/tiny/{revision}.verified.json").stdout)
        assert stamp["directory"] == in_rigs and stamp["manifest"] == revision
        assert rig_exec(rig, f"find {STORE} -type f -not -name '*.verified.json' -not -name .lock").stdout == ""

    absent = _rigkit(
        "stage",
        str(LAB_INVENTORY),
        "--limit",
        names[0],
        "--data",
        f"model_source=shared:/mnt/not-mounted/tiny@{revision}",
        "--data",
        f"model_store_path={STORE}",
        timeout=300,
    )
    assert absent.returncode == 1, absent.stdout + absent.stderr
    assert f"{names[0]}: no directory /mnt/not-mounted/tiny on the rig" in absent.stderr, absent.stderr

    rig = pair[0]
    done = _rigkit("deploy", str(LAB_INVENTORY), "--limit", rig.name, "--data", f"model_source={spec}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert SHARED_ACTION in done.stdout + done.stderr
    inspect = json.loads(rig_exec(rig, "docker inspect rigkit-serving").stdout)[0]
    mount = next(m for m in inspect["Mounts"] if m["Destination"] == "/model")
    assert mount["Source"] == in_rigs and mount["RW"] is False
    models = rig_exec(rig, f"curl -s http://127.0.0.1:{rig.serving_port}/v1/models").stdout
    assert '"id":"tiny"' in models.replace(" ", ""), models
