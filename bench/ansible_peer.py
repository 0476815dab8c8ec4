"""The Ansible peer of rigkit's serving deploy: its pinned ansible-core (own venv), the inventory and inputs
the playbook (bench/ansible/deploy.yml) reads, the ansible-playbook command line, and its PLAY RECAP.

The inventory is made from the same host data rigkit deploys with (inventory/lab.py + group_data, as pyinfra
merges them): pyinfra's SSH keys become Ansible's connection variables, and compose.yml and .env are rendered
by rigkit's own renderer into files the playbook copies, so both tools put byte-identical files on the rig.
ansible-core never enters the main venv: ``ensure_ansible()`` installs it into bench/.venv-ansible on demand.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import yaml

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from rigkit.errors import ConfigError  # noqa: E402
from rigkit.paths import RIG_STACK_DIR, RIG_STATE_DIR  # noqa: E402
from rigkit.serving.commands import ready_url, rendering_for  # noqa: E402
from rigkit.serving.ledger import Rendering  # noqa: E402
from rigkit.serving.render import COMPOSE_FILE_NAME, COMPOSE_PROJECT, CONTAINER_NAME, ENV_FILE_MODE, ENV_FILE_NAME  # noqa: E402
from rigkit.settings.hostdata import RigSettings  # noqa: E402
from roles.docker import DAEMON_JSON  # noqa: E402

ANSIBLE_DIR = BENCH_DIR / "ansible"
REQUIREMENTS = ANSIBLE_DIR / "requirements.txt"  # the one pin of ansible-core
CONFIG = ANSIBLE_DIR / "ansible.cfg"
PLAYBOOK = ANSIBLE_DIR / "deploy.yml"
VENV_DIR = BENCH_DIR / ".venv-ansible"
GENERATED_DIR = ANSIBLE_DIR / "generated"  # inventory, rendered inputs, Ansible's own home (git-ignored)
INSTALLED_STAMP = ".installed-requirements"
GROUP = "lab"
MASTER_EXIT_WAIT_S = 5.0

# pyinfra SSH data key -> how the Ansible ssh connection gets the same behaviour. Anything else under ssh_ is
# refused: a connection setting silently dropped would time another connection than rigkit's.
SSH_HOST_VARS = {
    "ssh_hostname": "ansible_host",
    "ssh_port": "ansible_port",
    "ssh_user": "ansible_user",
    "ssh_key": "ansible_ssh_private_key_file",
}
SSH_OPTION_KEYS = ("ssh_known_hosts_file", "ssh_strict_host_key_checking", "ssh_allow_agent", "ssh_look_for_keys")


def pinned_requirement(requirements: Path = REQUIREMENTS) -> str:
    """The ``ansible-core==X.Y.Z`` line of the requirements file."""
    lines = [
        line.strip()
        for line in requirements.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if len(lines) != 1 or not re.fullmatch(r"ansible-core==\d+\.\d+\.\d+", lines[0]):
        raise ConfigError(
            "bench/ansible/requirements.txt",
            lines,
            "must pin exactly one ansible-core==X.Y.Z",
            "write one line such as ansible-core==2.19.14",
        )
    return lines[0]


def venv_bin(name: str, venv: Path = VENV_DIR) -> Path:
    return venv / "bin" / name


def ensure_ansible(venv: Path = VENV_DIR, python: str = sys.executable, requirements: Path = REQUIREMENTS) -> Path:
    """The venv's ansible-playbook, installing the pinned ansible-core first when the venv lacks that pin."""
    pin = pinned_requirement(requirements)
    stamp = venv / INSTALLED_STAMP
    if stamp.exists() and stamp.read_text().strip() == pin and venv_bin("ansible-playbook", venv).exists():
        return venv_bin("ansible-playbook", venv)
    if not venv_bin("python", venv).exists():
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
    result = subprocess.run(
        [str(venv_bin("pip", venv)), "install", "-q", "-r", str(requirements)], capture_output=True, text=True
    )
    if result.returncode != 0:
        version = subprocess.run([str(venv_bin("python", venv)), "-V"], capture_output=True, text=True).stdout.strip()
        raise ConfigError(
            "bench/ansible/requirements.txt",
            pin,
            f"pip could not install it into {venv} ({version}): {result.stderr.strip()[-600:]}",
            "pin an ansible-core whose Requires-Python admits that Python (2.19: 3.11+, 2.20: 3.12+)",
        )
    stamp.write_text(pin + "\n")
    return venv_bin("ansible-playbook", venv)


