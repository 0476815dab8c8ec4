"""The inventory's connection data rigkit reads itself (rigkit.settings.connection): typed and refused once per
host before any host is touched, in every entry point (rig_settings for pyinfra's own run, the inventory loader for
every rigkit command); the tunnel reads ssh_strict_host_key_checking as pyinfra does (issue 43)."""

from __future__ import annotations

import paramiko
import pytest

from rigkit.errors import ConfigError
from rigkit.fleet.inventory import check_inventory
from rigkit.remote.tunnel import _accept_new_policy, missing_host_key_policy
from rigkit.settings.connection import CONNECTION_VARIABLES, connection_values
from rigkit.settings.hostdata import rig_settings
from rigkit.settings.types import Kind
from rigkit.settings.variables import REDACTED

IMAGE = "registry.local/vllm@sha256:" + "a" * 64
RIG = {"serving_profile": "cpu-lab", "serving_image": IMAGE, "gpus": 0}


@pytest.mark.parametrize(
    "name, value, problem",
    [
        ("ssh_port", "22; x", "not a number"),
        ("ssh_port", 0, "between 1 and 65535"),
        ("ssh_port", 65536, "between 1 and 65535"),
        ("ssh_port", True, "boolean"),
        ("ssh_hostname", "192.0.2.11 x", "not an IP address"),
        ("ssh_hostname", "rig-a.lan/metrics", "not an IP address"),
        ("ssh_hostname", "192.0.2.11:8000", "not an IP address"),
        ("ssh_user", "-oProxyCommand=x", "not a user name"),
        ("ssh_user", "ops deploy", "not a user name"),
        ("ssh_user", "a" * 33, "not a user name"),
        ("ssh_key", "/home/ops/.ssh/id\nrsa", "control"),
        ("ssh_known_hosts_file", "/tmp/kh\x00", "control"),
        ("ssh_strict_host_key_checking", True, "a boolean"),
        ("ssh_strict_host_key_checking", "on", "must be one of"),
        ("ssh_strict_host_key_checking", "true", "must be one of"),
        ("ssh_allow_agent", "maybe", "not a boolean"),
    ],
)
def test_a_bad_connection_value_is_refused_naming_the_host_and_key(name, value, problem):
    with pytest.raises(ConfigError) as refused:
        connection_values({name: value}, "rig1")
    assert refused.value.field == f"rig1.{name}" and problem in refused.value.problem, str(refused.value)
    assert refused.value.fix


@pytest.mark.parametrize(
    "name, value, typed",
    [
        ("ssh_port", 1, 1),
        ("ssh_port", 65535, 65535),
        ("ssh_port", "2222", 2222),
        ("ssh_hostname", "192.0.2.11", "192.0.2.11"),
        ("ssh_hostname", "fd00::5", "fd00::5"),
        ("ssh_hostname", "rig-a.lan", "rig-a.lan"),
        ("ssh_user", "root", "root"),
        ("ssh_user", "a" * 32, "a" * 32),
        ("ssh_user", "svc_deploy.ops", "svc_deploy.ops"),
        ("ssh_strict_host_key_checking", "yes", "yes"),
        ("ssh_strict_host_key_checking", "accept-new", "accept-new"),
        ("ssh_allow_agent", "false", False),
    ],
)
def test_a_good_connection_value_is_kept_typed(name, value, typed):
    assert connection_values({name: value}, "rig1") == {name: typed}


def test_keys_rigkit_does_not_read_and_unset_ones_pass_untouched():
    assert connection_values({"ssh_paramiko_connect_kwargs": {"x": 1}, "ssh_port": None, "l1_size_gb": "x"}) == {}


def test_a_password_is_never_shown_in_its_refusal():
    with pytest.raises(ConfigError) as refused:
        connection_values({"ssh_password": "hunter 2"}, "rig1")
    assert refused.value.value == REDACTED and "hunter" not in str(refused.value)


def test_every_connection_variable_has_a_kind_or_is_a_boolean():
    for variable in CONNECTION_VARIABLES:
        assert variable.type is bool or isinstance(variable.check, Kind) or getattr(variable.check, "fix", ""), (
            variable.name
        )


def test_pyinfra_run_refuses_a_bad_port_before_any_host():
    with pytest.raises(ConfigError, match=r"ssh_port='22; x'"):
        rig_settings({**RIG, "ssh_port": "22; x"})
    assert rig_settings({**RIG, "ssh_port": 2222}).stack


def test_every_command_refuses_a_bad_hostname_when_the_inventory_is_loaded():
    hosts = {"rig1": {"data": {"ssh_hostname": "192.0.2.11 x"}, "groups": ["rigs"]}}
    with pytest.raises(ConfigError) as refused:
        check_inventory("inv.py", hosts, {"rigs": ["rig1"]}, {})
    assert refused.value.field == "rig1.ssh_hostname"


# ssh_strict_host_key_checking in rigkit's own connections: only accept-new (the default) takes a new key, only
# no/off trust every key; anything else rejects an unknown key (it never falls back to accepting it).


@pytest.mark.parametrize(
    "value, policy",
    [
        (None, "accept-new"),
        ("accept-new", "accept-new"),
        ("no", paramiko.AutoAddPolicy),
        ("off", paramiko.AutoAddPolicy),
        ("yes", paramiko.RejectPolicy),
        ("ask", paramiko.RejectPolicy),
        (True, paramiko.RejectPolicy),
        ("on", paramiko.RejectPolicy),
        ("true", paramiko.RejectPolicy),
        (False, paramiko.RejectPolicy),
    ],
)
def test_strict_host_key_checking_never_falls_back_to_accepting_new_keys(value, policy):
    data = {} if value is None else {"ssh_strict_host_key_checking": value}
    found = missing_host_key_policy(data)
    if policy == "accept-new":
        assert type(found).__name__ == type(_accept_new_policy(None)).__name__ == "AcceptNew"
    else:
        assert type(found) is policy
