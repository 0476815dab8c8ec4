"""The Ansible peer benchmark's parts that run without the lab (bench/ansible_peer.py, bench/peer_bench.py).

The inventory is generated from a real lab state (tests/fixtures/lab/state.json, copied from `rigkit lab up`:
two host-network rigs, Debian 12 and 13, and a netns rig) through pyinfra's own inventory loading; the play is
run here with the local connection (tag ``files``: it writes files only, never touches Docker) against
temporary paths, and what it writes is compared byte for byte with rigkit's rendering.
"""

import functools
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from rigkit.errors import ConfigError
from rigkit.fleet.inventory import load_inventory
from rigkit.lab.rig_image import RIG_DAEMON_JSON
from rigkit.lab.state import read_state
from rigkit.operations.docker import merge_options, render_json
from rigkit.paths import REPO_ROOT
from rigkit.serving.commands import rendering_for
from rigkit.settings.hostdata import rig_settings

sys.path.insert(0, str(REPO_ROOT / "bench"))
import ansible_peer  # noqa: E402
import peer_bench  # noqa: E402
from peer_bench import (
    ANSIBLE,
    ANSIBLE_COLD,
    ANSIBLE_WARM,
    FLOOR,
    NO_CHANGE,
    RIGKIT,
    KnobChange,
    Results,  # noqa: E402
    Sample,
    format_table,
    knob_changed,
    parse_docker_time,
    parse_knob,
    verdicts,
)

LAB_STATE_DIR = REPO_ROOT / "tests" / "fixtures" / "lab"
# docker inspect --format '{{.State.StartedAt}}' of a lab rig, as the engine printed it
DOCKER_STARTED_AT = "2026-12-01T12:36:03.663007007Z"


@pytest.fixture(scope="module")
def lab_hosts():
    """host name -> host data of the lab inventory, as pyinfra merges it, for the captured lab state."""
    os.environ["RIGKIT_LAB_DIR"] = str(LAB_STATE_DIR)  # read by the child that loads the inventory
    try:
        return {name: host["data"] for name, host in load_inventory(str(REPO_ROOT / "inventory" / "lab.py")).items()}
    finally:
        del os.environ["RIGKIT_LAB_DIR"]


@pytest.fixture(scope="module")
def generated(lab_hosts, tmp_path_factory):
    directory = tmp_path_factory.mktemp("generated")
    rigs = {name: (data, rig_settings(data)) for name, data in lab_hosts.items()}
    inventory_file = ansible_peer.write_inputs(rigs, directory)
    return inventory_file, yaml.safe_load(inventory_file.read_text())["all"]["children"]["lab"]


@pytest.fixture(scope="module")
def playbook_bin():
    try:
        return ansible_peer.ensure_ansible()
    except (ConfigError, subprocess.CalledProcessError) as exc:  # no package registry reachable
        pytest.skip(f"ansible-core could not be installed: {exc}")


def test_inventory_connects_to_each_rig_as_pyinfra_does(generated):
    _, group = generated
    state = read_state(LAB_STATE_DIR / "state.json")
    assert sorted(group["hosts"]) == [rig.name for rig in state.rigs]
    for rig in state.rigs:
        hostvars = group["hosts"][rig.name]
        assert (
            hostvars["ansible_host"],
            hostvars["ansible_port"],
            hostvars["ansible_user"],
            hostvars["ansible_ssh_private_key_file"],
        ) == (rig.ssh_host, rig.ssh_port, "root", state.ssh_key)
        assert hostvars["ansible_ssh_common_args"].split() == [
            "-o",
            f"UserKnownHostsFile={state.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "IdentityAgent=none",
            "-o",
            "IdentitiesOnly=yes",
        ]
        assert hostvars["rigkit_ready_url"] == f"http://127.0.0.1:{rig.serving_port}/v1/models"
    assert group["hosts"]["rig3"]["ansible_host"] == "10.213.3.2" and group["hosts"]["rig3"]["ansible_port"] == 22
    assert group["vars"] == {
        "rigkit_daemon_json": "/etc/docker/daemon.json",
        "rigkit_stack_dir": "/etc/rigkit/stack",
        "rigkit_compose_project": "rigkit",
        "rigkit_container": "rigkit-serving",
    }


