"""rigkit.fleet.inventory: the hosts a --limit selects and the connection-data check."""

from __future__ import annotations

import pytest

from rigkit.errors import ConfigError
from rigkit.fleet.inventory import check_connection_data, load_inventory, targeted
from rigkit.fleet.pyinfra_args import limit_from


def test_limit_selects_names_groups_and_globs():
    hosts = {"rig1": {"groups": ["lab"]}, "rig2": {"groups": ["lab"]}, "gpu1": {"groups": ["big"]}}
    assert limit_from(["--limit", "rig1,big", "-v"]) == ["rig1", "big"]
    assert targeted(hosts, ["rig1", "big"]) == ["rig1", "gpu1"]
    assert targeted(hosts, ["rig*"]) == ["rig1", "rig2"]
    assert targeted(hosts, []) == ["rig1", "rig2", "gpu1"]


def test_each_mistyped_limit_is_named_even_beside_good_ones():
    hosts = {"rig1": {"groups": ["lab"]}, "rig2": {"groups": ["lab"]}}
    with pytest.raises(ConfigError) as refused:
        targeted(hosts, ["rig1", "rgi2"])
    assert refused.value.field == "--limit" and refused.value.value == "rgi2" and "'rig2'" in refused.value.fix


@pytest.mark.parametrize(
    "pattern, fix",
    [
        ("rig7", "did you mean 'rig1' or 'rig2' or 'rig3'?"),  # the nearest hosts, not the group 'rigs'
        ("RIG2", "did you mean 'rig2'"),
        ("gpu-box", "did you mean 'gpu-box1'?"),
        ("rgis", "did you mean the group 'rigs'?"),  # no host near it: the nearest group
        ("zzz", "use host or group names: gpu-box1, rig1, rig2, rig3, rig4, big, rigs"),
    ],
)
def test_an_unknown_limit_suggests_the_nearest_hosts(pattern, fix):
    hosts = {f"rig{i}": {"groups": ["rigs", "all"]} for i in range(1, 5)} | {"gpu-box1": {"groups": ["big"]}}
    with pytest.raises(ConfigError) as refused:
        targeted(hosts, [pattern])
    assert refused.value.fix.startswith(fix), refused.value.fix


# The inventory files as pyinfra loads them, checked for what pyinfra takes silently (issue 25).


def inventory_in(tmp_path, inventory: str, **group_data: str) -> str:
    (tmp_path / "group_data").mkdir()
    for group, text in group_data.items():
        (tmp_path / "group_data" / f"{group}.py").write_text(text)
    (tmp_path / "fleet.py").write_text(inventory)
    return str(tmp_path / "fleet.py")


@pytest.mark.parametrize(
    "inventory, group_data, field, problem, fix",
    [
        ("rigs = []\n", {}, "inventory", "declares no hosts", "list the rigs"),
        ("rigs = ['a', ('b', {}), 'a']\n", {}, "fleet.py: rigs", "lists the host a twice", "once per group"),
        (
            "big = ['a']\nsmall = ['a', 'b']\n",
            {"big": "l1_size_gb = 60\n", "small": "l1_size_gb = 30\n"},
            "a.l1_size_gb",
            "groups big and small, whose data set l1_size_gb to 60 and 30",
            "one of the two groups",
        ),
        (
            "big = ['a']\nsmall = ['a']\n",
            {"big": "hf_token = 'hf_one_secret'\n", "small": "hf_token = 'hf_two_secret'\n"},
            "a.hf_token",
            "set hf_token to <secret> and <secret>",
            "one of the two groups",
        ),
        (
            "rigs = ['a']\n",
            {"rgis": "l1_size_gb = 60\n"},
            "group_data/rgis.py",
            "reaches no host",
            "group_data/rigs.py",
        ),
        (
            "rigs = ['a']\n",
            {"rigs": "l1_size_gb = 60\nraise RuntimeError('no digest yet')\n"},
            "inventory",
            "rigs.py:2 raised RuntimeError: no digest yet",
            "fix ",
        ),
    ],
)
def test_what_pyinfra_takes_silently_is_refused_naming_the_file_or_host(
    tmp_path, inventory, group_data, field, problem, fix
):
    path = inventory_in(tmp_path, inventory, **group_data)
    with pytest.raises(ConfigError) as refused:
        load_inventory(path, cwd=tmp_path)
    error = refused.value
    assert error.field.endswith(field) and problem in error.problem and fix in error.fix, str(error)
    assert "secret" not in str(error).replace("<secret>", "")


def test_a_group_data_file_of_another_inventory_is_fine(tmp_path):
    path = inventory_in(tmp_path, "rigs = ['a']\n", lab="l1_size_gb = 60\n", rigs="l1_size_gb = 30\n")
    hosts = load_inventory(path, cwd=tmp_path)
    assert hosts["a"]["data"]["l1_size_gb"] == 30


# Connection data (catalogue row "inventory host with no SSH key").


def test_host_with_no_ssh_key_and_nothing_to_fall_back_on_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        check_connection_data("rig9", {"ssh_hostname": "10.0.0.9", "ssh_allow_agent": False}, environ={})
    assert caught.value.field == "rig9.ssh_key" and "set ssh_key for rig9" in caught.value.fix


def test_missing_key_file_is_refused_with_its_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError) as caught:
        check_connection_data("rig9", {"ssh_key": str(missing)})
    assert caught.value.value == str(missing)


def test_key_file_agent_or_default_key_is_enough(tmp_path, monkeypatch):
    key = tmp_path / "key"
    key.write_text("k")
    check_connection_data("rig9", {"ssh_key": str(key)})
    check_connection_data("rig9", {}, environ={"SSH_AUTH_SOCK": "/tmp/agent"})
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_ed25519").write_text("k")
    check_connection_data("rig9", {"ssh_allow_agent": False}, environ={})
