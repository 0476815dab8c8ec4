"""Kinds of setting value (rigkit.settings.types): every declared variable has one, and each kind's property holds:
arbitrary text put into a field of that kind is either refused naming the field, or reaches its target intact,
read back by the target's own parser where one runs here (apt, dpkg, util-linux's findmnt, mkfs + blkid, nft,
json). Example counts are kept small: the suite's time matters more than the hundredth example."""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import shutil
import subprocess
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rigkit.errors import ConfigError
from rigkit.firewall import API_FIREWALL, allowed_sources, ruleset
from rigkit.kv_share import fstab_entry_line
from rigkit.lab.unpacked_tools import unpacked_tool
from rigkit.operations.apt import apt_source_line
from rigkit.router import ROUTER_PYTHON, Worker, unit_text
from rigkit.settings.defaults import ALL_VARIABLES, ROLE_SECTIONS, ROUTER_VARIABLES
from rigkit.settings.hostdata import rig_settings
from rigkit.settings.knobs import KNOBS
from rigkit.settings.types import DOCKER_DAEMON_KEYS, NumberRange
from rigkit.settings.variables import REDACTED, Variable, resolve

EVERY_VARIABLE = {variable.name: variable for variable in [*ALL_VARIABLES, *KNOBS]}
FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def variable(name: str) -> Variable:
    return EVERY_VARIABLE[name]


def accepted(name: str, value):
    """The value as the variable keeps it, or None when it is refused; a refusal must name the field."""
    try:
        return variable(name).coerce(value)
    except ConfigError as exc:
        assert exc.field == name and str(exc).startswith(f"{name}=")
        assert exc.fix and variable(name).doc not in exc.fix  # what to write, not the description again
        return None


# Text a user or an attacker may type: anything, plus the characters each target gives a meaning to.
ANY_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40) | st.text(
    alphabet=" \t\n\r\x00#\\$%:/@?[]=;`'\"abcAZ09.-_~+", max_size=30
)


# --- every variable is typed ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(name for name, v in EVERY_VARIABLE.items() if v.type is not bool))
def test_every_variable_declares_a_kind_that_says_what_to_write(name):
    check = variable(name).check
    assert check is not None and getattr(check, "fix", ""), f"{name}: declare its kind (rigkit.settings.types)"


@pytest.mark.parametrize("name", sorted(name for name, v in EVERY_VARIABLE.items() if v.type in (int, float)))
def test_every_number_has_a_floor_and_a_ceiling(name):
    check = variable(name).check
    if name == "gpu_memory_utilization":  # (0, 1]: vLLM's own open interval, checked by _fraction_of_gpu
        return
    assert isinstance(check, NumberRange) and check.ceiling < 2**64, f"{name}: give it between(floor, ceiling)"


def test_a_refusal_says_what_to_write_not_the_description():
    with pytest.raises(ConfigError) as caught:
        variable("ready_timeout_s").coerce(100 * 365 * 86400)  # a century
    assert caught.value.fix == "write a number from 1 to 86400 seconds"
    with pytest.raises(ConfigError) as caught:
        variable("kv_store_maxmemory_gib").coerce(2**34)  # 2^64 bytes: valkey reads it as no limit
    assert "65536 GiB" in caught.value.fix


# --- secrets by declaration ----------------------------------------------------------------------------------

SECRETS = sorted(name for name, v in EVERY_VARIABLE.items() if v.secret)


def test_the_known_secrets_are_declared_on_their_variables():
    assert {"hf_token", "kv_store_password", "router_api_key"} <= set(SECRETS)


@pytest.mark.parametrize("name", SECRETS)
def test_a_refused_secret_is_never_shown(name):
    marker = "hunter2-do-not-print"
    with pytest.raises(ConfigError) as caught:
        variable(name).coerce(f"{marker}\n${{x}} '\"")
    assert marker not in str(caught.value) and caught.value.value == REDACTED


# --- URLs of package repositories, read back by apt ----------------------------------------------------------