def test_inputs_are_rigkits_own_rendering(generated, lab_hosts):
    _, group = generated
    for name, data in lab_hosts.items():
        hostvars = group["hosts"][name]
        rendering = rendering_for(rig_settings(data).stack)
        assert Path(hostvars["rigkit_compose_src"]).read_text() == rendering.compose
        env = Path(hostvars["rigkit_env_src"])
        assert env.read_text() == rendering.env and env.stat().st_mode & 0o777 == 0o600
        assert hostvars["rigkit_image"] == read_state(LAB_STATE_DIR / "state.json").serving_image["releases"]["1"]
        assert hostvars["docker_daemon_options"] == {
            "bridge": "none",
            "iptables": False,
            "ip-forward": False,
            "ip-masq": False,
        }
        assert [d["path"] for d in hostvars["rigkit_dirs"]] == [
            "/etc/docker",
            "/etc/rigkit/stack",
            "/var/lib/rigkit",
            "/mnt/rigkit-l2/lmcache",
        ]


def test_an_ssh_setting_with_no_ansible_equivalent_is_refused(lab_hosts):
    data = {**lab_hosts["rig1"], "ssh_password": "x"}
    with pytest.raises(ConfigError) as caught:
        ansible_peer.ssh_common_args("rig1", data)
    assert caught.value.field == "rig1.ssh_password"


def test_requirements_pin_exactly_one_ansible_core(tmp_path):
    assert ansible_peer.pinned_requirement().startswith("ansible-core==")
    loose = tmp_path / "requirements.txt"
    loose.write_text("ansible-core>=2.19\n")
    with pytest.raises(ConfigError):
        ansible_peer.pinned_requirement(loose)


def test_the_venv_runs_the_pinned_ansible_core(playbook_bin):
    version = subprocess.run(
        [str(playbook_bin.with_name("ansible")), "--version"],
        capture_output=True,
        text=True,
        env=ansible_peer.playbook_env(Path("/nonexistent")),
    ).stdout
    assert f"[core {ansible_peer.pinned_requirement().split('==')[1]}]" in version.splitlines()[0]


def test_ansible_reads_the_tuning_from_its_config(playbook_bin, tmp_path):
    dump = subprocess.run(
        [str(playbook_bin.with_name("ansible-config")), "dump", "--only-changed", "-t", "all", "--format", "json"],
        capture_output=True,
        text=True,
        env=ansible_peer.playbook_env(tmp_path, tmp_path),
        check=True,
    ).stdout
    entries = json.loads(dump)
    core = {entry["name"]: entry["value"] for entry in entries if "name" in entry}
    ssh = next(plugin["ssh"] for entry in entries for plugin in entry.get("CONNECTION_PLUGINS", []) if "ssh" in plugin)
    ssh = {option["name"]: option["value"] for option in ssh}
    assert core["DEFAULT_GATHERING"] == "explicit" and core["DEFAULT_FORKS"] >= peer_bench.TARGET_RIGS
    assert ssh["pipelining"] is True
    assert "ControlMaster=auto" in ssh["ssh_args"] and "ControlPersist=" in ssh["ssh_args"]
    play = yaml.safe_load(ansible_peer.PLAYBOOK.read_text())
    assert [p["gather_facts"] for p in play] == [False]
    argv = ansible_peer.playbook_argv(playbook_bin, Path("inv.yml"), ["rig1", "rig2", "rig4", "rig5", "rig6"])
    assert argv[argv.index("--forks") + 1] == "5"


def test_the_playbook_parses(playbook_bin, generated, tmp_path):
    inventory_file, _ = generated
    subprocess.run(
        ansible_peer.playbook_argv(playbook_bin, inventory_file, ["rig1"], ["--syntax-check"]),
        env=ansible_peer.playbook_env(tmp_path, tmp_path),
        check=True,
        capture_output=True,
    )


