"""The lab itself: real rigs answer SSH, pyinfra converges them, the registry serves both releases by
digest, vLLM runs inside a rig's own engine, and `lab down` leaves nothing behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import uuid
import warnings
from pathlib import Path

import pytest
import requests

from rigkit.fleet.pyinfra_args import rigkit_executable
from rigkit.lab import engine, netns, registry_server
from rigkit.lab import rigs as lab_rigs
from rigkit.lab.lab_model import ensure_lab_model
from rigkit.lab.pyinfra_output import parse_results
from rigkit.paths import CACHE_DIR, LAB_DIR, LAB_STATE_FILE

pytestmark = pytest.mark.lab

PROBE_DEPLOY = Path(__file__).resolve().parent / "deploys" / "probe.py"
PROBE_PATH = "/etc/rigkit-lab-probe"
VLLM_CONTAINER = "rigkit-lab-test-vllm"
IMAGE_TEST_MODEL = "/var/tmp/rigkit-lab-image-test-model"
VLLM_READY_TIMEOUT_S = 300.0
# vLLM CPU's engine core needs ~160 MiB of /dev/shm; Docker's default is 64 MiB (flag in the docker run below)
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
COMPLETION_TOKENS = 8


def test_lab_is_up_with_the_requested_rigs(lab, lab_rig_count):
    # `lab up` keeps rigs an earlier, bigger lab made (it never removes a rig someone may be using)
    assert [rig.name for rig in lab.rigs[:lab_rig_count]] == [f"rig{i}" for i in range(1, lab_rig_count + 1)]
    # a netns rig listens on port 22 of its own address
    assert len({(rig.ssh_host, rig.ssh_port) for rig in lab.rigs}) == len(lab.rigs)
    assert len({rig.serving_port for rig in lab.rigs}) == len(lab.rigs)
    assert registry_server.registry_answers(lab.registry)
    assert engine.bridge_networks() == [], "the lab engine must not have a bridge network"
    assert json.loads(LAB_STATE_FILE.read_text())["rigs"][0]["name"] == lab.rigs[0].name


def test_each_rig_answers_ssh_with_the_lab_key(lab, ssh_run):
    for rig in lab.rigs:
        status, out, err = ssh_run(rig, "hostname && systemctl is-system-running")
        assert status == 0, f"{rig.name}: {out} {err}"
        hostname, system_state = out.split()
        assert hostname == rig.name
        assert system_state == "running"


def test_each_rig_has_its_spare_nvme_as_an_unformatted_block_device(lab, rig_exec):
    for rig in lab.rigs:
        assert rig_exec(rig, f"test -b {rig.nvme_path}").returncode == 0
        size = int(rig_exec(rig, f"blockdev --getsize64 {rig.nvme_path}").stdout)
        assert size == lab_rigs.NVME_SIZE_BYTES
        # unformatted on a fresh lab; a test that formatted it must not leak into the next session
        fs_type = rig_exec(rig, f"blkid -o value -s TYPE {rig.nvme_path}", check=False).stdout.strip()
        assert fs_type in ("", "ext4", "xfs")


def test_nvme_path_survives_a_rig_restart(lab, rig_exec, ssh_run, assert_stack_comes_back):
    # a restarted netns rig needs `lab up` to re-plumb its veth: that is the next test
    rig = [rig for rig in lab.rigs if not rig.netns][-1]
    subprocess.run(["docker", "restart", rig.container], check=True, capture_output=True)
    deadline = time.monotonic() + 60
    while not lab_rigs.ssh_ready(rig):
        assert time.monotonic() < deadline, f"{rig.name} did not answer SSH after a restart"
        time.sleep(0.5)
    status, out, _ = ssh_run(rig, f"readlink -f {rig.nvme_path}")
    assert status == 0 and out.strip() == rig.loop_device
    assert_stack_comes_back(rig)


def test_a_restarted_netns_rig_is_replumbed_by_lab_up(
    lab, netns_rig, lab_rig_count, lab_netns_rig_count, rig_exec, ssh_run, assert_stack_comes_back
):
    from rigkit.lab.cli import lab_up

    subprocess.run(["docker", "restart", netns_rig.container], check=True, capture_output=True)
    # a new namespace: the old veth died with the old one, and the rig is unreachable until `lab up`
    # (the guard route fails the attempt at once instead of sending it out of the machine)
    assert not lab_rigs.ssh_ready(netns_rig)
    assert netns.guard_route_present()
    again = lab_up(lab_rig_count, progress=print, serving_image=False, netns_rigs=lab_netns_rig_count)
    assert again.rig(netns_rig.name) == netns_rig
    status, out, _ = ssh_run(netns_rig, "hostname; ip -4 -o addr show dev eth0")
    assert status == 0 and out.split()[0] == netns_rig.name and f"{netns_rig.rig_address}/30" in out
    # the rig pulls by the same reference as every rig: 127.0.0.1:5000 inside it reaches the lab registry
    rig_exec(netns_rig, f"curl -sf -o /dev/null http://{lab.registry}/v2/")
    forwarders = [
        pid
        for pid in netns.forwarder_processes()
        if f"/proc/{lab_rigs.container_pid(netns_rig.container)}/ns/net" in netns._cmdline(pid)
    ]
    assert len(forwarders) == 1, "one registry forwarder for the rig's current namespace"
    assert_stack_comes_back(netns_rig)


def test_pyinfra_deploys_to_every_rig_and_the_second_run_changes_nothing(lab, run_pyinfra, rig_exec):
    for rig in lab.rigs:
        rig_exec(rig, f"rm -f {PROBE_PATH}")
    first = run_pyinfra(deploy=PROBE_DEPLOY)
    assert first.returncode == 0, first.stdout + first.stderr
    total = parse_results(first.stdout + first.stderr)["Grand total"]
    assert (total.hosts, total.success, total.error, total.no_change) == (len(lab.rigs), len(lab.rigs), 0, 0)
    for rig in lab.rigs:
        assert rig_exec(rig, f"cat {PROBE_PATH}").stdout == "rigkit lab probe\n"

    second = run_pyinfra(deploy=PROBE_DEPLOY)
    assert second.returncode == 0, second.stdout + second.stderr
    total = parse_results(second.stdout + second.stderr)["Grand total"]
    assert (total.hosts, total.success, total.error, total.no_change) == (len(lab.rigs), 0, 0, len(lab.rigs))


def test_a_rig_engine_has_no_bridge(lab, rig_engine, rig_exec):
    rig = lab.rigs[0]
    rig_engine(rig)
    drivers = rig_exec(rig, "docker network ls --format '{{.Driver}}'").stdout.split()
    assert "bridge" not in drivers
    assert "host" in drivers


def test_both_serving_releases_pull_by_digest_inside_a_rig(lab, serving_image, rig_engine, rig_exec):
    releases = serving_image["releases"]
    assert set(releases) == {"1", "2"}
    assert releases["1"] != releases["2"]
    rig = lab.rigs[0]
    rig_engine(rig)
    for release, reference in releases.items():
        assert reference.startswith(f"{lab.registry}/") and "@sha256:" in reference
        rig_exec(rig, f"docker pull {reference}")
        digests = json.loads(
            rig_exec(rig, f"docker image inspect --format '{{{{json .RepoDigests}}}}' {reference}").stdout
        )
        assert reference in digests
        labels = json.loads(
            rig_exec(rig, f"docker image inspect --format '{{{{json .Config.Labels}}}}' {reference}").stdout
        )
        assert labels.get("org.rigkit.release") == release


def _stream_completion(port: int, model: str) -> tuple[list[str], dict]:
    response = requests.post(
        f"http://127.0.0.1:{port}/v1/completions",
        json={
            "model": model,
            "prompt": f"session {uuid.uuid4()}: hello",
            "max_tokens": COMPLETION_TOKENS,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        stream=True,
        timeout=120,
    )
    response.raise_for_status()
    texts, usage = [], {}
    for line in response.iter_lines(decode_unicode=True):
        if not line or not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: ") :])
        texts += [choice.get("text", "") for choice in chunk.get("choices", [])]
        usage = chunk.get("usage") or usage
    return texts, usage


@pytest.mark.vllm
def test_serving_image_runs_vllm_inside_a_rig_engine(lab, serving_image, rig_engine, rig_exec):
    # a host-network rig, on a free port of the shared loopback: a stack rigkit deployed may hold the
    # rig's serving port (a netns rig's port is not on the host's loopback: this test is about the image)
    rig = [rig for rig in lab.rigs if not rig.netns][-1]
    rig_engine(rig)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = " ".join(f"-e {key}={value}" for key, value in VLLM_ENV.items())
    # the image holds no model: the lab's, copied into the rig, mounted where a deploy mounts the staged one
    rig_exec(rig, f"rm -rf {IMAGE_TEST_MODEL}")
    subprocess.run(["docker", "cp", str(ensure_lab_model()), f"{rig.container}:{IMAGE_TEST_MODEL}"], check=True)
    rig_exec(
        rig,
        f"docker rm -f {VLLM_CONTAINER} >/dev/null 2>&1; "
        f"docker run -d --name {VLLM_CONTAINER} --network host --init --shm-size 1g {env} "
        f"-v {IMAGE_TEST_MODEL}:{serving_image['model_dir']}:ro {serving_image['releases']['1']} "
        f"{serving_image['python']} -m {serving_image['serve_module']} --model {serving_image['model_dir']} "
        f"--served-model-name {serving_image['served_model_name']} "
        f"--host 127.0.0.1 --port {port} --max-model-len 8192 --dtype bfloat16 "
        "--enable-prefix-caching --enforce-eager --enable-prompt-tokens-details",
    )
    try:
        deadline = time.monotonic() + VLLM_READY_TIMEOUT_S
        models = None
        while models is None:
            running = rig_exec(rig, f"docker inspect -f '{{{{.State.Running}}}}' {VLLM_CONTAINER}").stdout.strip()
            assert running == "true", (
                "vLLM exited:\n" + rig_exec(rig, f"docker logs --tail 40 {VLLM_CONTAINER}", check=False).stderr
            )
            assert time.monotonic() < deadline, f"/v1/models did not answer within {VLLM_READY_TIMEOUT_S} s"
            try:
                models = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
            except (requests.RequestException, ValueError):
                time.sleep(2)
        assert [model["id"] for model in models["data"]] == [serving_image["served_model_name"]]

        texts, usage = _stream_completion(port, serving_image["served_model_name"])
        assert len(texts) > 1, "a streaming completion arrives in several chunks"
        assert usage.get("completion_tokens") == COMPLETION_TOKENS
    finally:
        rig_exec(rig, f"docker rm -f {VLLM_CONTAINER}", check=False)


# ---- lab down: runs after every other test of the session -------------------------------------


def _lab_containers_in_data_root() -> list[str]:
    """Lab-labelled containers recorded in the engine's data root (seen even with the engine stopped)."""
    found = []
    for config in (engine.ENGINE_DATA_ROOT / "containers").glob("*/config.v2.json"):
        labels = json.loads(config.read_text()).get("Config", {}).get("Labels") or {}
        if labels.get("rigkit.lab") == str(LAB_DIR):
            found.append(config.parent.name)
    return found


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(f"{cmdline.parent.name}: {args[:160]}")
    return found


