"""Fleet operation under faults, on real lab rigs with the real vLLM CPU stack.

- two deploys against one rig never interleave: the second waits, or is refused after rig_lock_wait_s;
- a rig stopped mid-deploy is named in `rigkit deploy`'s summary (step and reason), the others serve;
- a release whose container exits is rolled back automatically; both entries are in the ledger;
- a controller killed mid-deploy leaves no lock behind and a re-run converges;
- every lab row of the bad-input catalogue (docs/bad-input-catalogue.md) is refused and the rig is unchanged.

Uses the last three host-network rigs of the lab (rig1..rig3 in CI), by position, never by name.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from rigkit.fleet.outcome import FAILED, OK, UNREACHABLE
from rigkit.fleet.pyinfra_args import pyinfra_executable, rigkit_executable
from rigkit.paths import REPO_ROOT
from rigkit.remote.tunnel import serving_url
from rigkit.serving.ledger import LEDGER_PATH
from rigkit.serving.render import CONTAINER_NAME
from roles.rig_lock import HOLDER_PATH

LAB_INVENTORY = REPO_ROOT / "inventory" / "lab.py"


def rig_exec(rig, cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        ["docker", "exec", rig.container, "bash", "-c", cmd], capture_output=True, text=True, timeout=600
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{rig.name}: {cmd} exited {result.returncode}: {result.stdout[-2000:]}{result.stderr[-2000:]}"
        )
    return result


def run_pyinfra(args, deploy, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [pyinfra_executable(), "-y", *args, str(LAB_INVENTORY), str(deploy)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


pytestmark = [pytest.mark.lab]

HOLD_DEPLOY = Path(__file__).parent / "deploys" / "hold_rig_lock.py"
TRACE = "/tmp/rigkit-lock-trace"
BROKEN_TAG = "broken-no-api-server"


def fleet_rigs(lab, count: int = 3):
    """The last `count` lab rigs, whatever their network (the netns one is reached through the tunnel)."""
    if len(lab.rigs) < count:
        pytest.skip(f"needs {count} rigs, the lab has {len(lab.rigs)}")
    return lab.rigs[-count:]


def host_network_rigs(lab, count: int = 3):
    rigs = [rig for rig in lab.rigs if not rig.netns]
    if len(rigs) < count:
        pytest.skip(f"needs {count} host-network rigs, the lab has {len(rigs)}")
    return rigs[-count:]


def limit_args(rigs) -> list[str]:
    return [arg for rig in rigs for arg in ("--limit", rig.name)]


# The summary table fits the terminal: a wide one here, so each reason sits beside its row.
WIDE_TERMINAL = {**os.environ, "COLUMNS": "200"}


def rigkit_deploy(args: list[str], timeout: float = 1800) -> subprocess.CompletedProcess:
    rigkit = Path(rigkit_executable())
    return subprocess.run(
        [str(rigkit), "deploy", str(LAB_INVENTORY), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=WIDE_TERMINAL,
    )


def summary_rows(output: str) -> dict[str, list[str]]:
    """rig -> [status, step, reason, release] from the table `rigkit deploy` prints last; the reason in full
    (the table wraps it, and prints a reason it cut whole below, as "rig: reason")."""
    lines = output.split("--> rigkit fleet summary:", 1)[1].strip().splitlines()
    header = lines[0]
    starts = [header.index(word) for word in ("rig", "status", "step", "release", "reason")]
    rows: dict[str, list[str]] = {}
    current = None  # the rig whose reason a wrapped line continues
    for line in lines[1:]:
        if re.match(r"\d+ of \d+ rigs ", line):
            break
        name, sep, rest = line.partition(": ")
        if sep and name in rows:  # a reason in full, under the table
            rows[name][2], current = rest, name
        elif line.startswith("    ") and current:
            rows[current][2] += " " + line.strip()
        elif line.startswith(" "):  # a note
            current = None
        else:
            cells = [line[a:b].strip() for a, b in zip(starts, starts[1:] + [None])]
            rows[cells[0]], current = [cells[1], cells[2], cells[4], cells[3]], cells[0]
    return rows


def models(rig) -> list[str]:
    """/v1/models through the SSH tunnel, as the controller reaches any rig (a netns rig has no other way)."""
    data = dict(runpy.run_path(str(LAB_INVENTORY))["lab"])[rig.name]
    with serving_url(data, bind="127.0.0.1", port=rig.serving_port, inventory_name=rig.name) as url:
        response = requests.get(f"{url}/v1/models", timeout=10)
    response.raise_for_status()
    return [m["id"] for m in response.json()["data"]]


def serving_image_of(rig) -> str:
    """The image of the rig's serving container; "" while there is none (between down and up)."""
    return rig_exec(
        rig, f"docker inspect --format '{{{{.Config.Image}}}}' {CONTAINER_NAME}", check=False
    ).stdout.strip()


