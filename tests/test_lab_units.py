"""Pure logic of the lab (no engine, no root): ports, state, mirrors, capabilities, teardown selection,
the runc wrapper's rewrite, and pyinfra's results table."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rigkit.errors import ConfigError, PreflightError
from rigkit.lab import engine, registry_server, rig_image, rigs
from rigkit.lab.proc import pid_runs
from rigkit.lab.pyinfra_output import OperationResult, parse_results
from rigkit.lab.state import LabState, RigState, pinned_model_source, read_state, write_state

# ---- capabilities ----

# CapBnd of the development VM (CAP_SYS_RESOURCE, bit 24, missing) and of a normal host
VM_STATUS = "Name:\tpython3\nCapInh:\t0000000000000000\nCapBnd:\t000001fffeffffff\nCapAmb:\t0000000000000000\n"
FULL_STATUS = "CapBnd:\t000001ffffffffff\n"


def test_cap_sys_resource_missing_on_the_vm_mask():
    assert engine.lacks_capability(VM_STATUS, engine.CAP_SYS_RESOURCE)
    assert not engine.lacks_capability(VM_STATUS, 23)  # CAP_SYS_NICE is there


def test_full_bounding_set_needs_no_wrapper():
    assert not engine.lacks_capability(FULL_STATUS, engine.CAP_SYS_RESOURCE)


def test_status_without_capbnd_is_an_error():
    with pytest.raises(ValueError):
        engine.capability_bounding_set("Name:\tx\n")


def test_dockerd_command_has_no_bridge_and_wrapper_only_when_asked():
    plain = engine.dockerd_command(use_wrapper=False)
    for flag in ("--bridge=none", "--iptables=false", "--ip-forward=false", "--ip-masq=false"):
        assert flag in plain
    assert "--default-runtime" not in plain
    wrapped = engine.dockerd_command(use_wrapper=True)
    assert wrapped[wrapped.index("--default-runtime") + 1] == engine.WRAPPER_RUNTIME_NAME


# ---- runc wrapper: drops CAP_SYS_RESOURCE, then execs the real runc ----


def _fake_runc(tmp_path: Path) -> Path:
    fake = tmp_path / "runc"
    fake.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/argv"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake


def _caps(*names):
    return {kind: list(names) for kind in ("bounding", "effective", "permitted", "inheritable")}


def test_wrapper_drops_the_capability_from_the_bundle_on_create(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(
        json.dumps({"process": {"capabilities": _caps("CAP_CHOWN", "CAP_SYS_RESOURCE")}})
    )
    fake = _fake_runc(tmp_path)
    args = ["--root", "/run/x", "--log", "/tmp/l", "create", "--bundle", str(bundle), "--pid-file", "/tmp/p", "cid"]
    subprocess.run(
        [sys.executable, str(engine.RUNC_WRAPPER_SOURCE), *args],
        check=True,
        env={**os.environ, "RIGKIT_REAL_RUNC": str(fake)},
    )
    caps = json.loads((bundle / "config.json").read_text())["process"]["capabilities"]
    assert caps == _caps("CAP_CHOWN")
    assert (tmp_path / "argv").read_text().split() == args


def test_wrapper_drops_the_capability_from_the_exec_process(tmp_path):
    process = tmp_path / "process.json"
    process.write_text(json.dumps({"args": ["sh"], "capabilities": _caps("CAP_SYS_RESOURCE", "CAP_KILL")}))
    fake = _fake_runc(tmp_path)
    subprocess.run(
        [sys.executable, str(engine.RUNC_WRAPPER_SOURCE), "exec", f"--process={process}", "cid"],
        check=True,
        env={**os.environ, "RIGKIT_REAL_RUNC": str(fake)},
    )
    assert json.loads(process.read_text())["capabilities"] == _caps("CAP_KILL")


def test_wrapper_leaves_other_commands_alone(tmp_path):
    fake = _fake_runc(tmp_path)
    subprocess.run(
        [sys.executable, str(engine.RUNC_WRAPPER_SOURCE), "--version"],
        check=True,
        env={**os.environ, "RIGKIT_REAL_RUNC": str(fake)},
    )
    assert (tmp_path / "argv").read_text().split() == ["--version"]


# ---- ports ----


def test_ports_start_after_the_base_and_are_stable_per_rig():
    assert rigs.allocate_ports(3, rigs.SSH_PORT_BASE) == [2201, 2202, 2203]
    assert rigs.allocate_ports(2, rigs.SERVING_PORT_BASE) == [8101, 8102]
    assert rigs.allocate_ports(5, rigs.SSH_PORT_BASE)[:3] == rigs.allocate_ports(3, rigs.SSH_PORT_BASE)


def test_reserved_ports_are_skipped():
    assert rigs.allocate_ports(4, 2021, reserved=frozenset({2024})) == [2022, 2023, 2025, 2026]


def test_ssh_and_serving_ports_never_collide():
    ssh = set(rigs.allocate_ports(50, rigs.SSH_PORT_BASE))
    serving = set(rigs.allocate_ports(50, rigs.SERVING_PORT_BASE))
    assert not ssh & serving
    assert 2024 not in ssh


def test_rig_index_from_container_name():
    assert rigs.rig_index("rigkit-lab-rig3") == 3
    assert rigs.rig_index("rigkit-lab-rig12") == 12
    assert rigs.rig_index("rigkit-lab-build-x") is None
    assert rigs.rig_index("other-rig1") is None


# ---- rig files ----


def test_sshd_config_listens_on_loopback_key_only():
    config = rigs.sshd_config(2203, "/etc/ssh/rigkit/key")
    assert "Port 2203\n" in config
    assert "ListenAddress 127.0.0.1\n" in config
    assert "PasswordAuthentication no\n" in config
    assert "PermitRootLogin prohibit-password\n" in config


def test_known_hosts_line_uses_bracketed_host_port():
    line = rigs.known_hosts_line(2201, "ssh-ed25519 AAAAC3Nz rig1@rigkit-lab")
    assert line == "[127.0.0.1]:2201 ssh-ed25519 AAAAC3Nz\n"


def test_known_hosts_line_is_read_by_paramiko(tmp_path):
    import paramiko

    key_path = tmp_path / "key"
    public = rigs._write_keypair(key_path, "test")
    known = tmp_path / "known_hosts"
    known.write_text(rigs.known_hosts_line(2201, public))
    host_keys = paramiko.HostKeys(str(known))
    loaded = paramiko.Ed25519Key.from_private_key_file(str(key_path))
    assert host_keys.check("[127.0.0.1]:2201", loaded)
    assert oct(key_path.stat().st_mode & 0o777) == "0o600"


def test_nvme_env_names_the_link_and_its_directory():
    env = rigs.nvme_env("/dev/loop3", "/dev/disk/by-id/nvme-rigkit-lab-rig2")
    assert env.splitlines() == [
        "LOOP_DEVICE=/dev/loop3",
        "NVME_PATH=/dev/disk/by-id/nvme-rigkit-lab-rig2",
        "NVME_DIR=/dev/disk/by-id",
    ]


# ---- teardown selection: only what the lab made ----

LOSETUP_JSON = json.dumps(
    {
        "loopdevices": [
            {"name": "/dev/loop0", "back-file": "/var/lib/rigkit-lab/rigs/rig1/nvme.img"},
            {"name": "/dev/loop1", "back-file": "/var/lib/rigkit-lab/rigs/rig2/nvme.img (deleted)"},
            {"name": "/dev/loop2", "back-file": "/var/lib/rigkit-lab-other/x.img"},
            {"name": "/dev/loop3", "back-file": "/home/user/disk.img"},
            {"name": "/dev/loop4", "back-file": None},
        ]
    }
)


def test_only_loop_devices_backed_by_lab_files_are_released():
    assert rigs.loop_devices_backed_under(LOSETUP_JSON, Path("/var/lib/rigkit-lab")) == ["/dev/loop0", "/dev/loop1"]


def test_no_loop_devices_when_losetup_lists_none():
    assert rigs.loop_devices_backed_under("", Path("/var/lib/rigkit-lab")) == []


def test_mounts_of_lab_devices_or_under_the_lab_dir_deepest_first():
    findmnt = json.dumps(
        {
            "filesystems": [
                {"source": "/dev/vda", "target": "/"},
                {"source": "/dev/loop0", "target": "/mnt/l2"},
                {"source": "tmpfs", "target": "/var/lib/rigkit-lab/rigs/rig1/docker"},
                {"source": "overlay", "target": "/var/lib/rigkit-lab/rigs/rig1/docker/overlay2/abc/merged"},
                {"source": "/dev/loop3", "target": "/home/user/mnt"},
                {"source": "tmpfs", "target": "/var/lib/rigkit-labX"},
            ]
        }
    )
    assert rigs.mounts_to_release(findmnt, ["/dev/loop0"], Path("/var/lib/rigkit-lab")) == [
        "/var/lib/rigkit-lab/rigs/rig1/docker/overlay2/abc/merged",
        "/var/lib/rigkit-lab/rigs/rig1/docker",
        "/mnt/l2",
    ]


# ---- apt mirror for debootstrap ----

DEB822 = """Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_mirror_from_deb822_sources():
    assert rig_image.parse_apt_mirror({"debian.sources": DEB822}) == "http://mirror.example/debian"


