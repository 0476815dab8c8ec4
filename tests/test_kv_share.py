"""The shared KV tier (rigkit.kv_share): settings and refusals, what it renders, the janitor's one rig, the
fleet-wide hash seed, and smoke's seed check."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from rigkit.errors import ConfigError
from rigkit.kv_share import check_inventory, check_shared_stores, fstab_entry_line, store_identity
from rigkit.lab.rigs import KV_SHARE_DIR, KV_SHARE_IN_RIG, has_kv_share, kv_share_mount_point_in_layer
from rigkit.serving.commands import rendering_for
from rigkit.serving.smoke import check_hash_seed
from rigkit.settings.hostdata import rig_settings

LAB_IMAGE = "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64
TIERED_IMAGE = "vllm/vllm-openai@sha256:" + "4" * 64
NAS = {"kv_share_source": "nas:/export/rigkit-kv", "kv_share_mount_point": "/mnt/kv"}
CPU_LAB = {"serving_profile": "cpu-lab", "serving_image": LAB_IMAGE, **NAS}
TIERED = {
    "serving_profile": "native-tiered",
    "serving_image": TIERED_IMAGE,
    "allow_incubating": True,
    "model": "Qwen/Qwen3-8B",
    **NAS,
}


def stack(data: dict):
    return rig_settings(data).stack


def service(data: dict) -> dict:
    return yaml.safe_load(rendering_for(stack(data)).compose)["services"]["serving"]


def connector_config(svc: dict) -> dict:
    return json.loads(re.search(r"--kv-transfer-config '(.*)'", svc["command"][0]).group(1))


# ---- settings and refusals ----


def test_kv_share_moves_the_connector_store_onto_the_shared_mount():
    assert stack(CPU_LAB).knobs["l2_path"] == "/mnt/rigkit-l2/lmcache"  # off: the store stays on the L2 disk
    assert stack({**CPU_LAB, "kv_share": True}).knobs["l2_path"] == "/mnt/kv/kv"
    assert (
        stack({**CPU_LAB, "kv_share": True, "kv_share_store_dir": "cpu-lab/tiny"}).knobs["l2_path"]
        == "/mnt/kv/cpu-lab/tiny"
    )


@pytest.mark.parametrize(
    "profile, extra",
    [
        ("native-offload", {"model": "m", "serving_image": "vllm/vllm-openai@sha256:" + "3" * 64}),
        (
            "lmcache-mp",
            {"model": "m", "allow_incubating": True, "serving_image": "lmcache/vllm-openai@sha256:" + "2" * 64},
        ),
        ("native-tiered-baseline", {"model": "m", "allow_incubating": True, "serving_image": TIERED_IMAGE}),
    ],
)
def test_kv_share_is_refused_for_a_profile_without_a_shared_capable_tier_naming_those_with_one(profile, extra):
    with pytest.raises(ConfigError) as caught:
        stack({**NAS, "serving_profile": profile, **extra, "kv_share": True})
    assert str(caught.value) == (
        f"kv_share=True: profile {profile} has no tier that can live on a shared mount. Fix: use a profile with one "
        "(cpu-lab, native-tiered), or set kv_share: false"
    )


def test_kv_share_without_a_declared_mount_is_refused():
    with pytest.raises(ConfigError) as caught:
        stack({"serving_profile": "cpu-lab", "serving_image": LAB_IMAGE, "kv_share": True})
    assert caught.value.field == "kv_share_source" and "kv_share_source" in caught.value.fix


@pytest.mark.parametrize("path", ["/var/lib/rigkit/kv", "/mnt/kv", "/mnt/kvother/x"])
def test_an_explicit_l2_path_off_the_shared_mount_is_refused(path):
    with pytest.raises(ConfigError) as caught:
        stack({**CPU_LAB, "kv_share": True, "l2_path": path})
    assert caught.value.field == "l2_path" and "/mnt/kv" in caught.value.problem


@pytest.mark.parametrize(
    "field, value, problem",
    [
        ("kv_share_source", "/export/rigkit-kv", "not an NFS export"),
        ("kv_share_source", "nas:export", "not an NFS export"),
        ("kv_share_source", "nas:/export/a b", "whitespace"),
        ("kv_share_mount_point", "/mnt", "system directory"),
        ("kv_share_mount_point", "/mnt/kv:ro", "':'"),
        ("kv_share_fstype", "cifs", "nfs4"),
        ("kv_share_mount_options", "noatime, hard", "blank"),
        ("kv_share_store_dir", "/abs", "relative"),
        ("kv_hash_seed", -1, "between 0 and 4294967295"),
        ("kv_hash_seed", 2**32, "4294967295"),
    ],
)
def test_bad_share_settings_are_refused_naming_the_field(field, value, problem):
    with pytest.raises(ConfigError) as caught:
        rig_settings({**CPU_LAB, field: value})
    assert caught.value.field == field and problem in f"{caught.value.problem} {caught.value.fix}"


def test_a_directory_already_shared_needs_no_nfs_form():
    section = rig_settings(
        {**CPU_LAB, "kv_share_source": "lab:/var/lib/rigkit-lab/kv-share", "kv_share_fstype": "none"}
    ).kv_share
    assert section["kv_share_fstype"] == "none"


def test_the_fstab_line_quotes_its_fields_and_skips_the_fsck_pass():
    section = rig_settings({**CPU_LAB, "kv_share_mount_point": "/mnt/rig kv"}).kv_share
    assert fstab_entry_line(section) == "nas:/export/rigkit-kv /mnt/rig\\040kv nfs4 _netdev,nofail,noatime 0 0"


# ---- rendering ----


def test_cpu_lab_on_the_shared_store_binds_it_where_the_connector_reads_and_hashes_with_the_fleet_seed():
    svc = service({**CPU_LAB, "kv_share": True, "kv_hash_seed": 11})
    assert svc["volumes"] == [{"type": "bind", "source": "/mnt/kv/kv", "target": "/kv-store"}]
    assert connector_config(svc)["kv_connector_extra_config"] == {"shared_storage_path": "/kv-store"}
    assert (
        rendering_for(stack({**CPU_LAB, "kv_share": True, "kv_hash_seed": 11})).container_env()["PYTHONHASHSEED"]
        == "11"
    )


def test_cpu_lab_off_the_shared_store_renders_as_before_without_a_seed():
    own = stack(CPU_LAB)
    assert "PYTHONHASHSEED" not in rendering_for(own).container_env()
    # the new knobs at their defaults leave the knobs hash (and so every deployed rig) where it was
    assert (
        own.knobs_hash == stack({**CPU_LAB, "kv_share": False, "kv_hash_seed": 0, "kv_share_janitor": True}).knobs_hash
    )


def test_native_tiered_on_the_shared_store_puts_its_fs_tier_root_there():
    svc = service({**TIERED, "kv_share": True})
    assert svc["volumes"] == [{"type": "bind", "source": "/mnt/kv/kv", "target": "/kv-store"}]
    tiers = connector_config(svc)["kv_connector_extra_config"]["secondary_tiers"]
    assert tiers == [{"type": "fs", "root_dir": "/kv-store"}]
    assert rendering_for(stack({**TIERED, "kv_share": True})).container_env()["PYTHONHASHSEED"] == "0"


# ---- the janitor: one rig per shared store ----


def test_only_the_stores_janitor_rig_runs_the_janitor_on_a_shared_store():
    assert stack(CPU_LAB).runs_l2_janitor  # its own store: its own janitor, as before
    assert not stack({**CPU_LAB, "kv_share": True}).runs_l2_janitor
    assert stack({**CPU_LAB, "kv_share": True, "kv_share_janitor": True}).runs_l2_janitor


# ---- the fleet: one seed and one janitor per shared store ----


def rig(seed=0, janitor=False, share=True, source="nas:/export/rigkit-kv") -> dict:
    return {**CPU_LAB, "kv_share_source": source, "kv_share": share, "kv_hash_seed": seed, "kv_share_janitor": janitor}


def test_rigs_sharing_a_store_with_one_seed_and_one_janitor_pass():
    check_shared_stores([("rig1", rig(janitor=True)), ("rig2", rig()), ("rig3", rig(seed=5, share=False))])


def test_a_rig_declaring_another_seed_on_the_same_store_is_refused_naming_both():
    with pytest.raises(ConfigError) as caught:
        check_shared_stores([("rig1", rig(janitor=True)), ("rig2", rig()), ("rig3", rig(seed=7))])
    assert caught.value.field == "rig3.kv_hash_seed" and caught.value.value == 7
    assert "rig1's 0" in caught.value.problem and "nas:/export/rigkit-kv" in caught.value.problem


def test_stores_on_other_exports_keep_their_own_seed():
    check_shared_stores([("rig1", rig(janitor=True)), ("rig2", rig(seed=7, janitor=True, source="nas2:/kv"))])


@pytest.mark.parametrize("janitors, words", [((True, True), "rig1, rig2 all run"), ((False, False), "no rig runs")])
def test_a_shared_store_needs_exactly_one_janitor(janitors, words):
    with pytest.raises(ConfigError) as caught:
        check_shared_stores([("rig1", rig(janitor=janitors[0])), ("rig2", rig(janitor=janitors[1]))])
    assert caught.value.field == "kv_share_janitor" and words in caught.value.problem


@pytest.mark.parametrize("other", ["nas:/export/rigkit-kv/", "NAS:/export//rigkit-kv", "nas:/export/./rigkit-kv"])
def test_one_export_spelled_two_ways_is_one_store_with_one_janitor_and_one_seed(other):
    with pytest.raises(ConfigError) as caught:
        check_shared_stores([("rig1", rig(janitor=True)), ("rig2", rig(janitor=True, source=other))])
    assert caught.value.field == "kv_share_janitor" and "rig1, rig2 all run" in caught.value.problem
    with pytest.raises(ConfigError) as caught:
        check_shared_stores([("rig1", rig(janitor=True)), ("rig2", rig(seed=7, source=other))])
    assert caught.value.field == "rig2.kv_hash_seed"


def test_the_inventory_check_leaves_the_gateways_out():
    gateway = {"kv_share": True, "kv_share_source": "nas:/export/rigkit-kv", "kv_hash_seed": 9}
    check_inventory([("rig1", ["lab"], rig(janitor=True)), ("gw", ["routers"], gateway)])
    with pytest.raises(ConfigError):
        check_inventory([("rig1", ["lab"], rig(janitor=True)), ("gw", ["lab"], gateway)])


# ---- smoke: the container's seed against the fleet's ----


def made_up_container_env(data: dict) -> str:
    """What `docker exec rigkit-serving env` prints for this rendering (made up: the declared environment plus
    what docker itself sets; no capture of a kv_share container exists yet)."""
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOSTNAME": "rig1",
        **rendering_for(stack(data)).container_env(),
        "HOME": "/root",
    }
    return "".join(f"{name}={value}\n" for name, value in env.items())


def test_smoke_passes_a_container_hashing_with_the_declared_seed():
    check = check_hash_seed(made_up_container_env({**CPU_LAB, "kv_share": True, "kv_hash_seed": 3}), 3)
    assert check.ok and "PYTHONHASHSEED=3" in check.detail


def test_smoke_fails_a_container_with_another_seed_or_none():
    other = check_hash_seed(made_up_container_env({**CPU_LAB, "kv_share": True, "kv_hash_seed": 3}), 0)
    assert not other.ok and "'3'" in other.detail and "declares 0" in other.detail
    unset = check_hash_seed(made_up_container_env(CPU_LAB), 0)
    assert not unset.ok and "random seed per process" in unset.detail


# ---- the lab's stand-in for a NAS ----


def test_a_lab_rig_container_is_reused_only_with_the_shared_directory_bind_mounted():
    mounts = [{"Type": "bind", "Source": "/var/lib/rigkit-lab/rigs/rig1/docker", "Destination": "/var/lib/docker"}]
    assert not has_kv_share({"Mounts": mounts})
    shared = {"Type": "bind", "Source": str(KV_SHARE_DIR), "Destination": KV_SHARE_IN_RIG}
    assert has_kv_share({"Mounts": [*mounts, shared]})
    assert not has_kv_share({"Mounts": [{**shared, "Destination": "/mnt/elsewhere"}]})


def test_a_lab_rig_is_unsealed_in_its_containers_layer_before_docker_removes_it():
    # the kv_share role leaves the directory under the shared mount immutable: docker rm could not delete it
    upper = "/var/cache/rigkit/docker/overlay2/0a1b/diff"
    info = {"GraphDriver": {"Name": "overlay2", "Data": {"UpperDir": upper}}}
    assert str(kv_share_mount_point_in_layer(info)) == f"{upper}/mnt/rigkit-kv-share"
    assert kv_share_mount_point_in_layer({"GraphDriver": {"Name": "vfs", "Data": None}}) is None


# ---- sources as nfs(5) writes them ----


@pytest.mark.parametrize(
    "source", ["[fd00::1]:/export/kv", "nas:/export/with:colon", "[fd00::1]:/export/a]b", "10.0.0.9:/"]
)
def test_an_nfs_source_is_server_colon_path_with_an_ipv6_server_in_brackets(source):
    section = rig_settings({**CPU_LAB, "kv_share_source": source}).kv_share
    assert fstab_entry_line(section) == f"{source} /mnt/kv nfs4 _netdev,nofail,noatime 0 0"


@pytest.mark.parametrize(
    "source", ["fd00::1:/export", "[fd00::1]/export", "[fd00::1]x/export", "[]:/export", "[fd00::1]", ":/export"]
)
def test_a_source_no_nfs_mount_takes_is_refused_with_the_form(source):
    with pytest.raises(ConfigError) as caught:
        rig_settings({**CPU_LAB, "kv_share_source": source})
    assert (caught.value.field, caught.value.value) == ("kv_share_source", source)
    assert caught.value.problem == "is not an NFS export (kv_share_fstype nfs4)"
    assert (
        caught.value.fix
        == "write it as SERVER:/EXPORT, e.g. nas:/export/rigkit-kv ([fd00::1]:/export for an IPv6 server)"
    )


@pytest.mark.parametrize(
    "source, identity",
    [
        ("NAS:/export//kv/", "nas:/export/kv"),
        ("[FD00::1]:/export/./kv", "[fd00::1]:/export/kv"),
        ("nas://", "nas:/"),  # POSIX keeps a leading "//"; an export of the root is "/"
        ("/srv//kv/", "/srv/kv"),  # a directory already shared (kv_share_fstype none)
        ("lab//share", "lab/share"),
    ],
)
def test_a_stores_identity_is_one_spelling_of_its_export(source, identity):
    assert store_identity(source) == identity


def test_the_fleet_checks_words():
    with pytest.raises(ConfigError) as seeds:
        check_shared_stores([("rig1", rig(janitor=True)), ("rig2", rig(seed=7))])
    assert str(seeds.value) == (
        "rig2.kv_hash_seed=7: differs from rig1's 0 while both share the store nas:/export/rigkit-kv: engines with "
        "different hash seeds never find each other's blocks. Fix: declare kv_hash_seed once for the fleet (group "
        "data), not per rig"
    )
    with pytest.raises(ConfigError) as two:
        check_shared_stores([("rig1", rig(janitor=True)), ("rig2", rig(janitor=True))])
    assert str(two.value) == (
        "kv_share_janitor='rig1, rig2': rigs rig1, rig2 share the store nas:/export/rigkit-kv; rig1, rig2 all run the "
        "L2 janitor on it: each evicts the others' entries to its own budget. Fix: set kv_share_janitor: true on "
        "exactly one rig of the store"
    )
    with pytest.raises(ConfigError) as none:
        check_shared_stores([("rig1", rig()), ("rig2", rig())])
    assert str(none.value) == (
        "kv_share_janitor=None: rigs rig1, rig2 share the store nas:/export/rigkit-kv; no rig runs the L2 janitor on "
        "it: nothing keeps it under l2_budget_gb and a full store kills every engine on it. Fix: set "
        "kv_share_janitor: true on exactly one rig of the store"
    )


def test_a_sharing_rig_without_a_source_is_left_to_its_own_refusal():
    """The fleet check reads every host; the rig's own settings refuse it (test_kv_share_without_a_declared_mount)."""
    alone = {"serving_profile": "cpu-lab", "serving_image": LAB_IMAGE, "kv_share": True, "kv_share_janitor": True}
    check_shared_stores([("rig1", alone), ("rig2", rig(janitor=True))])


def test_the_settings_refusals_words():
    with pytest.raises(ConfigError) as missing:
        stack({"serving_profile": "cpu-lab", "serving_image": LAB_IMAGE, "kv_share": True})
    assert str(missing.value) == (
        "kv_share_source=None: kv_share is on but no shared mount is declared. Fix: set kv_share_source (e.g. "
        "nas:/export/rigkit-kv) and kv_share_mount_point in group data"
    )
    with pytest.raises(ConfigError) as off:
        stack({**CPU_LAB, "kv_share": True, "l2_path": "/var/lib/rigkit/kv"})
    assert str(off.value) == (
        "l2_path='/var/lib/rigkit/kv': is not a directory inside the shared mount /mnt/kv (kv_share). Fix: leave "
        "l2_path unset (the store then is kv_share_mount_point/kv_share_store_dir)"
    )