def run_locally(playbook_bin, inventory_file, root: Path, options=("--tags", "files"), env=None, extra=None) -> str:
    """The play for rig1 on this machine (local connection), every path under ``root``; by default only its
    ``files`` tasks."""
    variables = {
        "rigkit_daemon_json": f"{root}/etc/docker/daemon.json",
        "rigkit_stack_dir": f"{root}/stack",
        "rigkit_dirs": [
            {"path": f"{root}/etc/docker", "mode": "0755"},
            {"path": f"{root}/stack", "mode": "0700"},
            {"path": f"{root}/state"},
        ],
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        **(extra or {}),
    }
    (root / "extra.json").write_text(json.dumps(variables))
    result = subprocess.run(
        ansible_peer.playbook_argv(playbook_bin, inventory_file, ["rig1"], [*options, "-e", f"@{root / 'extra.json'}"]),
        env={**ansible_peer.playbook_env(root / "cp", root), **(env or {})},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return result.stdout


run_files_locally = run_locally


def test_the_play_writes_the_files_rigkit_writes(playbook_bin, generated, lab_hosts, tmp_path):
    inventory_file, _ = generated
    settings = rig_settings(lab_hosts["rig1"])
    rendering = rendering_for(settings.stack)
    (tmp_path / "etc" / "docker").mkdir(parents=True)
    foreign = {"log-driver": "json-file", "bridge": "docker0"}  # a key rigkit does not own, one it does
    (tmp_path / "etc" / "docker" / "daemon.json").write_text(json.dumps(foreign))

    first = ansible_peer.parse_recap(run_files_locally(playbook_bin, inventory_file, tmp_path))
    assert first["rig1"].changed > 0 and ansible_peer.run_outcome(first, ["rig1"]) == "changed"
    assert (tmp_path / "stack" / "compose.yml").read_text() == rendering.compose
    env = tmp_path / "stack" / ".env"
    assert env.read_text() == rendering.env and env.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "stack").stat().st_mode & 0o777 == 0o700
    expected_daemon = render_json(merge_options(foreign, dict(settings.docker["docker_daemon_options"])))
    assert (tmp_path / "etc" / "docker" / "daemon.json").read_text() == expected_daemon

    again = run_files_locally(playbook_bin, inventory_file, tmp_path)
    assert ansible_peer.run_outcome(ansible_peer.parse_recap(again), ["rig1"]) == NO_CHANGE


def test_a_daemon_json_that_already_says_it_is_left_as_it_is(playbook_bin, generated, tmp_path):
    """The lab's rig image writes daemon.json on one line; rigkit's merge finds nothing to change and never
    rewrites it, so the play must not either (a rewrite would restart every rig's engine on a no-op)."""
    inventory_file, _ = generated
    (tmp_path / "etc" / "docker").mkdir(parents=True)
    lab_file = json.dumps(RIG_DAEMON_JSON) + "\n"  # as rigkit/lab/rig_image.py writes it (echo)
    (tmp_path / "etc" / "docker" / "daemon.json").write_text(lab_file)
    output = run_files_locally(playbook_bin, inventory_file, tmp_path)
    assert (tmp_path / "etc" / "docker" / "daemon.json").read_text() == lab_file
    merge_task = output[output.index("TASK [Merge the daemon options") :].split("TASK [", 2)[1]
    assert "skipping: [rig1]" in merge_task


# Stands in for the rig's docker and docker-compose: logs each call, keeps the image and the container state.
DOCKER_SHIM = """#!/bin/bash
echo "$(basename "$0") $* (in $PWD)" >> "$SHIM_DIR/calls"
case "$(basename "$0") $1 $2" in
  "docker image inspect") [ -e "$SHIM_DIR/image" ] ;;
  "docker pull "*) touch "$SHIM_DIR/image" ;;
  "docker compose version") [ -z "$SHIM_COMPOSE_V1" ] ;;
  "docker inspect --format") cat "$SHIM_DIR/running" 2>/dev/null || { echo "no such object" >&2; exit 1; } ;;
  "docker compose -p"|"docker-compose -p "*) echo true > "$SHIM_DIR/running" ;;
  *) echo "shim: unexpected $*" >&2; exit 2 ;;
esac
"""


