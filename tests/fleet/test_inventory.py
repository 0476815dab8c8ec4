"""rigkit.fleet.inventory: the hosts a --limit selects and the connection-data check."""

from __future__ import annotations

import pytest

from rigkit.errors import ConfigError
from rigkit.fleet.inventory import check_connection_data, targeted
from rigkit.fleet.pyinfra_args import limit_from


def test_limit_selects_names_groups_and_globs():
    hosts = {"rig1": {"groups": ["lab"]}, "rig2": {"groups": ["lab"]}, "gpu1": {"groups": ["big"]}}
    assert limit_from(["--limit", "rig1,big", "-v"]) == ["rig1", "big"]
    assert targeted(hosts, ["rig1", "big"]) == ["rig1", "gpu1"]
    assert targeted(hosts, ["rig*"]) == ["rig1", "rig2"]
    assert targeted(hosts, []) == ["rig1", "rig2", "gpu1"]


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