def test_mirror_ignores_security_only_disabled_and_foreign_files():
    sources = {
        "a.sources": "Types: deb\nURIs: http://sec.example/debian-security\nSuites: bookworm-security\n",
        "b.sources": "Enabled: no\nTypes: deb\nURIs: http://off.example/debian\nSuites: bookworm\n",
        "c.list.disabled-by-farm": "deb http://other.example/debian bookworm main\n",
        "d.sources": "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n",
    }
    assert rig_image.parse_apt_mirror(sources) is None


def test_mirror_from_one_line_list_with_options():
    sources = {
        "sources.list": "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main\n"
    }
    assert rig_image.parse_apt_mirror(sources) == "http://mirror.example/debian"


def test_rig_image_tag_changes_with_its_inputs(monkeypatch):
    tag = rig_image.rig_image_tag()
    assert tag == rig_image.rig_image_tag()
    monkeypatch.setattr(rig_image, "INSTALL_SCRIPT", rig_image.INSTALL_SCRIPT + "echo extra\n")
    assert rig_image.rig_image_tag() != tag


def test_rig_image_ships_a_no_bridge_daemon_json():
    assert rig_image.RIG_DAEMON_JSON == {"bridge": "none", "iptables": False, "ip-forward": False, "ip-masq": False}
    assert json.dumps(rig_image.RIG_DAEMON_JSON) in rig_image.INSTALL_SCRIPT
    assert "exit 101" in rig_image.INSTALL_SCRIPT  # package scripts must not start sshd on the host's port 22