def ledger(rig) -> list[dict]:
    return json.loads(rig_exec(rig, f"cat {LEDGER_PATH}").stdout)["releases"]


def assert_ok(result):
    assert result.returncode == 0, f"failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"


@pytest.fixture(scope="module")
def fleet(lab, serving_image):
    """Release 1 on three rigs, deployed through `rigkit deploy`."""
    rigs = fleet_rigs(lab)
    result = rigkit_deploy(limit_args(rigs))
    assert_ok(result)
    rows = summary_rows(result.stdout)
    assert all(rows[rig.name][0] == OK for rig in rigs), result.stdout[-3000:]
    return rigs


@pytest.fixture(scope="module")
def broken_release(lab, serving_image, tmp_path_factory) -> str:
    """An honest bad release: release 1 without vLLM's API server module, so the engine exits at start-up."""
    context = tmp_path_factory.mktemp("broken-release")
    server = f"{serving_image['serve_module'].replace('.', '/')}.py"
    (context / "Dockerfile").write_text(
        f"FROM {serving_image['releases']['1']}\n"
        f"RUN rm $({serving_image['python']} -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')/{server}\n"
        "LABEL org.rigkit.release=broken\n"
    )
    reference = f"{lab.registry}/rigkit/vllm-cpu-tiny:{BROKEN_TAG}"
    subprocess.run(
        ["docker", "build", "-q", "--network", "host", "-t", reference, str(context)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    subprocess.run(["docker", "push", reference], check=True, capture_output=True, timeout=300)
    digests = json.loads(
        subprocess.run(
            ["docker", "inspect", "--format", "{{json .RepoDigests}}", reference],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    return next(d for d in digests if d.startswith(f"{lab.registry}/rigkit/vllm-cpu-tiny@"))


# The lock: no vLLM needed.


def test_two_deploys_on_one_rig_never_interleave(lab):
    rig = host_network_rigs(lab, 1)[0]
    rig_exec(rig, f"rm -f {TRACE}")
    # long enough for the refused deploy and the second one to start while it holds the lock, on 2 loaded cores
    args = [
        pyinfra_executable(),
        "-y",
        "--limit",
        rig.name,
        "--data",
        "hold_s=30",
        str(LAB_INVENTORY),
        str(HOLD_DEPLOY),
    ]
    first = subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while rig_exec(rig, f"grep -c start {TRACE} 2>/dev/null", check=False).stdout.strip() != "1":
        assert time.monotonic() < deadline and first.poll() is None, first.stdout.read()
        time.sleep(0.5)
    refused = run_pyinfra(["--limit", rig.name, "--data", "rig_lock_wait_s=1"], deploy="deploy.py")
    second = run_pyinfra(["--limit", rig.name, "--data", "hold_s=1"], deploy=HOLD_DEPLOY)
    first_output, _ = first.communicate(timeout=120)
    assert first.returncode == 0, first_output[-3000:]

    refused_output = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert "another deploy holds this rig's lock" in refused_output and "rig_lock_wait_s=1" in refused_output
    assert "Fix:" in refused_output
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "waiting up to" in second.stdout + second.stderr
    trace = rig_exec(rig, f"cat {TRACE}").stdout.split()
    assert trace[0::2] == ["start", "end", "start", "end"], trace  # one after the other, never interleaved
    assert rig_exec(rig, f"cat {HOLDER_PATH}").stdout.startswith("controller=")


# Faults during a fleet deploy.


@pytest.mark.vllm
def test_a_dry_run_of_a_rollout_shows_what_would_change_and_changes_nothing(lab, fleet):
    from rigkit.fleet.outcome import DRY_RUN
    from rigkit.rollout.record import record_path

    release_2 = lab.serving_image["releases"]["2"]
    record = record_path(str(LAB_INVENTORY))
    record_before = record.read_bytes() if record.exists() else None
    before = {rig.name: (serving_image_of(rig), len(ledger(rig))) for rig in fleet}
    result = rigkit_deploy([*limit_args(fleet), "--batch", "1", "--dry", "--data", f"serving_image={release_2}"])
    assert_ok(result)
    output = result.stdout + result.stderr
    flat = " ".join(output.split())
    plan = "; ".join(f"batch {i}: {rig.name}" for i, rig in enumerate(fleet, 1))
    assert f"The rollout would go: {plan}." in flat, flat[:2000]
    assert "--> Detected changes:" in output
    (release_row,) = [line for line in output.splitlines() if "serving | Release" in line]
    assert f"{len(fleet)} (" in release_row, release_row  # pyinfra's table: every rig would get the release
    rows = summary_rows(result.stdout)
    assert all(rows[rig.name][0] == DRY_RUN for rig in fleet), rows
    assert f"{len(fleet)} of {len(fleet)} rigs checked by a dry run (nothing changed)" in output
    assert {rig.name: (serving_image_of(rig), len(ledger(rig))) for rig in fleet} == before
    assert (record.read_bytes() if record.exists() else None) == record_before


@pytest.mark.vllm
def test_a_rig_stopped_mid_deploy_is_named_and_the_others_serve(lab, fleet):
    from rigkit.lab.cli import lab_up

    release_2 = lab.serving_image["releases"]["2"]
    victim, survivors = fleet[-1], fleet[:-1]
    process = subprocess.Popen(
        [
            rigkit_executable(),
            "deploy",
            str(LAB_INVENTORY),
            *limit_args(fleet),
            "--data",
            f"serving_image={release_2}",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=WIDE_TERMINAL,
    )
    try:
        deadline = time.monotonic() + 600
        # stop the rig once its release has begun: its old stack is going down or the new one coming up
        while serving_image_of(victim) != release_2 and time.monotonic() < deadline:
            assert process.poll() is None, process.stdout.read()[-4000:]
            time.sleep(1)
        subprocess.run(["docker", "stop", "-t", "1", victim.container], check=True, capture_output=True)
        output, _ = process.communicate(timeout=1800)
    finally:
        if process.poll() is None:  # a failed assertion above: never leave a deploy running behind
            process.communicate(timeout=1800)
        # restart the stopped rig (and re-plumb it when it lives in its own network namespace)
        lab_up(len(lab.rigs), progress=lambda *a: None, serving_image=False, netns_rigs=sum(r.netns for r in lab.rigs))
    assert process.returncode != 0, output[-4000:]
    rows = summary_rows(output)
    assert rows[victim.name][0] in (FAILED, UNREACHABLE), rows
    assert rows[victim.name][1] not in ("", "-") and rows[victim.name][2] not in ("", "-"), rows
    assert f"not completed: {victim.name}" in output, output.split("--> rigkit fleet summary:")[-1]
    for rig in survivors:
        assert rows[rig.name][0] == OK, rows
        assert models(rig) == ["tiny"] and serving_image_of(rig) == release_2
        assert ledger(rig)[-1]["image"] == release_2 and ledger(rig)[-1]["smoke"] == "pass"


@pytest.mark.vllm
def test_a_release_that_never_starts_is_rolled_back_automatically(lab, fleet, broken_release):
    rig = fleet[0]
    before = serving_image_of(rig)
    result = rigkit_deploy(["--limit", rig.name, "--data", f"serving_image={broken_release}"])
    output = result.stdout + result.stderr
    assert result.returncode != 0
    status, step, reason, release = summary_rows(result.stdout)[rig.name]
    assert status == FAILED and step == "serving | Smoke, ledger, prune", (status, step)
    assert f"rolled back to {before}" in reason and "rollback smoke=pass" in release
    assert "api_server" in output  # the container's own last words reach the operator
    assert models(rig) == ["tiny"] and serving_image_of(rig) == before
    failed, rolled_back = ledger(rig)[-2:]
    assert (failed["image"], failed["kind"], failed["smoke"]) == (broken_release, "deploy", "fail")
    assert "never became ready" in failed["note"]
    assert (rolled_back["image"], rolled_back["kind"], rolled_back["smoke"]) == (before, "rollback", "pass")
    assert "automatic" in rolled_back["note"]


@pytest.mark.vllm
def test_a_killed_controller_leaves_no_lock_and_a_rerun_converges(lab, fleet):
    rig = fleet[1]
    wanted = lab.serving_image["releases"]["1"]
    old = serving_image_of(rig)
    assert old != wanted, "the stopped-rig test leaves release 2 here; this test moves the rig to release 1"
    args = [
        pyinfra_executable(),
        "-y",
        "--limit",
        rig.name,
        "--data",
        f"serving_image={wanted}",
        str(LAB_INVENTORY),
        "deploy.py",
    ]
    controller = subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while serving_image_of(rig) != wanted:  # killed mid-release: new container started, not yet verified
        assert time.monotonic() < deadline and controller.poll() is None
        time.sleep(0.5)
    os.kill(controller.pid, signal.SIGKILL)
    controller.wait(10)
    assert rig_exec(rig, "cat /var/lib/rigkit/release.sha256", check=False).returncode != 0  # not verified yet

    started = time.monotonic()
    rerun = run_pyinfra(
        ["--limit", rig.name, "--data", f"serving_image={wanted}", "--data", "rig_lock_wait_s=30"],
        deploy="deploy.py",
        timeout=1800,
    )
    assert_ok(rerun)
    assert "another deploy holds" not in rerun.stdout + rerun.stderr  # the dead controller's lock was gone
    assert time.monotonic() - started < 600
    assert models(rig) == ["tiny"] and serving_image_of(rig) == wanted
    assert ledger(rig)[-1]["image"] == wanted and ledger(rig)[-1]["smoke"] == "pass"
    again = run_pyinfra(["--limit", rig.name, "--data", f"serving_image={wanted}"], deploy="deploy.py")
    assert_ok(again)
    assert "[" + rig.name + "] Success" not in again.stdout + again.stderr  # converged: a re-run changes nothing


# The bad-input catalogue on a real rig: refused, the field named, and nothing on the rig changed.

SNAPSHOT = (
    "cd / && sha256sum etc/rigkit/stack/* var/lib/rigkit/ledger.json var/lib/rigkit/release.sha256 "
    "etc/fstab 2>&1; docker ps -aq --no-trunc; docker images -q --no-trunc | sort; findmnt -rn -o TARGET,SOURCE "
    "| grep -v ' /dev/shm\\| /proc' | sort"
)
MISSING_DIGEST = "@sha256:" + "ab" * 32
PORT_HOLDER = (
    "python3 -c 'import socket,time; s=socket.socket(); s.bind((\"127.0.0.1\", {port})); s.listen(); time.sleep(600)'"
)

# case -> (extra --data, text the refusal must contain)
BAD_INPUTS = {
    "tag": (["serving_image=127.0.0.1:5000/rigkit/vllm-cpu-tiny:latest"], "tags are mutable"),
    "digest-not-in-registry": (
        ["serving_image=127.0.0.1:5000/rigkit/vllm-cpu-tiny" + MISSING_DIGEST],
        "no such manifest",
    ),
    "ram-gate": (["ram_reserve_gb=4000"], "MemAvailable"),
    "mem-limit": (["mem_limit_gb=1"], "mem_limit_gb"),
    "missing-nvme": (["l2_device=/dev/disk/by-id/nvme-not-plugged-in"], "no block device at this path"),
    "formatted-disk": (["l2_label=other-fs"], "labelled 'rigkit-l2', not rigkit's 'other-fs'"),
    "adapter-json": (["l2_adapter_json={bad"], "not valid JSON"),
    "unknown-knob": (["served_model_nmae=x"], "did you mean 'served_model_name'"),
    "newline": (["served_model_name=a\nb"], "contains a newline"),
    "port-in-use": ([], "is already in use by pid"),
    "incubating": (["serving_profile=lmcache-mp"], "allow_incubating"),
    # the image is the lab's release 1 (on the rig already: no registry outside loopback is asked)
    # the model is the lab group's staged model_source (a `model` beside it is refused as its own mistake)
    "gpu-profile": (["serving_profile=native-offload"], "but the rig reports none"),
}


@pytest.fixture(scope="module")
def converged_rig(lab, serving_image):
    """A rig the provisioning roles (docker, l2_disk, ...) have converged, so a refusal's snapshot compares only what
    the refused run itself could change. An image not in the registry is refused by the serving role, after them:
    such a run converges them and starts no vLLM (a fresh lab's rig gets its fstab entry there)."""
    rig = host_network_rigs(lab, 1)[0]
    missing = "serving_image=127.0.0.1:5000/rigkit/vllm-cpu-tiny" + MISSING_DIGEST
    converging = run_pyinfra(["--limit", rig.name, "--data", missing], deploy="deploy.py")
    assert converging.returncode != 0 and "no such manifest" in converging.stdout + converging.stderr
    return rig


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_refused_before_the_rig_changes(lab, converged_rig, case):
    rig = converged_rig
    data, expected = BAD_INPUTS[case]
    holder = None
    if case == "port-in-use":  # something that is not rigkit's stack listens on the port we ask for
        port = rig.serving_port + 500
        holder = subprocess.Popen(["docker", "exec", rig.container, "bash", "-c", PORT_HOLDER.format(port=port)])
        deadline = time.monotonic() + 20
        while f":{port:04X} " not in rig_exec(rig, "cat /proc/net/tcp").stdout:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        data = [f"serving_port={port}"]
    if case == "gpu-profile":
        data = data + [f"serving_image={lab.serving_image['releases']['1']}"]
    before = rig_exec(rig, SNAPSHOT, check=False).stdout
    try:
        args = ["--limit", rig.name] + [arg for item in data for arg in ("--data", item)]
        result = run_pyinfra(args, deploy="deploy.py")
    finally:
        if holder is not None:
            holder.kill()
            rig_exec(rig, "pkill -f 's.bind((\"127.0.0.1\"' || true", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert expected in output and "Fix:" in output, output[-3000:]
    assert rig_exec(rig, SNAPSHOT, check=False).stdout == before


def test_host_without_ssh_key_is_refused_before_pyinfra_runs(lab, tmp_path):
    rig = host_network_rigs(lab, 1)[0]
    inventory = tmp_path / "no_key.py"
    inventory.write_text(
        f"lab = [({rig.name!r}, {{'ssh_hostname': {rig.ssh_host!r}, 'ssh_port': {rig.ssh_port}, "
        f"'ssh_user': 'root', 'ssh_key': {str(tmp_path / 'missing-key')!r}}})]\n"
    )
    # A cursor, not a time: a second-granular --since also counted the previous test's login in the same second.
    cursor = rig_exec(
        rig, "journalctl -u ssh -n 1 --show-cursor -q --no-pager -o cat | sed -n 's/^-- cursor: //p'"
    ).stdout.strip()
    rigkit = Path(rigkit_executable())
    result = subprocess.run(
        [str(rigkit), "deploy", str(inventory)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"{rig.name}.ssh_key" in result.stderr and "Fix:" in result.stderr
    assert "Connecting to hosts" not in result.stdout  # pyinfra never started
    after = f"--after-cursor={shlex.quote(cursor)}" if cursor else ""
    logins = rig_exec(rig, f"journalctl -u ssh {after} --no-pager -q | grep -c Accepted || true").stdout
    assert logins.strip() in ("", "0")
