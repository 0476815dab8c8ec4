"""The lab state file: what `lab up` made, read by the inventory, the tests and `lab down`."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rigkit.errors import ConfigError
from rigkit.paths import LAB_STATE_FILE


@dataclass
class RigState:
    name: str
    container: str
    ssh_host: str
    ssh_port: int
    serving_port: int
    nvme_path: str
    loop_device: str
    loop_image: str
    docker_dir: str
    # A rig in its own network namespace (a veth pair, a private /30): reached at rig_address:22,
    # its loopback is its own, so the controller reaches its serving API only through SSH.
    netns: bool = False
    host_address: str = ""  # the host end of the rig's veth ("" on host networking)
    rig_address: str = ""  # the rig end ("" on host networking)
    distro: str = "bookworm"  # the rig's Debian suite (rigkit.lab.rig_image.SUITES)

    @classmethod
    def from_dict(cls, data: dict) -> "RigState":
        return cls(**{key: value for key, value in data.items() if key in cls.__dataclass_fields__})


@dataclass
class LabState:
    registry: str
    ssh_key: str
    known_hosts: str
    rigs: list[RigState] = field(default_factory=list)
    rig_image: str = ""
    serving_image: dict | None = None
    engine: dict = field(default_factory=dict)
    registry_pid: int | None = None
    router: dict | None = None  # rigkit.lab.router_server.ensure_router's record while `lab up --router` runs one
    # the lab's model, pinned (controller:<dir>@<manifest sha256>): staged onto every rig by the deploy
    model_source: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict) -> "LabState":
        rigs = [RigState.from_dict(rig) for rig in data.get("rigs", [])]
        known = {name for name in cls.__dataclass_fields__ if name != "rigs"}
        return cls(rigs=rigs, **{key: value for key, value in data.items() if key in known})

    def ssh_data(self, rig: RigState) -> dict:
        """pyinfra's connection data for a lab rig (the lab inventory's, rigkit.remote.tunnel's input)."""
        return {
            "ssh_hostname": rig.ssh_host,
            "ssh_port": rig.ssh_port,
            "ssh_user": "root",
            "ssh_key": self.ssh_key,
            "ssh_known_hosts_file": self.known_hosts,
            "ssh_strict_host_key_checking": "yes",
            "ssh_allow_agent": False,
            "ssh_look_for_keys": False,
        }

    def rig(self, name: str) -> RigState:
        for rig in self.rigs:
            if rig.name == name:
                return rig
        raise KeyError(name)


def write_state(state: LabState, path: Path = LAB_STATE_FILE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.to_json())
    os.replace(tmp, path)


def read_state(path: Path = LAB_STATE_FILE) -> LabState:
    """The current lab; a clear error if there is none."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("lab state", str(path), "no lab is up", "run `rigkit lab up` first") from None
    except ValueError as exc:
        raise ConfigError(
            "lab state", str(path), f"unreadable ({exc})", "run `rigkit lab down` then `rigkit lab up`"
        ) from None
    return LabState.from_dict(data)


def read_state_or_none(path: Path = LAB_STATE_FILE) -> LabState | None:
    try:
        return read_state(path)
    except ConfigError:
        return None


def release_image(release: str, path: Path = LAB_STATE_FILE) -> str | None:
    """The lab's serving image of ``release`` ("1" or "2") by digest, or None when there is none yet."""
    state = read_state_or_none(path)
    if state is None or not state.serving_image:
        return None
    return state.serving_image.get("releases", {}).get(release)


def pinned_model_source(path: Path = LAB_STATE_FILE) -> str | None:
    """The lab's pinned model source (what every lab deploy stages and mounts), or None when there is none yet."""
    state = read_state_or_none(path)
    return state.model_source if state is not None else None