# ---- registry config ----


def test_registry_config_binds_loopback_and_stores_in_the_cache():
    config = registry_server.registry_config("/var/cache/rigkit/registry")
    assert "addr: 127.0.0.1:5000\n" in config
    assert "rootdirectory: /var/cache/rigkit/registry\n" in config


# ---- state file ----


def _state() -> LabState:
    rig = RigState(
        name="rig1",
        container="rigkit-lab-rig1",
        ssh_host="127.0.0.1",
        ssh_port=2201,
        serving_port=8101,
        nvme_path="/dev/disk/by-id/nvme-rigkit-lab-rig1",
        loop_device="/dev/loop0",
        loop_image="/x/rigs/rig1/nvme.img",
        docker_dir="/x/rigs/rig1/docker",
    )
    return LabState(
        registry="127.0.0.1:5000",
        ssh_key="/x/ssh/id_ed25519",
        known_hosts="/x/ssh/known_hosts",
        rigs=[rig],
        serving_image={"releases": {"1": "a@sha256:1", "2": "a@sha256:2"}},
        engine={"pid": 12, "started_by_lab": True, "runtime_wrapper": True},
        registry_pid=13,
    )


def test_state_round_trips(tmp_path):
    path = tmp_path / "state.json"
    write_state(_state(), path)
    assert read_state(path) == _state()
    assert read_state(path).rig("rig1").ssh_port == 2201