@pytest.fixture
def docker_shim(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("docker", "docker-compose"):
        (bin_dir / name).write_text(DOCKER_SHIM)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SHIM_DIR": str(tmp_path)}


@pytest.fixture
def models_api(tmp_path):
    """A loopback HTTP server answering /v1/models, the rig's API as the play's last task polls it."""
    (tmp_path / "api" / "v1").mkdir(parents=True)
    (tmp_path / "api" / "v1" / "models").write_text('{"data": [{"id": "tiny"}]}')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "api"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/models"
    server.shutdown()
    server.server_close()


def shim_calls(root: Path) -> list[str]:
    calls = root / "calls"
    lines = calls.read_text().splitlines() if calls.exists() else []
    calls.unlink(missing_ok=True)
    return lines


def test_the_play_pulls_brings_up_and_waits_only_when_something_changed(
    playbook_bin, generated, lab_hosts, tmp_path, docker_shim, models_api
):
    inventory_file, group = generated
    image, stack = group["hosts"]["rig1"]["rigkit_image"], tmp_path / "stack"
    (tmp_path / "etc" / "docker").mkdir(parents=True)
    (tmp_path / "etc" / "docker" / "daemon.json").write_text(json.dumps(RIG_DAEMON_JSON) + "\n")
    engine = ("--skip-tags", "engine_restart")  # never this machine's engine, whatever the play decides
    first = run_locally(playbook_bin, inventory_file, tmp_path, engine, docker_shim, {"rigkit_ready_url": models_api})
    calls = shim_calls(tmp_path)
    assert [call.split(" (in ")[0] for call in calls[:-1]] == [
        f"docker image inspect --format . {image}",
        f"docker pull {image}",
        "docker compose version",
        "docker inspect --format {{.State.Running}} rigkit-serving",
    ]
    assert calls[-1] == f"docker compose -p rigkit up -d --remove-orphans (in {stack})"  # compose reads .env there
    assert ansible_peer.run_outcome(ansible_peer.parse_recap(first), ["rig1"]) == "changed"

    again = run_locally(playbook_bin, inventory_file, tmp_path, engine, docker_shim, {"rigkit_ready_url": models_api})
    assert not [call for call in shim_calls(tmp_path) if " pull " in call or " up " in call]
    assert ansible_peer.run_outcome(ansible_peer.parse_recap(again), ["rig1"]) == NO_CHANGE

    # a knob changed, on a Debian 12 rig (compose v1): the new files, then `docker-compose up -d`
    data = lab_hosts["rig1"]
    changed = ansible_peer.write_inputs({"rig1": (data, knob_changed(data, "max_num_seqs", 16))}, tmp_path / "knob")
    run_locally(
        playbook_bin,
        changed,
        tmp_path,
        engine,
        {**docker_shim, "SHIM_COMPOSE_V1": "1"},
        {"rigkit_ready_url": models_api},
    )
    assert shim_calls(tmp_path)[-1] == f"docker-compose -p rigkit up -d --remove-orphans (in {stack})"
    assert "--max-num-seqs 16" in (stack / "compose.yml").read_text()


def test_a_recap_missing_a_host_or_with_a_failure_is_no_outcome():
    output = (
        "PLAY RECAP *****\n"
        "rig1                       : ok=9    changed=0    unreachable=0    failed=0    skipped=1    rescued=0\n"
        "rig2                       : ok=3    changed=0    unreachable=0    failed=1    skipped=0    rescued=0\n"
    )
    recap = ansible_peer.parse_recap(output)
    assert recap["rig1"] == ansible_peer.HostRecap(ok=9, changed=0, unreachable=0, failed=0, skipped=1)
    assert ansible_peer.run_outcome(recap, ["rig1"]) == NO_CHANGE
    assert ansible_peer.run_outcome(recap, ["rig1", "rig2"]) is None
    assert ansible_peer.run_outcome(recap, ["rig1", "rig4"]) is None


def measured(noop: dict, knob: dict) -> Results:
    """Results of a bench run from figures (seconds per tool and rig count; made up for the verdict tests)."""
    results = Results(["rig1", "rig2", "rig4", "rig5"])
    for tool, by_count in noop.items():
        for count, seconds in by_count.items():
            for value in seconds:
                outcome = "fact" if tool == FLOOR else NO_CHANGE
                results.add(tool, count, Sample(*value) if isinstance(value, tuple) else Sample(value, outcome))
    results.knob.update(knob)
    return results


MADE_UP_KNOB = {
    RIGKIT: KnobChange(RIGKIT, "sets max_num_seqs back", 46.0, 40.0, True, True),
    ANSIBLE: KnobChange(ANSIBLE, "sets max_num_seqs=16", 43.0, 41.0, True, True),
}


def test_verdicts_of_a_run_that_meets_the_noop_targets_and_misses_the_knob_one():
    results = measured(
        {
            FLOOR: {1: [0.8], 4: [1.0, 1.1, 1.2]},
            RIGKIT: {1: [1.0], 4: [2.0, 2.1, 2.2]},
            ANSIBLE_WARM: {1: [5.0], 4: [11.0, 11.5, 12.0]},
            ANSIBLE_COLD: {1: [6.0], 4: [13.0]},
        },
        MADE_UP_KNOB,
    )
    noop_ansible, noop_floor, knob = verdicts(results)
    assert noop_ansible.met is True and "11.50 s with warm SSH masters (5.48x)" in noop_ansible.detail
    assert noop_floor.met is True and "(1.91x)" in noop_floor.detail
    assert knob.met is False and "rigkit 6.0 s" in knob.detail and "Ansible 2.0 s" in knob.detail


def test_verdicts_of_a_slow_noop():
    results = measured(
        {FLOOR: {4: [1.0]}, RIGKIT: {4: [4.5]}, ANSIBLE_WARM: {4: [6.0]}, ANSIBLE_COLD: {4: [8.0]}},
        {
            RIGKIT: KnobChange(RIGKIT, "", 42.0, 40.0, True, True),
            ANSIBLE: KnobChange(ANSIBLE, "", 43.0, 40.0, True, True),
        },
    )
    noop_ansible, noop_floor, knob = verdicts(results)
    assert (noop_ansible.met, noop_floor.met, knob.met) == (False, False, True)
    assert noop_ansible.line().startswith("[NOT MET] rigkit's no-op at least 5x faster than Ansible's, 4 rigs")


def test_a_noop_that_changed_something_or_a_knob_change_not_recreated_is_not_judged():
    results = measured(
        {FLOOR: {4: [1.0]}, RIGKIT: {4: [(2.0, "changed")]}, ANSIBLE_WARM: {4: [11.0]}, ANSIBLE_COLD: {4: [12.0]}},
        {RIGKIT: MADE_UP_KNOB[RIGKIT], ANSIBLE: KnobChange(ANSIBLE, "", 3.0, None, False, True)},
    )
    noop_ansible, noop_floor, knob = verdicts(results)
    assert (noop_ansible.met, noop_floor.met, knob.met) == (None, None, None)
    assert "rigkit changed something" in noop_ansible.detail and "Ansible (not recreated)" in knob.detail
    assert "2.00 s *" in format_table(results, 1) and "not a no-op" in format_table(results, 1)


def test_fewer_rigs_than_the_target_names_are_said():
    results = measured(
        {
            FLOOR: {1: [1.0], 2: [1.0]},
            RIGKIT: {1: [1.5], 2: [1.8]},
            ANSIBLE_WARM: {1: [9.0], 2: [9.5]},
            ANSIBLE_COLD: {1: [9.0], 2: [10.0]},
        },
        {},
    )
    assert "2 rigs (the target names 4)" in verdicts(results)[0].target


def test_the_table_puts_the_tools_side_by_side():
    results = measured(
        {
            FLOOR: {1: [0.8], 4: [1.0, 1.1, 1.2]},
            RIGKIT: {1: [1.0], 4: [2.0, 2.1, 2.2]},
            ANSIBLE_WARM: {1: [5.0], 4: [11.0, 11.5, 12.0]},
            ANSIBLE_COLD: {1: [6.0], 4: [13.0]},
        },
        MADE_UP_KNOB,
    )
    lines = format_table(results, 3).splitlines()
    assert lines[0].split() == [
        "measurement",
        "rigs",
        "pyinfra",
        "floor",
        "rigkit",
        "Ansible",
        "warm",
        "Ansible",
        "cold",
    ]
    assert lines[1].split() == ["no-op", "(median", "of", "3)", "1", "0.80", "s", "1.00", "s", "5.00", "s", "6.00", "s"]
    assert lines[2].split()[4:] == ["4", "1.10", "s", "2.10", "s", "11.50", "s", "13.00", "s"]
    knob_lines = [line for line in lines if "wall" in line]
    assert " ".join(knob_lines[0].split()) == (
        "rigkit sets max_num_seqs back wall 46.0 s engine start 40.0 s overhead 6.0 s recreated yes, serving yes"
    )
    assert "overhead 2.0 s" in " ".join(knob_lines[1].split())


def test_the_knob_is_read_as_pyinfras_data_option_reads_it(lab_hosts):
    assert parse_knob("max_num_seqs=16") == ("max_num_seqs", 16)
    assert parse_knob("trust_remote_code=true") == ("trust_remote_code", True)
    with pytest.raises(ConfigError):
        parse_knob("max_num_seq=16")
    changed = knob_changed(lab_hosts["rig1"], "max_num_seqs", 16)
    assert "--max-num-seqs 16" in rendering_for(changed.stack).compose
    with pytest.raises(ConfigError) as caught:  # group_data/lab.py sets 72 already: nothing would restart
        knob_changed(lab_hosts["rig1"], "num_gpu_blocks_override", 72)
    assert "renders the same" in caught.value.problem


def test_docker_start_times_are_read_to_the_microsecond():
    assert parse_docker_time(DOCKER_STARTED_AT) == pytest.approx(1796128563.663007, abs=1e-6)
    assert parse_docker_time("2026-12-01T12:36:03Z") == 1796128563.0
