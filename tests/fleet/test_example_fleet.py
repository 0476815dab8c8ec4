"""The worked real-fleet example loads through pyinfra's own inventory code and validates per host.

The lab inventory is checked the same way against a lab state file written here, so a key the lab
writes that no role or knob declares is caught without bringing the lab up.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rigkit.errors import ConfigError
from rigkit.paths import REPO_ROOT
from rigkit.serving.compose_guard import undeclared_variables
from rigkit.serving.render import render_compose, render_env
from rigkit.settings.hostdata import settings_for_host

EXAMPLE_GROUP_FILES = ("example_fleet.py", "example_dual_3090.py", "example_quad_gpu.py")
# pyinfra_cli monkey-patches the whole process with gevent on import: load inventories in a child.
LOAD_INVENTORY = """
import json, sys
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory_from_files
with ctx_state.use(State()):
    inventory = make_inventory_from_files(sys.argv[1], cwd=sys.argv[2])
print(json.dumps({host.name: host.data.dict() for host in inventory}))
"""


def load_hosts(inventory: Path, group_files, tmp_path: Path, env=None) -> dict[str, dict]:
    """host name -> host.data as pyinfra merges it (inventory + group_data), only the named group files."""
    group_dir = tmp_path / "group_data"
    group_dir.mkdir()
    for name in group_files:
        (group_dir / name).symlink_to(REPO_ROOT / "group_data" / name)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    result = subprocess.run(
        [sys.executable, "-c", LOAD_INVENTORY, str(inventory), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


@pytest.fixture
def fleet(tmp_path):
    return load_hosts(REPO_ROOT / "inventory" / "example_fleet.py", EXAMPLE_GROUP_FILES, tmp_path)


def test_example_fleet_shape(fleet):
    assert sorted(fleet) == ["rig-a", "rig-b", "rig-c"]
    for data in fleet.values():
        assert data["l2_device"].startswith("/dev/disk/by-id/nvme-")
    assert len({data["l2_device"] for data in fleet.values()}) == 3


def test_every_example_host_validates(fleet):
    settings = {name: settings_for_host(data) for name, data in fleet.items()}
    assert {name: s.knobs["l1_size_gb"] for name, s in settings.items()} == {"rig-a": 60, "rig-b": 60, "rig-c": 160}
    assert settings["rig-c"].knobs["tensor_parallel_size"] == 4 and settings["rig-a"].knobs["tensor_parallel_size"] == 2
    for name, s in settings.items():
        assert s.profile.name == "lmcache-mp" and s.l2_active
        assert s.knobs["l2_path"] == "/mnt/rigkit-l2/lmcache"  # where the l2_disk role mounts it
        assert s.knobs["mem_limit_gb"] >= s.l1_gib + s.knobs["model_size_gb"]
        assert s.capacity().startswith(f"L1 {s.l1_gib} GiB: ")
        assert undeclared_variables(render_compose(s)) == {}
        assert "LMCACHE_L1_GB='%d'" % s.l1_gib in render_env(s)


def test_a_typo_in_the_example_group_data_is_refused(fleet):
    data = {**fleet["rig-a"], "l1_size": 60}
    with pytest.raises(ConfigError) as caught:
        settings_for_host(data)
    assert caught.value.field == "l1_size" and "l1_size_gb" in caught.value.fix


@pytest.mark.skipif(not (REPO_ROOT / "inventory" / "lab.py").exists(), reason="no lab inventory yet")
def test_lab_inventory_data_validates(tmp_path):
    image = "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "7" * 64
    rig = {
        "name": "rig1",
        "container": "rigkit-rig1",
        "ssh_host": "127.0.0.1",
        "ssh_port": 2201,
        "serving_port": 8101,
        "nvme_path": "/dev/rigkit-nvme",
        "loop_device": "/dev/loop9",
        "loop_image": "/x/img",
        "docker_dir": "/x/docker",
    }
    state = {
        "registry": "127.0.0.1:5000",
        "ssh_key": "/x/key",
        "known_hosts": "/x/known",
        "rigs": [rig],
        "serving_image": {"repository": image.split("@")[0], "releases": {"1": image, "2": image}},
    }
    lab_dir = tmp_path / "lab"
    lab_dir.mkdir()
    (lab_dir / "state.json").write_text(json.dumps(state))
    workdir = tmp_path / "work"
    workdir.mkdir()
    hosts = load_hosts(REPO_ROOT / "inventory" / "lab.py", ["lab.py"], workdir, {"RIGKIT_LAB_DIR": str(lab_dir)})
    s = settings_for_host(hosts["rig1"])
    assert (s.profile.name, s.image, s.knobs["serving_port"], s.l2_active) == ("cpu-lab", image, 8101, True)