def test_the_lab_groups_model_is_the_one_lab_up_pinned_and_none_without_a_lab(tmp_path):
    path = tmp_path / "state.json"
    assert pinned_model_source(path) is None  # group_data/lab.py loads for every inventory, also without a lab
    pinned = "controller:/var/cache/rigkit/lab-model/k@" + "ab" * 32
    write_state(dataclasses.replace(_state(), model_source=pinned), path)
    assert pinned_model_source(path) == pinned


def test_missing_state_says_run_lab_up(tmp_path):
    with pytest.raises(ConfigError, match="rigkit lab up"):
        read_state(tmp_path / "absent.json")


def test_lab_inventory_without_state_says_run_lab_up(tmp_path):
    inventory = Path(__file__).resolve().parent.parent / "inventory" / "lab.py"
    result = subprocess.run(
        [sys.executable, str(inventory)],
        capture_output=True,
        text=True,
        env={**os.environ, "RIGKIT_LAB_DIR": str(tmp_path)},
    )
    assert result.returncode != 0
    assert "run `rigkit lab up` first" in result.stderr


def test_lab_inventory_maps_each_rig_to_pyinfra_ssh_data(tmp_path):
    state = _state()
    write_state(state, tmp_path / "state.json")
    inventory = Path(__file__).resolve().parent.parent / "inventory" / "lab.py"
    code = f"import runpy, json; print(json.dumps(runpy.run_path({str(inventory)!r})['lab']))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "RIGKIT_LAB_DIR": str(tmp_path)},
    )
    [(name, data)] = json.loads(result.stdout)
    assert name == "rig1"
    assert data["ssh_port"] == 2201 and data["ssh_user"] == "root" and data["ssh_key"] == state.ssh_key
    assert data["ssh_known_hosts_file"] == state.known_hosts and data["ssh_strict_host_key_checking"] == "yes"
    assert data["ssh_allow_agent"] is False and data["ssh_look_for_keys"] is False
    assert data["serving_port"] == 8101 and data["l2_device"] == state.rigs[0].nvme_path and data["lab_rig"] is True


# ---- pyinfra results table ----

PYINFRA_OUTPUT = """--> Starting operation: rigkit lab probe file
    [rig2] No changes
    [rig1] Success

--> Results:
    Operation               Hosts   Success   Error   No Change   
    rigkit lab probe file   2       1         -       1           
    Ensure packages 2.0     2       -         2       -           
    Grand total             2       1         2       1           

--> Disconnecting from hosts...
"""


def test_pyinfra_results_table_is_parsed_by_operation():
    results = parse_results(PYINFRA_OUTPUT)
    assert results["rigkit lab probe file"] == OperationResult(hosts=2, success=1, error=0, no_change=1)
    assert results["Ensure packages 2.0"] == OperationResult(hosts=2, success=0, error=2, no_change=0)
    assert results["Grand total"] == OperationResult(hosts=2, success=1, error=2, no_change=1)


def test_pyinfra_output_without_results_gives_nothing():
    assert parse_results("--> Loading config...\n") == {}


# ---- refusals that carry the fix ----


def test_lab_up_as_non_root_names_the_fix(monkeypatch):
    from rigkit.errors import PreflightError
    from rigkit.lab import cli

    monkeypatch.setattr(cli.os, "geteuid", lambda: 1000)
    with pytest.raises(PreflightError, match="not root.*sudo"):
        cli.lab_up(1, progress=lambda _m: None)


def test_a_running_engine_with_a_bridge_is_refused(monkeypatch):
    from rigkit.errors import PreflightError

    monkeypatch.setattr(engine, "bridge_networks", lambda: ["bridge"])
    with pytest.raises(PreflightError, match="bridge.*--bridge=none"):
        engine._check_reusable(lambda _m: None)