def _pid_alive(pid: int | None) -> bool:
    return bool(pid) and Path(f"/proc/{pid}").exists()


SUSPICIOUSLY_DEEP = 100


def _reap_if_child(pid: int | None) -> None:
    try:
        if pid:
            os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


@pytest.mark.lab_down_last
def test_lab_down_leaves_no_container_loop_device_mount_or_file(lab, rig_exec, tmp_path):
    if os.environ.get("RIGKIT_KEEP_LAB") == "1":
        pytest.skip("RIGKIT_KEEP_LAB=1: the lab stays up")

    # a rig that formatted and mounted its NVMe (as the L2 role does) must not block the teardown
    rig = lab.rigs[0]
    mounted = f"findmnt -n --source {rig.loop_device} >/dev/null"
    rig_exec(
        rig, f"{mounted} || {{ mkfs.ext4 -q -F {rig.nvme_path} && mkdir -p /mnt/l2 && mount {rig.nvme_path} /mnt/l2; }}"
    )
    rig_exec(rig, mounted)
    lab_devices = {r.loop_device for r in lab.rigs}
    engine_pid = lab.engine.get("pid") if lab.engine.get("started_by_lab") else None
    # something the lab did not make: a loop device outside LAB_DIR must survive
    bystander_image = tmp_path / "bystander.img"
    with open(bystander_image, "wb") as f:
        f.truncate(16 * 1024**2)
    bystander = subprocess.run(
        ["losetup", "--find", "--show", str(bystander_image)], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        # the CLI in its own process, as an operator runs it: whatever it holds open ends with it
        deepest = subprocess.run(
            ["sh", "-c", f"find {LAB_DIR} -xdev -printf '%d %p\\n' | sort -n | tail -1"], capture_output=True, text=True
        ).stdout.strip()
        if int(deepest.split(" ", 1)[0] or 0) > SUSPICIOUSLY_DEEP:  # the lab's own trees are ~26 levels deep
            warnings.warn(f"a path {deepest[:300]}... under the lab before `lab down`")
        down = subprocess.run([rigkit_executable(), "lab", "down"], capture_output=True, text=True, timeout=900)
        assert down.returncode == 0, f"rigkit lab down failed:\n{down.stdout[-4000:]}\n{down.stderr[-4000:]}"
        for pid in (lab.registry_pid, engine_pid):
            _reap_if_child(pid)  # this process started them (the lab fixture): their zombies are its to collect

        if engine.engine_answers():
            left = subprocess.run(
                ["docker", "ps", "-aq", "--filter", f"label=rigkit.lab={LAB_DIR}"], capture_output=True, text=True
            ).stdout.split()
            assert left == [], f"containers left: {left}"
        assert _lab_containers_in_data_root() == []
        losetup = subprocess.run(["losetup", "--list", "--json"], capture_output=True, text=True).stdout
        assert lab_rigs.loop_devices_backed_under(losetup, LAB_DIR) == []
        mountinfo = Path("/proc/self/mountinfo").read_text()
        assert str(LAB_DIR) not in mountinfo
        assert not any(f" {device} " in mountinfo for device in lab_devices)
        assert not _pid_alive(lab.registry_pid), "the registry still runs"
        assert not registry_server.registry_answers(lab.registry)
        if engine_pid:
            assert not _pid_alive(engine_pid), "the lab-started engine still runs"
        assert _processes_mentioning(str(LAB_DIR)) == []
        assert netns.forwarder_processes() == [], "a registry forwarder still runs"
        links = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout
        assert netns.lab_links(links) == [], "a lab veth is left"
        assert not netns.guard_route_present(), "the lab's unreachable route is left"
        assert not LAB_DIR.exists(), f"{LAB_DIR} still exists"
        assert CACHE_DIR.exists(), "the cache must survive `lab down`"
        assert (
            f"{bystander_image}"
            in subprocess.run(["losetup", "--list", "--json"], capture_output=True, text=True).stdout
        ), "lab down touched a loop device it did not make"
    finally:
        subprocess.run(["losetup", "--detach", bystander], capture_output=True)