def apt_reads(line: str, tmp_path) -> list[str]:
    """The index URIs apt would fetch for a sources file holding ``line`` (apt-get --print-uris, nothing fetched)."""
    (tmp_path / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (tmp_path / "s.list").write_text(line)
    result = subprocess.run(
        [
            "apt-get",
            "-o",
            f"Dir::Etc::SourceList={tmp_path / 's.list'}",
            "-o",
            "Dir::Etc::SourceParts=/nonexistent",
            "-o",
            f"Dir::State::Lists={tmp_path / 'lists'}",
            "--print-uris",
            "update",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return [line.split("'")[1] for line in result.stdout.splitlines() if line.startswith("'")]


needs_apt = pytest.mark.skipif(shutil.which("apt-get") is None, reason="no apt-get here")


@needs_apt
@FEW
@given(
    text=ANY_TEXT
    | st.sampled_from(
        [
            "https://download.docker.com/linux",
            "http://10.0.0.5/debian",
            "https://h/x\ndeb [trusted=yes] http://evil/ x y",
            "file:///srv/apt",
            "https://user:pw@h/x",
            "https://h/x y",
            "https://[::1]:8443/apt",
        ]
    )
)
def test_a_package_repository_url_is_refused_or_read_back_by_apt_as_one_source(tmp_path_factory, text):
    url = accepted("docker_apt_url", text)
    if url is None:
        return
    assert url.startswith(("https://", "http://"))
    uris = apt_reads(
        apt_source_line(f"{url}/debian", "bookworm", "stable", "/etc/apt/keyrings/d.gpg", "amd64"),
        tmp_path_factory.mktemp("apt"),
    )
    assert uris and all(uri.startswith(f"{url}/debian/dists/bookworm/") for uri in uris), uris


def test_package_repositories_are_https_unless_opted_in_or_on_loopback():
    with pytest.raises(ConfigError) as caught:
        rig_settings({"docker_apt_url": "http://mirror.lan/docker"}, needs_stack=False)
    assert caught.value.field == "docker_apt_url" and "package_repos_allow_http" in caught.value.fix
    rig_settings({"docker_apt_url": "http://mirror.lan/docker", "package_repos_allow_http": True}, needs_stack=False)
    rig_settings({"router_pip_find_links": "http://127.0.0.1:8555/"}, needs_stack=False)  # the lab's wheelhouse


# --- Debian versions, read back by dpkg ----------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="no dpkg here")
@FEW
@given(
    text=ANY_TEXT
    | st.sampled_from(
        ["5:27.5.1-1~debian.12~bookworm", "1.17.8-1", "580.95.05-1ubuntu1", "1.0;reboot", "`id`", "2:1.0-1:2"]
    )
)
def test_a_version_is_refused_or_valid_to_dpkg(text):
    version = accepted("docker_version", text)
    if version is not None:
        check = subprocess.run(["dpkg", "--validate-version", version], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


# --- an fstab field, read back by util-linux ------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("findmnt") is None, reason="no findmnt here")
@FEW
@given(
    text=ANY_TEXT
    | st.sampled_from(
        ["nas:/export/kv", "#nas:/export", "nas:/ex port", "nas:/a\x00b", "nas:/a\\040b", "[fd00::5]:/export"]
    )
)
def test_a_share_source_is_refused_or_read_back_by_findmnt_as_one_field(tmp_path_factory, text):
    source = accepted("kv_share_source", text)
    if source is None:
        return
    section = {
        "kv_share_source": source,
        "kv_share_mount_point": "/mnt/rigkit-kv-share",
        "kv_share_fstype": "nfs4",
        "kv_share_mount_options": "_netdev,nofail",
    }
    fstab = tmp_path_factory.mktemp("fstab") / "fstab"
    fstab.write_text(fstab_entry_line(section) + "\n")
    result = subprocess.run(
        ["findmnt", "--fstab", "--tab-file", str(fstab), "-J", "-o", "SOURCE,TARGET"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    (entry,) = json.loads(result.stdout)["filesystems"]
    assert entry == {"source": source, "target": "/mnt/rigkit-kv-share"}


# --- a filesystem label, read back by blkid after a real mkfs -------------------------------------------------


@pytest.mark.skipif(shutil.which("mkfs.ext4") is None or shutil.which("blkid") is None, reason="no mkfs.ext4/blkid")
@settings(max_examples=8, deadline=None)
@given(text=ANY_TEXT | st.sampled_from(["rigkit-l2", "a-label-of-17-chr", "x" * 16, "lab el"]))
def test_an_ext4_label_is_refused_or_kept_whole_by_mkfs(tmp_path_factory, text):
    try:
        label = rig_settings({"l2_label": text, "l2_fstype": "ext4"}, needs_stack=False).l2_disk["l2_label"]
    except ConfigError as exc:
        assert exc.field == "l2_label"
        return
    image = tmp_path_factory.mktemp("fs") / "fs.img"
    image.write_bytes(b"\0" * (4 << 20))
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", label, str(image)], check=True, capture_output=True)
    read = subprocess.run(["blkid", "-p", "-o", "value", "-s", "LABEL", str(image)], capture_output=True, text=True)
    assert read.stdout.strip() == label


def test_a_label_too_long_for_its_filesystem_is_refused_before_any_host():
    with pytest.raises(ConfigError) as caught:
        rig_settings(
            {"l2_label": "rigkit-l2-xfs1", "l2_fstype": "xfs", "l2_device": "/dev/disk/by-id/nvme-x"}, needs_stack=False
        )
    assert caught.value.field == "l2_label" and "12" in caught.value.problem


# --- addresses and networks, read back by nft ---------------------------------------------------------------

NFT = os.environ.get("RIGKIT_TEST_NFT") or shutil.which("nft") or unpacked_tool("nft")
needs_nft = pytest.mark.skipif(NFT is None or shutil.which("unshare") is None, reason="no nft or unshare")
ADDRESSES = (
    ANY_TEXT
    | st.ip_addresses().map(str)
    | st.ip_addresses(v=4).map(lambda a: f"::ffff:{a}")
    | st.ip_addresses(v=6).map(lambda a: f"{a}%eth0")
    | st.sampled_from(["10.0.0.0/24", "fe80::1%2"])
)


@needs_nft
@settings(max_examples=10, deadline=None)
@given(texts=st.lists(ADDRESSES, min_size=1, max_size=8))
def test_allowed_sources_are_refused_or_matched_by_nft_as_written(tmp_path_factory, texts):
    sources = accepted("api_allowed_sources", texts)
    if sources is None:
        return
    networks = allowed_sources(sources)
    path = tmp_path_factory.mktemp("nft") / "ruleset.nft"
    path.write_text(ruleset(API_FIREWALL, [8000], networks))
    result = subprocess.run(
        [
            "unshare",
            "-rn",
            "sh",
            "-c",
            f'"$NFT" -f {shlex.quote(str(path))} && "$NFT" -j list table inet {API_FIREWALL.table}',
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NFT": NFT},
    )
    assert result.returncode == 0, result.stderr
    loaded = set()
    for item in json.loads(result.stdout)["nftables"]:
        for element in item.get("set", {}).get("elem", []):
            value = element.get("prefix", element)
            loaded.add(ipaddress.ip_network(f"{value['addr']}/{value['len']}" if isinstance(value, dict) else value))
    for network in networks:
        assert network in loaded or not loaded and str(network.network_address) in result.stdout


@FEW
@given(text=ADDRESSES)
def test_a_listen_address_is_refused_or_a_plain_address(text):
    address = accepted("bind_address", text)
    if address is not None:
        parsed = ipaddress.ip_address(address)
        assert "%" not in address and not (parsed.version == 6 and parsed.ipv4_mapped)


@pytest.mark.parametrize("name", ["router_worker_address"])
@FEW
@given(text=ANY_TEXT | st.sampled_from(["rig-a.lan", "10.0.0.5", "fd00::5", "rig-a.lan:80/x", "rig a", "-oProxy"]))
def test_an_address_put_in_a_url_is_refused_or_one_host(name, text):
    host = accepted(name, text)
    if host is not None:
        bracketed = f"[{host}]" if ":" in host else host
        assert urlsplit(f"http://{bracketed}:8000/v1/models").hostname == host.lower().strip("[]")


# --- JSON objects with a schema -------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


@FEW
@given(
    options=st.dictionaries(
        st.sampled_from(
            ["log-level", "log-opts", "live-restore", "runtimes", "default-runtime", "mtu", "bogus", "data-root"]
        ),
        JSON_VALUES,
        max_size=4,
    )
)
def test_daemon_options_are_refused_or_round_trip_through_json_with_their_declared_types(options):
    kept = accepted("docker_daemon_options", options)
    if kept is None:
        return
    assert json.loads(json.dumps(kept)) == kept
    assert not {"runtimes", "default-runtime"} & set(kept)
    for key, value in kept.items():  # JSON true is no integer to dockerd
        assert isinstance(value, DOCKER_DAEMON_KEYS[key]) and (
            DOCKER_DAEMON_KEYS[key] is bool or not isinstance(value, bool)
        )


def test_daemon_options_that_undo_the_nvidia_runtime_are_refused_naming_its_setting():
    with pytest.raises(ConfigError) as caught:
        variable("docker_daemon_options").coerce({"default-runtime": "runc"})
    assert "nvidia_ctk_default_runtime" in caught.value.problem
    with pytest.raises(ConfigError) as caught:
        variable("docker_daemon_options").coerce({"log-opts": "max-size=10m"})
    assert "'log-opts' must be an object" in caught.value.problem
    with pytest.raises(ConfigError) as caught:
        variable("docker_daemon_options").coerce({"mtu": True})
    assert "'mtu' must be an integer" in caught.value.problem


@pytest.mark.parametrize(
    "adapter",
    [
        {"type": "redis", "url": "redis://10.0.0.5:6379", "password": "hunter2-do-not-print"},
        {"type": "valkey", "auth": {"user": "x", "pass": "hunter2-do-not-print"}},
        {"type": "s3", "url": "s3://bucket", "aws_secret_access_key": "hunter2-do-not-print"},
    ],
)
def test_a_credential_inside_the_adapter_json_is_refused_never_shown(adapter):
    with pytest.raises(ConfigError) as caught:
        variable("l2_adapter_json").coerce(adapter)
    assert "hunter2" not in str(caught.value) and "credential" in caught.value.problem
    assert "kv_store_password" in caught.value.fix


def test_every_role_section_is_declared_once():
    names = [variable.name for section in ROLE_SECTIONS.values() for variable in section]
    assert len(names) == len(set(names))


def test_an_allow_list_that_cuts_every_client_off_is_refused():
    with pytest.raises(ConfigError) as caught:
        rig_settings(
            {"api_firewall": True, "api_allowed_sources": [], "api_allow_controller": False}, needs_stack=False
        )
    assert caught.value.field == "api_allowed_sources" and "api_allow_controller: true" in caught.value.fix
    rig_settings(
        {"api_firewall": True, "api_allowed_sources": ["10.0.0.5"], "api_allow_controller": False}, needs_stack=False
    )


# --- a unit file, read back by systemd ------------------------------------------------------------------------

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")
@settings(max_examples=8, deadline=None)
@given(bind=ADDRESSES, policy=ANY_TEXT | st.sampled_from(["cache_aware", "round_robin"]))
def test_router_settings_are_refused_or_reach_its_unit_as_one_argument_each(tmp_path_factory, bind, policy):
    try:
        router = resolve(ROUTER_VARIABLES, {"router_bind_address": bind, "router_policy": policy})
    except ConfigError as exc:
        assert exc.field in ("router_bind_address", "router_policy")
        return
    text = unit_text(router, [Worker("rig1", "http://127.0.0.1:8101", "tiny")], with_api_key=False)
    # the launcher is not installed here: systemd checks the executable, so /bin/true stands in for it
    text = text.replace(f'ExecStart="{ROUTER_PYTHON}"', 'ExecStart="/bin/true"').replace(
        f"ExecStart={ROUTER_PYTHON}", "ExecStart=/bin/true"
    )
    unit = tmp_path_factory.mktemp("unit") / "rigkit-router-test.service"
    unit.write_text(text)
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "rigkit-router-test" not in result.stderr, result.stderr
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert (
        f"--host {router['router_bind_address']} " in exec_start or f'"{router["router_bind_address"]}"' in exec_start
    )
