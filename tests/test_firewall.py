"""rigkit's firewalls (rigkit/firewall.py): the API firewall's and the store firewall's pure pieces, the facts'
shell on this machine's shell, and the lab's refusals.

The API ruleset was loaded by a real nft 1.0.6 in a private network namespace (tests/fixtures/firewall/README.md):
the capture there is what these tests hold today's rendering to. The nft tests at the end run a real nft
($RIGKIT_TEST_NFT, on PATH, or the one bin/setup unpacks: rigkit/lab/unpacked_tools.py) inside ``unshare -rn`` on
both renderings; they are skipped, saying so, without one.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from pyinfra_cases import run_case

from rigkit.errors import ConfigError, PreflightError
from rigkit.facts.firewall import NftTableComment, SshConnection
from rigkit.firewall import (
    API_FIREWALL,
    allowed_sources,
    controller_address,
    controller_source,
    exposure_notice,
    parse_source,
    refuse_same_namespace,
    ruleset,
    ruleset_comment,
    source_text,
    unit_text,
)
from rigkit.kv_store import KV_STORE_FIREWALL
from rigkit.lab.unpacked_tools import unpacked_tool
from rigkit.settings.firewalls import refuse_on_shared_network, sources_check
from rigkit.settings.hostdata import rig_settings

FIXTURES = Path(__file__).parent / "fixtures" / "firewall"
SSH_CONNECTION = "10.213.3.1 40000 10.213.3.2 22"
CPU_LAB = {
    "serving_profile": "cpu-lab",
    "serving_image": "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "3f" * 32,
    "gpus": 0,
    "serving_port": 8103,
    "num_gpu_blocks_override": 72,
}


def captured_sources():
    return allowed_sources(["10.0.0.0/24", "fd00::/64", "192.168.1.7"], controller_address(SSH_CONNECTION))


def test_the_rendering_is_the_one_real_nft_accepted():
    assert (
        ruleset(API_FIREWALL, [8103, 5555, 8080], captured_sources())
        == (FIXTURES / "ruleset-three-ports.nft").read_text()
    )


def test_only_the_stack_ports_enter_the_drop_chain_and_loopback_is_matched_by_source():
    text = ruleset(API_FIREWALL, [8103, 5555], [])
    assert "tcp dport { 5555, 8103 } jump api" in text
    # a connection to the rig's own non-loopback address also arrives on lo: the source decides, not lo alone
    assert 'iif "lo" accept' not in text and 'iif "lo" ip saddr 127.0.0.0/8 accept' in text
    assert "ip saddr" not in text.replace("ip saddr 127.0.0.0/8", "")  # no sources declared: none rendered
    assert text.splitlines()[4:7] == [
        "table inet rigkit_api",
        "delete table inet rigkit_api",
        "table inet rigkit_api {",
    ]


def test_the_hash_names_ports_and_sources():
    sources = captured_sources()
    assert ruleset_comment(API_FIREWALL, [8103], sources) != ruleset_comment(API_FIREWALL, [8104], sources)
    assert ruleset_comment(API_FIREWALL, [8103], sources) != ruleset_comment(API_FIREWALL, [8103], sources[:-1])
    assert ruleset_comment(API_FIREWALL, [8103], sources) == ruleset_comment(
        API_FIREWALL, [8103], list(reversed(sources))[::-1]
    )


def test_a_port_that_is_not_an_int_is_never_rendered():
    with pytest.raises(ValueError):
        ruleset(API_FIREWALL, ["8103; flush ruleset"], [])
    with pytest.raises(ValueError):
        ruleset(API_FIREWALL, [True], [])


@pytest.mark.parametrize(
    "text, words",
    [
        ("10.0.0.5/24", ["host bits set", "10.0.0.0/24", "10.0.0.5 for the one host"]),
        ("0.0.0.0/0", ["allows every address"]),
        ("::/0", ["allows every address"]),
        ("10.0.0.0/8; flush ruleset", ["not an IP address"]),
        ("router.lan", ["not an IP address"]),
    ],
)
def test_bad_sources_are_refused_naming_the_fix(text, words):
    with pytest.raises(ValueError) as refused:
        parse_source(text)
    for word in words:
        assert word in str(refused.value)


def test_a_bad_source_in_host_data_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError) as refused:
        rig_settings({**CPU_LAB, "api_firewall": True, "api_allowed_sources": ["10.0.0.1", "10.0.0.5/24"]})
    assert refused.value.field == "api_allowed_sources" and "10.0.0.5/24" in str(refused.value)
    with pytest.raises(ConfigError):
        rig_settings({**CPU_LAB, "api_allowed_sources": [10]})


@pytest.mark.parametrize(
    "connection, expected",
    [
        (SSH_CONNECTION, "10.213.3.1"),
        ("::ffff:192.168.1.9 5000 ::ffff:192.168.1.2 22", "192.168.1.9"),
        ("fe80::1%eth0 5000 fe80::2%eth0 22", "fe80::1"),
        ("fe80::1%eth0%x 5000 fe80::2%eth0 22", "fe80::1"),  # the zone is everything after the first %
        ("2001:db8::7 5000 2001:db8::2 22", "2001:db8::7"),
        ("", None),
        (None, None),
        ("garbage 1 2 3", None),
    ],
)
def test_the_controller_address_from_ssh_connection(connection, expected):
    address = controller_address(connection)
    assert (source_text(address) if address else None) == expected


def test_a_wanted_controller_address_that_is_unknown_is_refused():
    with pytest.raises(PreflightError) as refused:
        controller_source(True, None)
    assert refused.value.field == "api_allow_controller" and "api_allowed_sources" in refused.value.fix
    assert controller_source(False, None) is None
    assert controller_source(True, SSH_CONNECTION) == ipaddress.ip_network("10.213.3.1/32")


def test_sources_are_deduplicated_and_ordered_v4_first():
    sources = allowed_sources(["fd00::/64", "10.213.3.1", "10.0.0.0/24"], controller_address(SSH_CONNECTION))
    assert [source_text(s) for s in sources] == ["10.0.0.0/24", "10.213.3.1", "fd00::/64"]


def test_notices_say_who_reaches_the_api():
    assert "every host" in exposure_notice(False, "0.0.0.0", 8000)
    assert "only the rig itself" in exposure_notice(True, "127.0.0.1", 8000)
    assert exposure_notice(False, "127.0.0.1", 8000) is None and exposure_notice(True, "::", 8000) is None


def test_a_lab_rig_on_host_networking_never_takes_a_firewall():
    with pytest.raises(ConfigError) as refused:
        rig_settings({**CPU_LAB, "api_firewall": True, "lab_rig": True})
    assert refused.value.field == "api_firewall" and "this machine's firewall" in refused.value.problem
    rig_settings({**CPU_LAB, "api_firewall": True, "lab_rig": True, "lab_netns": True})
    rig_settings({**CPU_LAB, "lab_rig": True})  # off: nothing to refuse


def test_the_lab_inventory_marks_only_netns_rigs():
    text = (Path(__file__).parents[1] / "inventory" / "lab.py").read_text()
    assert '"lab_netns": rig.netns' in text


def test_a_rig_in_the_controllers_namespace_is_refused():
    with pytest.raises(PreflightError):
        refuse_same_namespace(API_FIREWALL, "net:[4026531840]", "net:[4026531840]")
    refuse_same_namespace(API_FIREWALL, "net:[4026532290]", "net:[4026531840]")
    refuse_same_namespace(API_FIREWALL, None, "net:[4026531840]")


def _run_fact_shell(command: str, path_dir: Path, env: dict) -> list[str]:
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, check=True)
    return result.stdout.splitlines()


def test_the_table_comment_is_read_from_real_nft_output(tmp_path):
    # a stand-in nft that prints the real capture: the fact's own sed runs on it
    fake = tmp_path / "nft"
    fake.write_text(f"#!/bin/sh\ncat {shlex.quote(str(FIXTURES / 'nft-1.0.6-list-table.txt'))}\n")
    fake.chmod(0o755)
    fact = NftTableComment()
    lines = _run_fact_shell(fact.command(API_FIREWALL.table), tmp_path, {"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert fact.process(lines) == ruleset_comment(API_FIREWALL, [8103, 5555, 8080], captured_sources())
    fake.write_text("#!/bin/sh\nexit 1\n")  # no such table
    assert _run_fact_shell(fact.command(API_FIREWALL.table), tmp_path, {"PATH": f"{tmp_path}:/usr/bin:/bin"}) == []


def test_ssh_connection_is_found_up_the_process_tree_when_sudo_reset_the_environment(tmp_path):
    fact = SshConnection()
    # env -i stands for sudo's env_reset: the child has no SSH_CONNECTION, its parent shell does
    command = f"env -i /bin/sh -c {shlex.quote(fact.command())}"
    env = {"PATH": "/usr/bin:/bin", "SSH_CONNECTION": SSH_CONNECTION}
    assert fact.process(_run_fact_shell(command, tmp_path, env)) == SSH_CONNECTION
    assert fact.process(_run_fact_shell(command, tmp_path, {"PATH": "/usr/bin:/bin"})) is None


def test_the_role_refuses_a_lab_rig_whose_namespace_is_the_controllers(monkeypatch):
    import roles.api_firewall

    monkeypatch.setattr(roles.api_firewall, "controller_namespace", lambda: "net:[4026531840]")
    case = {
        "os": "debian-12",
        "data": {**CPU_LAB, "api_firewall": True, "bind_address": "0.0.0.0", "lab_rig": True, "lab_netns": True},
        "facts": {
            "rigkit.facts.firewall.SshConnection": SSH_CONNECTION,
            "rigkit.facts.firewall.NetworkNamespace": "net:[4026531840]",
        },
    }
    result = run_case("api_firewall", case)
    assert result["commands"] == ["<python: refuse>"], result["commands"]
    assert "controller's own" in result["python_args"]["refuse"]
    monkeypatch.setattr(roles.api_firewall, "controller_namespace", lambda: os.readlink("/proc/self/ns/net") + "x")
    assert "nft -f /etc/rigkit/api-firewall.nft" in run_case("api_firewall", case)["commands"]


# --- the store firewall: the same machinery, another declaration ----------------------------------------------


def store_ruleset(sources=()) -> str:
    return ruleset(KV_STORE_FIREWALL, [6390], list(sources))


def test_the_store_firewall_has_its_own_table_chain_file_unit_and_comment():
    api, store = API_FIREWALL, KV_STORE_FIREWALL
    for field in ("setting", "table", "chain", "ruleset_path", "unit_name", "unit_path", "comment_prefix"):
        assert getattr(api, field) != getattr(store, field), field
    text = store_ruleset(allowed_sources(["10.213.3.2"], None, store))
    assert text.splitlines()[4:7] == [
        "table inet rigkit_kv_store",
        "delete table inet rigkit_kv_store",
        "table inet rigkit_kv_store {",
    ]
    assert "tcp dport { 6390 } jump kv_store" in text and "rigkit_api" not in text
    assert f'comment "{ruleset_comment(store, [6390], allowed_sources(["10.213.3.2"], None, store))}"' in text
    assert ruleset_comment(store, [6390], []) != ruleset_comment(api, [6390], [])  # one hash never names both
    unit = unit_text(store)
    assert (
        "nft table inet rigkit_kv_store" in unit
        and "Before=network-pre.target shutdown.target valkey-server.service" in unit
    )
    assert f'"-f" "{store.ruleset_path}"' in unit and "rigkit_api" not in unit


def test_the_api_rendering_is_still_the_captured_one_and_names_only_its_own_table():
    text = ruleset(API_FIREWALL, [8103, 5555, 8080], captured_sources())
    assert "kv_store" not in text and "kv_store" not in unit_text(API_FIREWALL)


def test_a_bad_store_source_names_the_store_setting():
    with pytest.raises(ValueError) as refused:
        parse_source("0.0.0.0/0", KV_STORE_FIREWALL)
    assert "turn kv_store_firewall off" in str(refused.value)


def test_a_lab_rig_on_host_networking_never_takes_the_store_firewall():
    with pytest.raises(ConfigError) as refused:
        refuse_on_shared_network(KV_STORE_FIREWALL, {"lab_rig": True}, True)
    assert refused.value.field == "kv_store_firewall" and "kv_store_firewall: false" in refused.value.fix
    refuse_on_shared_network(KV_STORE_FIREWALL, {"lab_rig": True, "lab_netns": True}, True)
    refuse_on_shared_network(KV_STORE_FIREWALL, {"lab_rig": True}, False)


def test_the_lab_store_inventory_turns_the_store_firewall_off():
    text = (Path(__file__).parent / "lab" / "inventories" / "kv_store_rig2.py").read_text()
    assert '"kv_store_firewall": False' in text


# --- a real nft, in a private network namespace (this machine's firewall is never touched) -------------------


def _nft() -> str | None:
    return os.environ.get("RIGKIT_TEST_NFT") or shutil.which("nft") or unpacked_tool("nft")


NFT_BIN = _nft()
needs_nft = pytest.mark.skipif(
    NFT_BIN is None or shutil.which("unshare") is None,
    reason="no nft in $RIGKIT_TEST_NFT, on PATH or unpacked by bin/setup (rigkit/lab/unpacked_tools.py), or no unshare",
)


def _in_private_netns(script: str) -> subprocess.CompletedProcess:
    """``script`` under sh in a new user and network namespace: nft there sees only that namespace's tables."""
    return subprocess.run(
        ["unshare", "-rn", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NFT": NFT_BIN},
    )


@needs_nft
@pytest.mark.parametrize("firewall, ports", [(API_FIREWALL, [8103, 5555, 8080]), (KV_STORE_FIREWALL, [6390])])
def test_real_nft_accepts_the_rendering(tmp_path, firewall, ports):
    path = tmp_path / "ruleset.nft"
    path.write_text(ruleset(firewall, ports, captured_sources()))
    result = _in_private_netns(f'"$NFT" -c -f {shlex.quote(str(path))}')
    assert result.returncode == 0, result.stderr


@needs_nft
def test_real_nft_refuses_a_broken_rendering(tmp_path):
    # the check above can fail: the store's ruleset with its chain's closing brace dropped is refused
    path = tmp_path / "broken.nft"
    path.write_text(store_ruleset().replace("\t\tcounter drop\n\t}\n", "\t\tcounter drop\n", 1))
    assert _in_private_netns(f'"$NFT" -c -f {shlex.quote(str(path))}').returncode != 0


@needs_nft
def test_both_tables_load_side_by_side_and_each_reload_or_removal_leaves_the_other(tmp_path):
    api, store = tmp_path / "api.nft", tmp_path / "store.nft"
    api.write_text(ruleset(API_FIREWALL, [8103], captured_sources()))
    store.write_text(store_ruleset(allowed_sources(["10.213.3.2"], None, KV_STORE_FIREWALL)))
    a, s = shlex.quote(str(api)), shlex.quote(str(store))
    result = _in_private_netns(
        f'set -e; "$NFT" -f {a}; "$NFT" -f {s}; "$NFT" -f {a}; "$NFT" list tables; echo --; '
        f'"$NFT" delete table inet {API_FIREWALL.table}; "$NFT" list tables; echo --; '
        f'"$NFT" list table inet {KV_STORE_FIREWALL.table}'
    )
    assert result.returncode == 0, result.stderr
    both, after_delete, store_table = result.stdout.split("--\n")
    assert sorted(both.split("\n")[:-1]) == ["table inet rigkit_api", "table inet rigkit_kv_store"]
    assert after_delete.strip() == "table inet rigkit_kv_store"
    assert "tcp dport 6390 jump kv_store" in store_table and "10.213.3.2" in store_table


def test_the_boot_unit_is_this_text():
    """Its order is the point: loaded before the network and the guarded service, after nftables.service's flush."""
    assert unit_text(API_FIREWALL) == (
        "[Unit]\n"
        "Description=rigkit API firewall: the serving ports from the allowed sources only (nft table inet rigkit_api)\n"
        "DefaultDependencies=no\n"
        "Wants=network-pre.target\n"
        "After=nftables.service\n"
        "Before=network-pre.target shutdown.target docker.service\n"
        "Conflicts=shutdown.target\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        'ExecStart="/usr/sbin/nft" "-f" "/etc/rigkit/api-firewall.nft"\n'
        "\n"
        "[Install]\n"
        "WantedBy=sysinit.target\n"
    )


@pytest.mark.parametrize("port, ok", [(0, False), (1, True), (65535, True), (65536, False), (-1, False)])
def test_a_port_is_rendered_from_1_to_65535(port, ok):
    if ok:
        assert f"tcp dport {{ {port} }} jump api" in ruleset(API_FIREWALL, [port], [])
    else:
        with pytest.raises(ValueError, match=f"^not a TCP port: {port}$"):
            ruleset(API_FIREWALL, [port], [])


@pytest.mark.parametrize(
    "text, told",
    [
        (
            "1.2.3.4%x",
            "'1.2.3.4%x' has a zone id ('%...'): nft matches addresses without one, and a URL cannot carry "
            "it unescaped; write the address alone",
        ),
        (
            "10.0.0.5/24",
            "'10.0.0.5/24' has host bits set: write 10.0.0.0/24 for the network, or 10.0.0.5 for the one host",
        ),
        ("router.lan", "'router.lan' is not an IP address or network (10.0.0.5, 10.0.0.0/24, fd00::/64)"),
    ],
)
def test_a_bad_source_is_told_in_these_words(text, told):
    with pytest.raises(ValueError) as refused:
        parse_source(text)
    assert str(refused.value) == told


@pytest.mark.parametrize("firewall", [API_FIREWALL, KV_STORE_FIREWALL])
def test_a_source_allowing_everything_names_its_own_firewalls_setting(firewall):
    told = f"'0.0.0.0/0' allows every address: turn {firewall.setting} off instead"
    with pytest.raises(ValueError, match=f"^{re.escape(told)}$"):
        sources_check(firewall)(["10.0.0.1", "0.0.0.0/0"])
    with pytest.raises(ValueError, match=f"^{re.escape(told)}$"):
        allowed_sources(["0.0.0.0/0"], firewall=firewall)
    check = sources_check(firewall)
    check(["10.0.0.1", "fd00::/64"])
    assert (
        check.fix
        == 'write a list of addresses or CIDR networks as the host sees them, e.g. ["10.0.0.5", "10.0.1.0/24"]'
    )
    with pytest.raises(ValueError, match=r"^10 is not text: give each source as a string such as '10\.0\.0\.5'$"):
        check([10])


def test_the_refusals_name_the_setting_the_value_and_the_fix():
    with pytest.raises(PreflightError) as unknown:
        controller_source(True, "")
    assert str(unknown.value) == (
        "api_allow_controller=True: the deploy's SSH session on the rig carries no SSH_CONNECTION address (''), so "
        "the controller's address is unknown. Fix: add the controller's address as the rig sees it to "
        "api_allowed_sources and set api_allow_controller: false"
    )
    with pytest.raises(ConfigError) as shared:
        refuse_on_shared_network(KV_STORE_FIREWALL, {"lab_rig": True}, True)
    assert str(shared.value) == (
        "kv_store_firewall=True: this lab rig runs on host networking: its network namespace is the controller's, so "
        "the rig's firewall rules would change this machine's firewall. Fix: enable kv_store_firewall only on a lab "
        "rig in its own network namespace (lab_netns: the netns rigs of `rigkit lab up`), or set kv_store_firewall: "
        "false"
    )
    with pytest.raises(PreflightError) as same:
        refuse_same_namespace(KV_STORE_FIREWALL, "net:[1]", "net:[1]")
    assert str(same.value) == (
        "kv_store_firewall=True: the rig's network namespace net:[1] is the controller's own: its firewall rules would "
        "change this machine's firewall. Fix: run this lab rig in its own network namespace, or set "
        "kv_store_firewall: false"
    )


def test_the_notices_in_full():
    assert exposure_notice(True, "127.0.0.1", 8000) == (
        "api_firewall: bind_address 127.0.0.1 is loopback: only the rig itself reaches port 8000 (the firewall "
        "matters once bind_address is not loopback, e.g. 0.0.0.0 for a router)"
    )
    assert exposure_notice(False, "0.0.0.0", 8000) == (
        "api_firewall: off, and the API listens on 0.0.0.0:8000: every host that can route to the rig reaches it; "
        "set api_firewall: true and api_allowed_sources to limit it"
    )