def test_a_running_plain_runc_engine_is_refused_where_the_capability_is_missing(monkeypatch):
    from rigkit.errors import PreflightError

    monkeypatch.setattr(engine, "bridge_networks", lambda: [])
    monkeypatch.setattr(engine, "needs_runc_wrapper", lambda: True)
    monkeypatch.setattr(engine, "default_runtime", lambda: "runc")
    with pytest.raises(PreflightError, match="CAP_SYS_RESOURCE"):
        engine._check_reusable(lambda _m: None)


# ---- rigs in their own network namespace ----


def test_netns_rig_addresses_are_a_private_slash_30_per_rig():
    from rigkit.lab import netns

    assert netns.addresses(7) == ("10.213.7.1", "10.213.7.2")
    assert netns.addresses(1) != netns.addresses(2)
    assert len(netns.veth_name(netns.MAX_NETNS_RIG_INDEX)) <= 15  # IFNAMSIZ
    assert len(netns.peer_name(netns.MAX_NETNS_RIG_INDEX)) <= 15


def test_netns_rig_index_outside_the_subnet_is_refused():
    from rigkit.errors import PreflightError
    from rigkit.lab import netns

    with pytest.raises(PreflightError, match="fewer rigs"):
        netns.addresses(256)


def test_netns_rigs_are_the_last_of_the_requested_rigs():
    assert rigs.netns_indices(7, 1) == {7}
    assert rigs.netns_indices(3, 2) == {2, 3}
    assert rigs.netns_indices(2, 0) == set()


def test_more_netns_rigs_than_rigs_is_refused():
    from rigkit.errors import PreflightError

    with pytest.raises(PreflightError, match="--netns-rigs"):
        rigs.netns_indices(2, 3)


def test_an_existing_rig_keeps_its_network_mode():
    existing = {1: rigs.NETWORK_HOST, 2: rigs.NETWORK_HOST, 7: rigs.NETWORK_NETNS}
    # rig2 was asked for a netns but runs on host networking: not converted; rig3 is new: gets one
    assert rigs.network_modes({2, 3}, existing, 3) == {1: False, 2: False, 3: True}
    # rig7 made with a netns keeps it when a later `lab up` asks for none
    assert rigs.network_modes(set(), existing, 7)[7] is True


def test_netns_rig_sshd_listens_on_its_own_address_port_22():
    config = rigs.sshd_config(22, "/etc/ssh/rigkit/key", "10.213.7.2")
    assert "Port 22\n" in config and "ListenAddress 10.213.7.2\n" in config
    assert "127.0.0.1" not in config
    assert "PasswordAuthentication no\n" in config


def test_netns_rig_known_hosts_line_is_read_by_paramiko(tmp_path):
    import paramiko

    public = rigs._write_keypair(tmp_path / "key", "test")
    line = rigs.known_hosts_line(22, public, "10.213.7.2")
    assert line.startswith("10.213.7.2 ssh-ed25519 ")
    (tmp_path / "known_hosts").write_text(line)
    loaded = paramiko.Ed25519Key.from_private_key_file(str(tmp_path / "key"))
    assert paramiko.HostKeys(str(tmp_path / "known_hosts")).check("10.213.7.2", loaded)


IP_ADDR_JSON = json.dumps(
    [
        {
            "ifname": "lo",
            "flags": ["LOOPBACK", "UP", "LOWER_UP"],
            "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}],
        },
        {
            "ifname": "eth0",
            "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
            "addr_info": [
                {"family": "inet", "local": "192.0.2.2", "prefixlen": 24},
                {"family": "inet6", "local": "fd00::2", "prefixlen": 64},
            ],
        },
        {
            "ifname": "rigkit-rig7",
            "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
            "addr_info": [{"family": "inet", "local": "10.213.7.1", "prefixlen": 30}],
        },
        {
            "ifname": "rigkit-rig8",
            "flags": ["BROADCAST", "MULTICAST"],
            "addr_info": [{"family": "inet", "local": "10.213.8.1", "prefixlen": 30}],
        },
    ]
)


