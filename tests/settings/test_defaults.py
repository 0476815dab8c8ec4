"""rigkit.settings.defaults: every role variable declared once, prefixed by its role, documented, its default valid."""

from __future__ import annotations

import pytest

from rigkit.errors import ConfigError
from rigkit.settings.defaults import ALL_VARIABLES, ROLE_SECTIONS
from rigkit.settings.hostdata import rig_settings
from rigkit.settings.knobs import KNOBS

SECTION_PREFIXES = {
    "rig_lock": "rig_lock_",
    "nvidia_driver": "nvidia_driver_",
    "docker": "docker_",
    "nvidia_container_toolkit": "nvidia_ctk_",
    "l2_disk": "l2_",
    "rollout": "rollout_",
    "gpu_health": "gpu_",
}


def test_every_section_variable_carries_its_role_prefix():
    for section, prefix in SECTION_PREFIXES.items():
        for variable in ROLE_SECTIONS[section]:
            assert variable.name.startswith(prefix), f"{section}: {variable.name} lacks the prefix {prefix}"


def test_every_setting_is_declared_once_documented_and_its_default_valid():
    names = [variable.name for variable in ALL_VARIABLES] + [knob.name for knob in KNOBS]
    assert len(names) == len(set(names)), sorted(name for name in names if names.count(name) > 1)
    for variable in ALL_VARIABLES:
        assert variable.doc.strip(), f"{variable.name} has no doc"
        assert variable.coerce(variable.default) == variable.default, variable.name


@pytest.mark.parametrize(
    "name, value",
    [
        ("l2_mount_point", "/"),
        ("l2_mount_point", "/etc"),
        ("l2_mount_point", "/mnt/a b/../c"),
        ("l2_mount_point", "relative"),
        ("l2_cache_dir", "/etc"),
        ("l2_cache_dir", "../escape"),
        ("l2_mount_options", "noatime\nUUID=x / ext4 defaults 0 0"),
        ("l2_mount_options", "noatime,,nofail"),
        ("l2_owner", "root; rm -rf /"),
        ("l2_group", "Wheel"),
        ("l2_device", "/mnt/disk"),
        ("l2_device", "nvme0n1"),
        ("nvidia_driver_reboot_timeout", 0),
        ("l2_device", ("/dev/nvme0n1",)),
    ],
)
def test_l2_disk_and_driver_values_refused_naming_the_variable(name, value):
    with pytest.raises(ConfigError) as caught:
        rig_settings({name: value}, needs_stack=False)
    assert caught.value.field == name


def test_good_l2_disk_values_pass():
    data = {
        "l2_device": "/dev/disk/by-id/nvme-x",
        "l2_mount_point": "/mnt/l2 disk",
        "l2_cache_dir": "kv/lmcache",
        "l2_mount_options": "noatime,discard,nofail",
        "l2_owner": "vllm",
        "l2_group": "1000",
    }
    assert rig_settings(data, needs_stack=False).l2_disk["l2_cache_dir"] == "kv/lmcache"


def test_role_variables_refuse_what_their_target_cannot_take():
    import pytest

    from rigkit.errors import ConfigError
    from rigkit.settings.hostdata import rig_settings

    for bad in (
        {"docker_users": ["ok", "bad name;rm"]},
        {"docker_verify_image": "Busybox:Latest"},
        {"docker_daemon_options": {"data-root": "/etc"}},
        {"nvidia_ctk_verify_image": "@sha256:" + "a" * 64},
    ):
        with pytest.raises(ConfigError) as refused:
            rig_settings(bad, needs_stack=False)
        assert refused.value.field == next(iter(bad)), refused.value
    good = rig_settings(
        {
            "docker_users": ["vllm"],
            "docker_verify_image": "busybox:1.36",
            "docker_daemon_options": {"data-root": "/srv/docker"},
        },
        needs_stack=False,
    )
    assert good.docker["docker_users"] == ["vllm"]