def ssh_common_args(name: str, data: Mapping[str, Any]) -> str:
    """OpenSSH options giving Ansible's connection what pyinfra's SSH data asks of rigkit's."""
    unmapped = sorted(
        key for key in data if key.startswith("ssh_") and key not in SSH_HOST_VARS and key not in SSH_OPTION_KEYS
    )
    if unmapped:
        raise ConfigError(
            f"{name}.{unmapped[0]}",
            data[unmapped[0]],
            "has no Ansible equivalent in the peer bench",
            f"map it in bench/ansible_peer.py (SSH_OPTION_KEYS) or remove it from {name}'s data",
        )
    options = []
    if data.get("ssh_known_hosts_file"):
        options.append(f"UserKnownHostsFile={data['ssh_known_hosts_file']}")
    if data.get("ssh_strict_host_key_checking"):
        options.append(f"StrictHostKeyChecking={data['ssh_strict_host_key_checking']}")
    if data.get("ssh_allow_agent") is False:
        options.append("IdentityAgent=none")
    if data.get("ssh_look_for_keys") is False:
        options.append("IdentitiesOnly=yes")  # only the key named, as paramiko's look_for_keys=False
    return " ".join(f"-o {shlex.quote(option)}" for option in options)


def directories(rig: RigSettings) -> list[dict[str, str]]:
    """The directories rigkit's roles ensure for the stack (daemon.json's, the stack's 0700, state, L2 dir)."""
    settings = rig.stack
    wanted = [
        {"path": str(Path(DAEMON_JSON).parent), "mode": "0755"},
        {"path": RIG_STACK_DIR, "mode": "0700"},
        {"path": RIG_STATE_DIR},
    ]
    if settings.l2_active:
        wanted.append({"path": settings.knobs["l2_path"]})
    return wanted


def host_vars(name: str, data: Mapping[str, Any], rig: RigSettings, inputs: Path) -> dict[str, Any]:
    """One rig's Ansible variables: its connection, and the inputs the playbook reads."""
    rendering = rendering_for(rig.stack)
    hostvars: dict[str, Any] = {ansible: data[key] for key, ansible in SSH_HOST_VARS.items() if key in data}
    common = ssh_common_args(name, data)
    if common:
        hostvars["ansible_ssh_common_args"] = common
    hostvars.update(
        {
            "docker_daemon_options": dict(rig.docker["docker_daemon_options"]),
            "rigkit_dirs": directories(rig),
            "rigkit_compose_src": str(inputs / COMPOSE_FILE_NAME),
            "rigkit_env_src": str(inputs / ENV_FILE_NAME),
            "rigkit_image": rig.stack.image,
            "rigkit_ready_url": ready_url(rendering),
            "rigkit_ready_timeout_s": rig.stack.knobs["ready_timeout_s"],
        }
    )
    return hostvars


GROUP_VARS = {
    "rigkit_daemon_json": DAEMON_JSON,
    "rigkit_stack_dir": RIG_STACK_DIR,
    "rigkit_compose_project": COMPOSE_PROJECT,
    "rigkit_container": CONTAINER_NAME,
}