def test_veth_is_ok_only_up_with_its_address():
    from rigkit.lab import netns

    assert netns.has_address(IP_ADDR_JSON, "rigkit-rig7", "10.213.7.1")
    assert not netns.has_address(IP_ADDR_JSON, "rigkit-rig8", "10.213.8.1"), "down: must be re-plumbed"
    assert not netns.has_address(IP_ADDR_JSON, "rigkit-rig7", "10.213.7.2")
    assert not netns.has_address("", "rigkit-rig7", "10.213.7.1"), "absent (ip printed nothing)"


def test_lab_subnet_used_by_something_else_is_found():
    from rigkit.lab import netns

    assert netns.foreign_addresses_in_lab_subnet(IP_ADDR_JSON) == []
    taken = json.loads(IP_ADDR_JSON) + [
        {"ifname": "wg0", "flags": ["UP"], "addr_info": [{"family": "inet", "local": "10.213.0.9", "prefixlen": 24}]}
    ]
    assert netns.foreign_addresses_in_lab_subnet(json.dumps(taken)) == ["10.213.0.9 on wg0"]


def test_only_lab_veths_are_removed():
    from rigkit.lab import netns

    assert netns.lab_links(IP_ADDR_JSON) == ["rigkit-rig7", "rigkit-rig8"]


def test_state_of_a_netns_rig_round_trips_and_an_older_state_still_loads(tmp_path):
    state = _state()
    state.rigs.append(
        RigState(
            name="rig7",
            container="rigkit-lab-rig7",
            ssh_host="10.213.7.2",
            ssh_port=22,
            serving_port=8107,
            nvme_path="/dev/disk/by-id/nvme-rigkit-lab-rig7",
            loop_device="/dev/loop6",
            loop_image="/x/rigs/rig7/nvme.img",
            docker_dir="/x/rigs/rig7/docker",
            netns=True,
            host_address="10.213.7.1",
            rig_address="10.213.7.2",
        )
    )
    write_state(state, tmp_path / "state.json")
    assert read_state(tmp_path / "state.json") == state
    older = json.loads(state.to_json())
    for rig in older["rigs"]:
        for key in ("netns", "host_address", "rig_address"):
            rig.pop(key)
    older["rigs"][0]["from_a_newer_lab"] = 1
    (tmp_path / "older.json").write_text(json.dumps(older))
    assert [rig.netns for rig in read_state(tmp_path / "older.json").rigs] == [False, False]


def test_lab_inventory_reaches_a_netns_rig_at_its_own_address(tmp_path):
    state = _state()
    state.rigs = [
        RigState(
            name="rig7",
            container="rigkit-lab-rig7",
            ssh_host="10.213.7.2",
            ssh_port=22,
            serving_port=8107,
            nvme_path="/n",
            loop_device="/dev/loop6",
            loop_image="/i",
            docker_dir="/d",
            netns=True,
            host_address="10.213.7.1",
            rig_address="10.213.7.2",
        )
    ]
    write_state(state, tmp_path / "state.json")
    inventory = Path(__file__).resolve().parent.parent / "inventory" / "lab.py"
    code = f"import runpy, json; print(json.dumps(runpy.run_path({str(inventory)!r})['lab']))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "RIGKIT_LAB_DIR": str(tmp_path)},
    )
    [(name, data)] = json.loads(result.stdout)
    assert (name, data["ssh_hostname"], data["ssh_port"], data["serving_port"]) == ("rig7", "10.213.7.2", 22, 8107)


# ---- the registry forwarder (a real network namespace: needs root and unshare) ----


def _needs_root_and_unshare():
    import shutil

    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        pytest.skip("a real network namespace needs root, unshare and nsenter")


