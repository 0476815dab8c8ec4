"""Kinds of setting value (rigkit.settings.types): every declared variable has one, and each kind's property holds:
arbitrary text put into a field of that kind is either refused naming the field, or reaches its target intact,
read back by the target's own parser where one runs here (apt, dpkg, util-linux's findmnt, mkfs + blkid, nft,
json). Example counts are kept small: the suite's time matters more than the hundredth example."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rigkit.settings.types as kinds
from rigkit.errors import ConfigError
from rigkit.firewall import API_FIREWALL, allowed_sources, ruleset
from rigkit.kv_share import fstab_entry_line
from rigkit.lab.unpacked_tools import unpacked_tool
from rigkit.operations.apt import apt_source_line
from rigkit.router import ROUTER_PYTHON, Worker, argv_file_text, front_listen, unit_text
from rigkit.settings.defaults import ALL_VARIABLES, ROLE_SECTIONS, ROUTER_VARIABLES
from rigkit.settings.hostdata import rig_settings
from rigkit.settings.knobs import KNOBS
from rigkit.settings.types import DOCKER_DAEMON_KEYS, NumberRange
from rigkit.settings.variables import REDACTED, CredentialInValue, Variable, resolve

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
    text = unit_text(router)
    # the policy reaches the router's argv (a JSON list, one item each)
    assert json.loads(argv_file_text(router, [Worker("rig1", "http://127.0.0.1:8101", "tiny")], False)).count(
        router["router_policy"]
    )
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
    listen = front_listen(router)
    assert f"--listen {listen} " in exec_start or f'"{listen}"' in exec_start.replace("%%", "%").replace("$$", "$")


# --- each kind's verdict, word for word -----------------------------------------------------------------------
# A refusal is what the user reads (field=value: PROBLEM. Fix: ...), so each kind's problem text is held whole
# for a representative value, and each boundary (the first value refused, the last one kept) is a case.

CONTROL = "contains the control or format character "
QUERY = "has a query or fragment, which a repository base URL never has"
CREDENTIALS = "carries credentials (user:password@): they would be readable in the rig's apt sources and ps"
NOT_A_HOST = " is not a DNS name or an IP address"
ZONE_ID = (
    "has a zone id ('%...'): nft matches addresses without one, and a URL cannot carry it unescaped; "
    "write the address alone"
)
MAPPED = (
    "is an IPv4-mapped IPv6 address: packets from that host arrive as IPv4, so an nft rule on it never matches; "
    "write 10.0.0.5"
)
SECRET_REFUSED = "holds a blank, a newline or another control character"
DIRECTORY_REFUSED = "contains whitespace or '$'"
LABEL_CHARACTERS = (
    "holds a character other than letters, digits, '.', '_' or '-' (udev mangles it in /dev/disk/by-label)"
)


def case_id(value):
    """A case's id in plain characters: mutmut names each test on pytest's command line, where '::', a backslash
    or a non-ASCII character would not name it."""
    if isinstance(value, kinds.Kind):
        return type(value).__name__
    if isinstance(value, str):
        return re.sub(r"[^A-Za-z0-9.-]+", "_", value)[:40] or "empty"
    return None


KIND_VERDICTS = [
    # every control or format category, not only Cc: a zero-width space (Cf), U+2028/U+2029 (a line or paragraph
    # break to some readers) and a lone surrogate (Cs, no UTF-8 file can hold it) are refused too
    (
        kinds.ControllerPath(),
        [
            ("results/20260101-120000", None),
            ("results/a\x00b", CONTROL + "'\\x00'"),
            ("results/a\u200bb", CONTROL + "'\\u200b'"),
            ("results/a\u2028b", CONTROL + "'\\u2028'"),
            ("results/a\u2029b", CONTROL + "'\\u2029'"),
            ("results/a\ud800b", CONTROL + "'\\ud800'"),
        ],
    ),
    # URLs: accepted as written (upper case in host and path, port 1, an address or a bracketed IPv6 host)
    (
        kinds.Url(),
        [
            ("https://download.docker.com/linux", None),
            ("https://Download.Docker.com/Linux/debian_12", None),
            ("https://mirror.lan:1/x", None),
            ("https://10.0.0.5/debian", None),
            ("https://[fd00::5]:8443/apt", None),
            ("https://mirror.lan/a\u200bb", CONTROL + "'\\u200b'"),
            ("https://mirror.lan/x y", "contains whitespace: a URL is one token on an apt sources line"),
            ("https://[::1/x", "is not a URL (Invalid IPv6 URL)"),
            ("HTTPS://mirror.lan/x", "scheme 'HTTPS' is not one of https (lowercase, then ://)"),
            ("https:mirror.lan/x", "scheme 'https' is not one of https (lowercase, then ://)"),
            ("ftp://mirror.lan:21/x", "scheme 'ftp' is not one of https (lowercase, then ://)"),
            ("https:///x", "names no host"),
            ("https://-rig/x", "host '-rig'" + NOT_A_HOST),  # a label starts with a letter or digit
            ("https://010.0.0.5/x", "host '010.0.0.5'" + NOT_A_HOST),  # all digits: an address, and not one
            ("https://user@mirror.lan/x", CREDENTIALS),  # a user alone is a credential too
            ("https://user:pw@mirror.lan/x", CREDENTIALS),
            ("https://mirror.lan/x?a=1", QUERY),
            ("https://mirror.lan/x#top", QUERY),
            ("https://mirror.lan/x?", QUERY),  # an empty query or fragment: urlsplit sees none, apt would
            ("https://mirror.lan/x#", QUERY),
            ("https://mirror.lan:0/x", "names port 0"),
            ("https://mirror.lan/a;b", "path '/a;b' holds a character apt would not take as written"),
        ],
    ),
    # a package repository may also be plain http (package_repos_allow_http decides that later)
    (
        kinds.Url(schemes=kinds.PACKAGE_REPOSITORY_SCHEMES),
        [
            ("ftp://mirror.lan/x", "scheme 'ftp' is not one of https, http (lowercase, then ://)"),
        ],
    ),
    # Debian versions and releases
    (
        kinds.DebianVersion(),
        [
            ("5:27.5.1-1~debian.12~bookworm", None),
            (
                "v27.5.1",
                "is not a Debian version ([epoch:]upstream[-revision]: starts with a digit; letters, digits and . + ~ -)",
            ),
        ],
    ),
    (
        kinds.Release(),
        [
            ("0.1.17", None),
            ("1", "is not a release number (digits and dots, e.g. 0.1.17)"),
        ],
    ),
    # fstab sources
    (
        kinds.FstabSource(),
        [
            ("nas:/export/rigkit-kv", None),
            ("[fd00::5]:/export", None),
            ("nas:/a\u200bb", CONTROL + "'\\u200b'"),
            ("nas:/ex port", "contains whitespace: fstab splits its fields on blanks"),
            ("#nas:/export", "starts with '#': fstab would read the whole line as a comment"),
            ("nas:/a\\040b", "contains a backslash, which getmntent reads as the start of an octal escape"),
            ("nas:/$HOME", "contains '$', which systemd's mount units and shells expand"),
            ("nas:/exp\u00f6rt", "contains a non-ASCII character, which NFS servers name no export with"),
        ],
    ),
    # a label alone is held to the longest limit (ext4's 16 bytes); its filesystem's own limit comes later
    (
        kinds.FsLabel(),
        [
            ("RigKit-L2", None),
            ("x" * 16, None),
            ("x" * 17, "is 17 bytes: ext4 keeps at most 16, so mkfs would cut it"),
            ("lab el", LABEL_CHARACTERS),
        ],
    ),
    # addresses: IPv6 in another spelling is kept (nft and listeners read every spelling)
    (
        kinds.IpAddress(),
        [
            ("10.0.0.5", None),
            ("FD00:0::5", None),
            ("fe80::1%eth0", ZONE_ID),
            ("rig-a.lan", "is not an IP address"),
            ("::ffff:10.0.0.5", MAPPED),
        ],
    ),
    (
        kinds.HostAddress(),
        [
            ("rig-a.lan", None),
            ("10.0.0.5", None),
            ("fd00::5", None),
            ("010.0.0.5", "is not an IP address"),  # all digits is an address or nothing
            ("rig-a.lan:80/x", "is not an IP address"),
        ],
    ),
    # pip's --find-links: an absolute directory or a URL
    (
        kinds.UrlOrDirectory(),
        [
            ("/srv/wheels", None),
            ("https://mirror.lan/wheels", None),
            ("/srv/a\u200bb", CONTROL + "'\\u200b'"),
            ("/srv/my wheels", DIRECTORY_REFUSED),
            ("/srv/$HOME", DIRECTORY_REFUSED),
            ("srv/wheels", "scheme 'srv/wheels' is not one of https (lowercase, then ://)"),
        ],
    ),
    # secrets: a blank alone, or a control character alone, is refused
    (
        kinds.SecretText(),
        [
            ("hf_abc123", None),
            ("hf abc123", SECRET_REFUSED),
            ("hf\u200babc123", SECRET_REFUSED),
        ],
    ),
]
CASES = [(kind, value, problem) for kind, verdicts in KIND_VERDICTS for value, problem in verdicts]


@pytest.mark.parametrize("kind, value, problem", CASES, ids=case_id)
def test_a_kind_keeps_a_value_or_says_exactly_what_is_wrong(kind, value, problem):
    assert kind.problem(value) == problem
    if problem is None:
        kind(value)
    else:
        with pytest.raises(ValueError, match=re.escape(problem)):
            kind(value)


@pytest.mark.parametrize(
    "name, value, refusal",
    [
        (
            "docker_apt_url",
            "https://h/x?a=1",
            "docker_apt_url='https://h/x?a=1': has a query or fragment, which a repository base URL never has. "
            "Fix: write an https:// URL such as https://download.docker.com/linux",
        ),
        (
            "kv_share_source",
            "nas:/$HOME",
            "kv_share_source='nas:/$HOME': contains '$', which systemd's mount units and shells expand. "
            "Fix: write the export as SERVER:/EXPORT with no blanks, e.g. nas:/export/rigkit-kv",
        ),
        (
            "ready_timeout_s",
            0,
            "ready_timeout_s=0: must be between 1 and 86400 seconds. Fix: write a number from 1 to 86400 seconds",
        ),
    ],
    ids=case_id,
)
def test_a_refusal_reads_field_value_problem_and_fix(name, value, refusal):
    with pytest.raises(ConfigError) as caught:
        variable(name).coerce(value)
    assert str(caught.value) == refusal


# (floor, ceiling, unit, off) as between() takes them. Each range is made inside the test: it builds its fix when
# made, and the mutation check only credits a test with the calls made while it runs.
RANGES = {
    "seconds": (1, 86400, "seconds"),
    "port": (1024, 65535),  # no unit: a bare number
    "off-or-seconds": (60, 3600, "seconds", 0),
}


@pytest.mark.parametrize(
    "declared, value, problem",
    [
        ("seconds", 1, None),  # the floor and the ceiling are both kept
        ("seconds", 86400, None),
        ("seconds", 0, "must be between 1 and 86400 seconds"),
        ("seconds", 86401, "must be between 1 and 86400 seconds"),
        ("port", 80, "must be between 1024 and 65535"),
        ("off-or-seconds", 0, None),
        ("off-or-seconds", 30, "must be between 60 and 3600 seconds (or 0: off)"),
        ("off-or-seconds", 3601, "must be between 60 and 3600 seconds (or 0: off)"),
    ],
    ids=case_id,
)
def test_a_number_range_keeps_its_bounds_and_names_them_with_unit_and_off(declared, value, problem):
    assert kinds.between(*RANGES[declared]).problem(value) == problem


@pytest.mark.parametrize(
    "declared, fields, fix",
    [
        (
            "seconds",
            {"floor": 1, "ceiling": 86400, "unit": "seconds", "off": None},
            "write a number from 1 to 86400 seconds",
        ),
        ("port", {"floor": 1024, "ceiling": 65535, "unit": "", "off": None}, "write a number from 1024 to 65535"),
        (
            "off-or-seconds",
            {"floor": 60, "ceiling": 3600, "unit": "seconds", "off": 0},
            "write a number from 60 to 3600 seconds, or 0 for off",
        ),
    ],
    ids=case_id,
)
def test_between_declares_the_range_as_given_and_its_fix(declared, fields, fix):
    made = kinds.between(*RANGES[declared])
    assert {name: getattr(made, name) for name in fields} == fields and made.fix == fix
    assert made == NumberRange(**fields)


def test_a_number_range_keeps_a_fix_written_for_it():
    assert NumberRange(floor=1, ceiling=2, fix="write 1 or 2").fix == "write 1 or 2"


@pytest.mark.parametrize(
    "label, fstype, problem",
    [
        ("x" * 12, "xfs", None),  # mkfs.xfs -L takes 12 bytes, mkfs.ext4 -L 16: the last kept, the first cut
        ("x" * 13, "xfs", "is 13 bytes: xfs keeps at most 12, so mkfs would cut it"),
        ("x" * 16, "ext4", None),
        ("x" * 17, "ext4", "is 17 bytes: ext4 keeps at most 16, so mkfs would cut it"),
        ("RigKit-L2", "xfs", None),
        ("rigkit/l2", "ext4", LABEL_CHARACTERS),
    ],
    ids=case_id,
)
def test_a_label_is_held_to_its_filesystems_limit(label, fstype, problem):
    assert kinds.label_problem(label, fstype) == problem


@pytest.mark.parametrize(
    "text, problem",
    [
        ("10.0.0.0/24", None),
        ("fd00::5", None),
        ("rig-a.lan", None),  # not an address at all: parse_source says so, with the forms to write
        ("::ffff:10.0.0.5/128", MAPPED),  # the address is the part before the first '/'
        ("::ffff:10.0.0.5/96/1", MAPPED),
        ("fe80::1%eth0/64", ZONE_ID),
    ],
    ids=case_id,
)
def test_a_network_is_judged_by_its_address_part(text, problem):
    assert kinds.network_problem(text) == problem


PLAIN_HTTP = (
    "is plain http to another host: apt and pip check what they get, not that it is current, so anyone "
    "on the path can hold the rig on old packages"
)


@pytest.mark.parametrize(
    "url, problem",
    [
        ("https://mirror.lan/x", None),
        ("http://127.0.0.1:8555/", None),  # the lab's wheelhouse, on loopback
        ("http://[::1]/x", None),
        ("http://localhost:8555/", None),
        ("http://LOCALHOST/x", None),  # a host name is read in lower case
        ("http://mirror.lan/x", PLAIN_HTTP),
        ("http://10.0.0.5/x", PLAIN_HTTP),
    ],
    ids=case_id,
)
def test_plain_http_is_kept_only_on_loopback(url, problem):
    assert kinds.plain_http_problem(url) == problem


@pytest.mark.parametrize(
    "value, paths",
    [
        ({"password": "x"}, ["password"]),
        ({"password": ""}, []),  # an empty, null or false credential holds nothing to hide
        ({"password": None}, []),
        ({"token": False}, []),
        ({"auth": True}, ["auth"]),
        ({"auth": {"user": "x", "pass": "y"}}, ["auth", "auth.pass"]),
        ([{"token": "a"}, {"name": "b"}], ["[0].token"]),
        ({"servers": [{"name": "a"}, {"api_key": "k"}]}, ["servers[1].api_key"]),
        ({"log-level": "debug"}, []),
    ],
    ids=case_id,
)
def test_credential_keys_name_the_path_of_each_credential(value, paths):
    assert kinds.credential_keys(value) == paths


def test_a_schema_refuses_a_credential_before_anything_else_naming_where_it_would_be_read():
    with pytest.raises(CredentialInValue) as caught:
        kinds.JsonSchema(keys={"url": str})({"url": "redis://h", "password": "hunter2"})
    assert str(caught.value) == "holds a credential at password: it would be readable in a world-readable file"


@pytest.mark.parametrize(
    "schema, value, problem",
    [
        (kinds.DOCKER_DAEMON_OPTIONS, {"log-level": "debug", "mtu": 1500, "live-restore": True}, None),
        (
            kinds.DOCKER_DAEMON_OPTIONS,
            {"log-levle": "debug"},
            "has the unknown key 'log-levle' (did you mean 'log-level'?)",
        ),
        (kinds.DOCKER_DAEMON_OPTIONS, {"zzzzzz": 1}, "has the unknown key 'zzzzzz'"),
        (
            kinds.DOCKER_DAEMON_OPTIONS,
            {"hosts": []},
            "sets 'hosts', which the engine's systemd unit (-H fd://: dockerd refuses to start with both) manages: "
            "set that instead",
        ),
        (kinds.DOCKER_DAEMON_OPTIONS, {"mtu": "1500"}, "'mtu' must be an integer, got str '1500'"),
        (kinds.DOCKER_DAEMON_OPTIONS, {"mtu": True}, "'mtu' must be an integer, got bool True"),
        (kinds.DOCKER_DAEMON_OPTIONS, {"log-level": 5}, "'log-level' must be a string, got int 5"),
        (kinds.DOCKER_DAEMON_OPTIONS, {"ipv6": 1}, "'ipv6' must be a boolean, got int 1"),
        (kinds.DOCKER_DAEMON_OPTIONS, {"dns": "1.1.1.1"}, "'dns' must be a list, got str '1.1.1.1'"),
        (kinds.DOCKER_DAEMON_OPTIONS, {"log-opts": []}, "'log-opts' must be an object, got list []"),
        (kinds.JsonSchema(keys={"ratio": float}), {"ratio": "x"}, "'ratio' must be a number, got str 'x'"),
        (
            kinds.JsonSchema(keys={"size": (int, float)}),
            {"size": "1g"},
            "'size' must be an integer or a number, got str '1g'",
        ),
        # a type with no JSON name is named as Python names it
        (kinds.JsonSchema(keys={"at": (str, type(None))}), {"at": 5}, "'at' must be a string or NoneType, got int 5"),
    ],
    ids=case_id,
)
def test_a_schema_names_the_key_and_the_json_type_it_expected(schema, value, problem):
    assert schema.problem(value) == problem