def inventory(hosts: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """The Ansible YAML inventory: every rig in group ``lab`` with its variables, the paths as group vars."""
    return {"all": {"children": {GROUP: {"hosts": dict(hosts), "vars": dict(GROUP_VARS)}}}}


def write_inputs(rigs: Mapping[str, tuple[Mapping[str, Any], RigSettings]], directory: Path = GENERATED_DIR) -> Path:
    """Render each rig's compose.yml and .env with rigkit's renderer under ``directory/<rig>/`` (0700 dirs,
    .env 0600 as on the rig: it may hold a token) and write the inventory naming them; returns its path."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    hosts = {}
    for name, (data, rig) in rigs.items():
        inputs = directory / "inputs" / name
        inputs.mkdir(mode=0o700, parents=True, exist_ok=True)
        rendering: Rendering = rendering_for(rig.stack)
        (inputs / COMPOSE_FILE_NAME).write_text(rendering.compose)
        env_file = inputs / ENV_FILE_NAME
        env_file.touch(mode=ENV_FILE_MODE)
        env_file.chmod(ENV_FILE_MODE)
        env_file.write_text(rendering.env)
        hosts[name] = host_vars(name, data, rig, inputs)
    path = directory / "inventory.yml"
    path.write_text(
        "# Generated by bench/ansible_peer.py from the host data rigkit deploys with: do not edit.\n"
        + yaml.safe_dump(inventory(hosts), sort_keys=False)
    )
    return path


def playbook_env(control_path_dir: Path, generated: Path = GENERATED_DIR) -> dict[str, str]:
    """Environment of an ansible-playbook run: the bench's ansible.cfg, its own control sockets and home."""
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(CONFIG),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_path_dir),
        "ANSIBLE_HOME": str(generated / "home"),
        "ANSIBLE_LOCAL_TEMP": str(generated / "tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        # ansible-core refuses a controller locale that is not UTF-8
        "LC_ALL": "C.UTF-8",
        "LANG": "C.UTF-8",
    }


def playbook_argv(
    playbook_bin: Path, inventory_file: Path, limit: Sequence[str], extra: Sequence[str] = ()
) -> list[str]:
    """ansible-playbook on ``limit`` with at least one fork per rig (forks >= rigs, as Ansible's docs advise)."""
    return [
        str(playbook_bin),
        "-i",
        str(inventory_file),
        "--limit",
        ",".join(limit),
        "--forks",
        str(max(len(limit), 1)),
        *extra,
        str(PLAYBOOK),
    ]


@dataclass(frozen=True)
class HostRecap:
    ok: int
    changed: int
    unreachable: int
    failed: int
    skipped: int


RECAP_LINE = re.compile(r"^(?P<host>\S+)\s+:\s+(?P<counts>(?:\w+=\d+\s*)+)$")


def parse_recap(output: str) -> dict[str, HostRecap]:
    """host -> its PLAY RECAP counts (the last recap in ``output``)."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("PLAY RECAP")]
    recap: dict[str, HostRecap] = {}
    for line in lines[starts[-1] + 1 :] if starts else []:
        match = RECAP_LINE.match(line.strip())
        if not match:
            continue
        counts = dict((key, int(value)) for key, value in re.findall(r"(\w+)=(\d+)", match["counts"]))
        recap[match["host"]] = HostRecap(*(counts.get(field, 0) for field in HostRecap.__dataclass_fields__))
    return recap


def run_outcome(recap: Mapping[str, HostRecap], hosts: Sequence[str]) -> Optional[str]:
    """ "no change", "changed", or None when a host failed, was unreachable or is missing from the recap."""
    if any(name not in recap or recap[name].failed or recap[name].unreachable for name in hosts):
        return None
    return "changed" if any(recap[name].changed for name in hosts) else "no change"


def close_masters(control_path_dir: Path) -> None:
    """End the ControlPersist masters the bench's runs left in ``control_path_dir`` (each socket asked to exit)."""
    if not control_path_dir.is_dir():
        return
    for socket_path in control_path_dir.iterdir():
        subprocess.run(
            ["ssh", "-o", f"ControlPath={socket_path}", "-O", "exit", "bench-master"], capture_output=True, timeout=30
        )
    deadline = time.monotonic() + MASTER_EXIT_WAIT_S  # a master removes its socket as it exits
    while any(control_path_dir.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