def test_forwarder_relays_from_inside_another_netns_and_exits_with_it(tmp_path):
    import http.server
    import threading
    import time

    from rigkit.lab import netns

    _needs_root_and_unshare()
    payload = os.urandom(3 * 1024 * 1024)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    holder = subprocess.Popen(["unshare", "--net", "sleep", "120"])
    forwarder = None
    try:
        time.sleep(0.3)
        in_ns = ["nsenter", "--target", str(holder.pid), "--net"]
        subprocess.run([*in_ns, "ip", "link", "set", "lo", "up"], check=True)
        # from inside the namespace the host's server is out of reach until the forwarder runs
        fetch = [
            *in_ns,
            sys.executable,
            "-c",
            f"import sys, urllib.request; sys.stdout.buffer.write(urllib.request.urlopen("
            f"'http://127.0.0.1:{port}/', timeout=10).read())",
        ]
        assert subprocess.run(fetch, capture_output=True).returncode != 0
        forwarder = subprocess.Popen(
            netns.forwarder_command(holder.pid, "127.0.0.1", port), stdout=subprocess.PIPE, text=True
        )
        assert "->" in forwarder.stdout.readline()  # listening
        fetched = subprocess.run(fetch, capture_output=True, timeout=30)
        assert fetched.returncode == 0, fetched.stderr
        assert fetched.stdout == payload
        assert netns.is_forwarder(netns._cmdline(forwarder.pid))
        holder.kill()
        holder.wait()
        forwarder.wait(timeout=10)  # the namespace is gone: the forwarder does not keep it alive
    finally:
        holder.kill()
        if forwarder and forwarder.poll() is None:
            forwarder.kill()
        server.shutdown()


def test_a_debian_13_rig_image_adds_the_split_docker_cli_and_keeps_the_bookworm_recipe():
    assert rig_image.install_script("bookworm") == rig_image.INSTALL_SCRIPT  # cached bookworm images stay valid
    trixie = rig_image.install_script("trixie")
    assert "docker.io docker-compose" in trixie and trixie.rstrip().endswith("echo '[rig image] done'")
    assert "docker-cli" in trixie.split("apt-get install", 2)[2].splitlines()[0]
    assert rig_image.rig_image_tag("trixie").startswith("rigkit-lab/rig:trixie-")
    assert rig_image.rig_image_tag("trixie") != rig_image.rig_image_tag("bookworm")
    with pytest.raises(PreflightError, match="--distros"):
        rig_image.ensure_rig_image(lambda message: None, "sid")


def test_a_lab_up_that_names_no_distribution_keeps_each_rig_s():
    from rigkit.lab.state import RigState

    def rig(index: int, distro: str) -> RigState:
        return RigState(
            name=f"rig{index}",
            container=rigs.container_name(f"rig{index}"),
            ssh_host="127.0.0.1",
            ssh_port=2200 + index,
            serving_port=8100 + index,
            nvme_path="",
            loop_device="",
            loop_image="",
            docker_dir="",
            distro=distro,
        )

    assert rigs.distros_of([rig(3, "bookworm"), rig(2, "trixie"), rig(1, "bookworm")]) == [
        "bookworm",
        "trixie",
        "bookworm",
    ]
    assert rigs.distros_of([rig(2, "trixie")]) == ["bookworm", "trixie"]
    assert rigs.distros_of([]) == []


REMOVE_TREE_IN_FEW_FDS = """
import resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
from rigkit.lab.proc import remove_tree
remove_tree(Path(sys.argv[1]), "test: remove the tree")
"""


def test_remove_tree_takes_a_tree_deeper_than_the_descriptors_it_may_hold(tmp_path):
    # shutil.rmtree holds two descriptors per level: with 64 allowed it fails on this tree (Errno 24)
    tree = tmp_path / "lab"
    deepest = tree.joinpath(*["d"] * 120)
    deepest.mkdir(parents=True)
    (deepest / "leaf").write_text("x")
    result = subprocess.run(
        [sys.executable, "-c", REMOVE_TREE_IN_FEW_FDS, str(tree)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert not tree.exists() and tmp_path.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_remove_tree_never_crosses_into_a_mount_and_names_it(tmp_path):
    from rigkit.lab.proc import LabStepError, remove_tree

    tree = tmp_path / "lab"
    mounted = tree / "rigs" / "still-mounted"
    mounted.mkdir(parents=True)
    (tree / "state.json").write_text("{}")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mounted)], check=True)
    try:
        (mounted / "precious").write_text("kept")
        with pytest.raises(LabStepError) as refused:
            remove_tree(tree, "test: remove the tree")
        assert f"findmnt -R {tree}" in str(refused.value)
        assert (mounted / "precious").read_text() == "kept"
        assert not (tree / "state.json").exists()
    finally:
        subprocess.run(["umount", str(mounted)], check=True)


def _lab_rig(index: int, netns: bool) -> RigState:
    name = rigs.rig_name(index)
    return RigState(
        name=name,
        container=rigs.container_name(name),
        ssh_host="127.0.0.1",
        ssh_port=2200 + index,
        serving_port=8100 + index,
        nvme_path="",
        loop_device="",
        loop_image="",
        docker_dir="",
        netns=netns,
    )


@pytest.mark.parametrize(
    "existing, count, netns_count, unmet",
    [
        (
            [(1, False), (2, False), (3, False)],
            3,
            1,
            ["rig3"],
        ),  # the lab up on host networking: rig3 cannot be converted
        ([(1, False), (2, False), (3, True)], 3, 1, []),  # the lab tests' shape
        ([(1, False), (2, False)], 3, 1, []),  # rig3 not made yet: lab up makes it in its own netns
        ([(1, False), (2, False), (3, True)], 3, 0, []),  # a netns rig beyond what is asked is no refusal
        ([(1, False), (2, False), (3, False)], 3, 2, ["rig2", "rig3"]),
    ],
)
def test_a_lab_of_the_wrong_shape_is_named_before_any_rig_changes(existing, count, netns_count, unmet):
    assert rigs.unconvertible([_lab_rig(i, netns) for i, netns in existing], count, netns_count) == unmet


def test_the_lab_router_runs_with_the_router_roles_health_checks():
    from rigkit.lab.router_server import router_argv
    from rigkit.router import HEALTH_FLAGS

    argv = router_argv(["http://127.0.0.1:8101"])
    assert " ".join(HEALTH_FLAGS) in " ".join(argv)
    assert argv[argv.index("--worker-urls") + 1 :] == ["http://127.0.0.1:8101"]


def test_lab_up_router_refuses_while_no_rig_serves_and_leaves_a_netns_rig_out(monkeypatch):
    from rigkit.lab import router_server

    monkeypatch.setattr(router_server, "start_daemon", lambda *a: pytest.fail("a router was started"))
    silent = [_lab_rig(1, False), _lab_rig(2, False), _lab_rig(3, True)]
    for rig in silent:  # nothing listens on these ports
        rig.serving_port = _free_port()
    with pytest.raises(PreflightError) as refused:
        router_server.ensure_router(silent, lambda line: None)
    assert "no lab rig on host networking serves yet" in refused.value.problem
    assert "rigkit deploy inventory/lab.py" in refused.value.fix


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_lab_router_is_known_by_its_front(monkeypatch, tmp_path):
    """The PID file names the front (it supervises vllm-router, which renames itself vllm::router): a PID file naming
    the front finds it; another program, vllm-router's own title included, not."""
    from rigkit.lab import router_server

    monkeypatch.setattr(router_server, "ROUTER_PID_FILE", tmp_path / "router.pid")
    titled = subprocess.Popen(["bash", "-c", "exec -a 'python3 /x/router_front.py --listen' sleep 30"])
    vllm_router = subprocess.Popen(["bash", "-c", "exec -a vllm::router sleep 30"])
    other = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.3)
        (tmp_path / "router.pid").write_text(f"{titled.pid}\n")
        assert router_server.router_pid() == titled.pid
        for stranger in (other, vllm_router):
            (tmp_path / "router.pid").write_text(f"{stranger.pid}\n")
            assert router_server.router_pid() is None
    finally:
        for process in (titled, other, vllm_router):
            process.kill()
            process.wait()


def test_a_process_that_exits_between_its_two_proc_reads_is_not_running(monkeypatch):
    """`lab down` once failed on a forwarder whose /proc/PID/stat was gone after its cmdline was read."""
    real = Path.read_text

    def stat_gone(path, *args, **kwargs):
        if path.name == "stat" and path.parent.name == str(os.getpid()):
            raise FileNotFoundError(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", stat_gone)
    assert pid_runs(os.getpid(), os.path.basename(sys.executable)) is False
