"""The fleet's Valkey store (rigkit/kv_store.py) and LMCache's Valkey L2 adapter on the rigs (rendering only).

The server tests run the real valkey-server (or redis-server, which reads the same directives) on this machine's
loopback with the configuration rigkit renders, and ask it with the role's own check command; they are skipped,
saying so, when neither binary is in $RIGKIT_TEST_VALKEY_BIN (a directory), on PATH, or unpacked by bin/setup
(rigkit/lab/unpacked_tools.py).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from engine_argv import free_port, run_entrypoint

from rigkit import kv_store
from rigkit.errors import ConfigError
from rigkit.facts.kv_store import StoreAnswers
from rigkit.lab.unpacked_tools import unpacked_tool
from rigkit.serving.commands import stack_files
from rigkit.serving.render import compose_document, render_env
from rigkit.settings.hostdata import Settings, adapter_json, rig_settings, settings_for_host
from rigkit.settings.sizing import GIB
from rigkit.status.probe import status_script
from rigkit.status.rig import kv_store_health

PLANTED = "planted-kv-store-secret-7f3a"
STORE = {"kv_store_password": PLANTED, "kv_store_bind_addresses": ["127.0.0.1"], "kv_store_maxmemory_gib": 1}
LMCACHE_RIG = {
    "serving_profile": "lmcache-mp",
    "allow_incubating": True,
    "model": "m",
    "serving_image": "lmcache/vllm-openai@sha256:" + "a" * 64,
    "l2_enabled": True,
    "l2_kv_store_address": "10.213.3.1",
    "kv_store_password": PLANTED,
    "kv_store_port": 6390,
}

# what a dead store may cost each LMCache request, stated by rigkit in the adapter JSON (LMCache's own field names:
# valkey_l2_adapter.py ValkeyL2AdapterConfig.from_dict, LMCache d4eb1aa2)
STATED_TIMEOUTS = {"request_timeout": 5.0, "connection_timeout": 10.0}


def store_section(**data) -> dict:
    return dict(rig_settings({**STORE, **data}, needs_stack=False).kv_store)


def test_config_binds_the_declared_addresses_with_password_and_limit() -> None:
    text = kv_store.config_text(
        store_section(kv_store_bind_addresses=["127.0.0.1", "10.0.0.5"], kv_store_maxmemory_gib=3), PLANTED
    )
    lines = text.splitlines()
    assert "bind 127.0.0.1 10.0.0.5" in lines and "protected-mode yes" in lines
    assert f'requirepass "{PLANTED}"' in lines
    assert f"maxmemory {3 * GIB}" in lines and "maxmemory-policy allkeys-lru" in lines


@pytest.mark.parametrize(
    "password, problem",
    [
        ("short-secret", "fewer than"),
        ('has"quote-inside-xx', "quote"),
        ("has\\backslash-inside", "backslash"),
        ("has a space-inside-xx", "whitespace"),
        ("has\nnewline-inside-xx", "control"),
        ("tab\there-inside-xxxx", "control"),
    ],
)
def test_passwords_valkey_conf_or_env_would_need_escaped_are_refused(password: str, problem: str) -> None:
    assert problem in kv_store.password_problem(password)
    with pytest.raises(ValueError):
        kv_store.config_text(store_section(), password)


def test_the_checks_read_the_password_back_exactly_from_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "rigkit.conf"
    conf.write_text(kv_store.config_text(store_section(), PLANTED))
    script = kv_store.AUTH_FROM_CONFIG.replace(kv_store.RIGKIT_CONF, str(conf))
    assert subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout == PLANTED + "\n"


def test_the_lmcache_rig_points_its_l2_at_the_store_without_the_password_in_compose_or_the_adapter_json() -> None:
    settings = settings_for_host(LMCACHE_RIG)
    adapter = json.loads(settings.knobs["l2_adapter_json"])
    assert adapter == {"type": "valkey", "startup_nodes": "10.213.3.1:6390", **STATED_TIMEOUTS}
    compose = json.dumps(compose_document(settings))
    assert PLANTED not in compose and "RIGKIT_KV_STORE_PASSWORD=${RIGKIT_KV_STORE_PASSWORD:-}" in compose
    env = render_env(settings)
    assert f"RIGKIT_KV_STORE_PASSWORD='{PLANTED}'" in env.splitlines()
    adapter_line = (
        'LMCACHE_L2_ADAPTER=\'{"type":"valkey","startup_nodes":"10.213.3.1:6390",'
        '"request_timeout":5.0,"connection_timeout":10.0}\''
    )
    assert adapter_line in env.splitlines()


def test_lmcache_gets_the_password_in_its_adapter_json_but_no_command_line_shows_it(tmp_path: Path) -> None:
    settings = settings_for_host({**LMCACHE_RIG, "lmcache_http_port": free_port()})
    launched = run_entrypoint(tmp_path, settings)
    adapter = launched["lmcache"][launched["lmcache"].index("--l2-adapter") + 1]
    assert json.loads(adapter) == {
        "type": "valkey",
        "startup_nodes": "10.213.3.1:6390",
        **STATED_TIMEOUTS,
        "password": PLANTED,
    }
    command_line = (tmp_path / "argv.lmcache.cmdline").read_text()  # /proc/PID/cmdline: what ps shows every user
    assert "server" in command_line and "10.213.3.1:6390" in command_line
    assert PLANTED not in command_line and PLANTED not in json.dumps(launched["vllm"])


@pytest.mark.parametrize(
    "change, field",
    [
        ({"kv_store_password": None}, "kv_store_password"),
        ({"l2_enabled": False}, "l2_enabled"),
        ({"l2_adapter_json": '{"type":"fs","base_path":"/kv"}'}, "l2_adapter_json"),
        ({"l2_kv_store_address": "store.lan"}, "l2_kv_store_address"),
    ],
)
def test_a_rig_pointed_at_the_store_is_refused_without_what_it_needs(change: dict, field: str) -> None:
    data = {key: value for key, value in {**LMCACHE_RIG, **change}.items() if value is not None}
    with pytest.raises(ConfigError) as caught:
        settings_for_host(data)
    assert caught.value.field == field
    assert PLANTED not in str(caught.value)


def test_a_bad_password_is_refused_redacted() -> None:
    with pytest.raises(ConfigError) as caught:
        settings_for_host({**LMCACHE_RIG, "kv_store_password": "planted has spaces inside"})
    assert caught.value.field == "kv_store_password" and "planted" not in str(caught.value)


# --- the real server ---------------------------------------------------------------------------------------


def _server_binaries() -> tuple[str, str] | None:
    where = os.environ.get("RIGKIT_TEST_VALKEY_BIN")
    path = where if where else None
    for server, cli in (("valkey-server", "valkey-cli"), ("redis-server", "redis-cli")):
        found = shutil.which(server, path=path), shutil.which(cli, path=path)
        if all(found):
            return found
    unpacked = unpacked_tool("redis-server"), unpacked_tool("redis-cli")
    return unpacked if all(unpacked) else None


BINARIES = _server_binaries()
needs_server = pytest.mark.skipif(
    BINARIES is None,
    reason="no valkey-server/redis-server in "
    "$RIGKIT_TEST_VALKEY_BIN, on PATH or unpacked by bin/setup "
    "(rigkit/lab/unpacked_tools.py)",
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def store(tmp_path: Path):
    """valkey (or redis) serving rigkit's configuration on a free loopback port; its section and config path."""
    server, _ = BINARIES
    section = store_section(kv_store_port=_free_port())
    conf = tmp_path / "rigkit.conf"
    conf.write_text(kv_store.config_text(section, PLANTED) + f"dir {tmp_path}\n")
    process = subprocess.Popen([server, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as client:
                if client.connect_ex(("127.0.0.1", section["kv_store_port"])) == 0:
                    break
            time.sleep(0.05)
        yield section, conf
    finally:
        process.terminate()
        process.wait(timeout=10)


def _ask(section: dict, conf: Path) -> tuple[dict, str]:
    """The role's check command, run here against the local server (its paths and CLI swapped in)."""
    _, cli = BINARIES
    command = StoreAnswers().command("127.0.0.1", section["kv_store_port"])
    command = command.replace(kv_store.RIGKIT_CONF, str(conf)).replace("valkey-cli", cli)
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    return StoreAnswers().process(out.stdout.splitlines()), out.stdout


@needs_server
def test_the_real_server_refuses_without_the_password_and_holds_the_declared_limit(store) -> None:
    section, conf = store
    answers, _ = _ask(section, conf)
    assert kv_store.answers_as_declared(section, answers) == []
    assert answers["config"]["maxmemory"] == str(GIB)


@needs_server
def test_the_check_fails_on_a_server_holding_another_limit(store) -> None:
    section, conf = store
    answers, _ = _ask(section, conf)
    problems = kv_store.answers_as_declared({**section, "kv_store_maxmemory_gib": 2}, answers)
    assert problems == [f"CONFIG GET maxmemory is '{GIB}', not '{2 * GIB}'"]


@needs_server
def test_the_real_server_refuses_a_wrong_password(store, tmp_path: Path) -> None:
    section, conf = store
    wrong = tmp_path / "wrong.conf"
    wrong.write_text(conf.read_text().replace(PLANTED, PLANTED + "-wrong"))
    answers, _ = _ask(section, wrong)
    assert "WRONGPASS" in answers["authenticated"] or "invalid" in answers["authenticated"]
    assert kv_store.answers_as_declared(section, answers)


# --- `rigkit status` asking the store from an lmcache-mp rig (rigkit.status: the kv-store section) -----------------


def _rig_on(port: int, password: str = PLANTED) -> Settings:
    return settings_for_host(
        {**LMCACHE_RIG, "l2_kv_store_address": "127.0.0.1", "kv_store_port": port, "kv_store_password": password}
    )


def _status_probe(settings: Settings, tmp_path: Path) -> str:
    """The kv-store section rigkit status runs on the rig, run here with the stack's real .env copied under tmp_path."""
    adapter, password_env = settings.knobs["l2_adapter_json"], "RIGKIT_KV_STORE_PASSWORD"
    assert kv_store.store_probe_command(adapter, stack_files()[1], password_env) in status_script(settings)
    env = tmp_path / "stack.env"
    env.write_text(render_env(settings))
    command = kv_store.store_probe_command(adapter, str(env), password_env)
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30).stdout


@needs_server
def test_status_finds_the_store_up_then_names_it_down_once_killed_without_showing_the_password(
    store, tmp_path: Path
) -> None:
    section, _ = store
    settings = _rig_on(section["kv_store_port"])
    assert _status_probe(settings, tmp_path).strip() == "store=up"
    assert kv_store_health(settings, "store=up") == "ok"
    wrong = _status_probe(_rig_on(section["kv_store_port"], PLANTED + "-wrong"), tmp_path)
    assert "WRONGPASS" in wrong or "invalid" in wrong
    assert PLANTED not in wrong


@needs_server
def test_status_names_a_killed_store_its_cost_and_the_fix(tmp_path: Path) -> None:
    server, _ = BINARIES
    port = _free_port()
    conf = tmp_path / "rigkit.conf"
    conf.write_text(kv_store.config_text(store_section(kv_store_port=port), PLANTED) + f"dir {tmp_path}\n")
    process = subprocess.Popen([server, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    settings = _rig_on(port)
    deadline = time.monotonic() + 10
    while _status_probe(settings, tmp_path).strip() != "store=up" and time.monotonic() < deadline:
        time.sleep(0.05)
    process.kill()  # SIGKILL: the store dies as an OOM kill would take it
    process.wait(timeout=10)
    start = time.monotonic()
    output = _status_probe(settings, tmp_path)
    elapsed = time.monotonic() - start
    print(f"store killed: the status probe said {output.strip()!r} in {elapsed:.2f} s")
    assert output.startswith("store=down: ") and "refused" in output.lower()
    health = kv_store_health(settings, output)
    assert f"127.0.0.1:{port}" in health and "5 s" in health and "systemctl start valkey-server" in health
    assert elapsed < kv_store.ADAPTER_CONNECTION_TIMEOUT_S


# --- the store firewall's sources (rigkit.kv_store.store_sources) --------------------------------------------

STORE_HOST = ("store1", "10.213.3.1")
NAMES = {
    "rig1.lan": ["10.213.3.2"],
    "rig3.lan": ["10.213.3.4", "fd00::4"],
    "10.213.3.2": ["10.213.3.2"],
    "127.0.0.1": ["127.0.0.1"],
    "10.213.3.1": ["10.213.3.1"],
}


def made_up_resolver(name: str) -> list[str]:
    """A made-up name table standing in for the controller's resolver (the real one: test below)."""
    if name not in NAMES:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return NAMES[name]


def sources(settings: dict, rigs: dict, store=STORE_HOST) -> list[str]:
    from rigkit.firewall import source_text

    return [source_text(n) for n in kv_store.store_sources(settings, store, rigs, made_up_resolver)]


def test_by_default_every_rig_of_the_inventory_is_allowed_at_its_resolved_address_once() -> None:
    section = store_section(kv_store_bind_addresses=["127.0.0.1", "10.213.3.1"])
    rigs = {"rig1": "rig1.lan", "rig2": "10.213.3.2", "rig3": "rig3.lan"}
    assert sources(section, rigs) == ["10.213.3.2", "10.213.3.4", "fd00::4"]


def test_declared_sources_replace_the_rigs_and_the_checks_own_address_is_added() -> None:
    section = store_section(kv_store_bind_addresses=["10.213.3.1"], kv_store_allowed_sources=["192.168.20.0/24"])
    # valkey binds no loopback: the role's check connects to 10.213.3.1 from 10.213.3.1, which must pass
    assert sources(section, {"rig1": "rig1.lan"}) == ["10.213.3.1", "192.168.20.0/24"]
    # an empty list would cut every rig off the store: refused before any host (hostdata.check_relations)
    with pytest.raises(ConfigError) as refused:
        store_section(kv_store_allowed_sources=[])
    assert refused.value.field == "kv_store_allowed_sources" and "leave it unset" in refused.value.fix


def test_a_rig_name_that_does_not_resolve_is_refused_naming_the_rig_and_the_fix() -> None:
    with pytest.raises(ConfigError) as refused:
        sources(store_section(kv_store_bind_addresses=["10.213.3.1"]), {"rig1": "rig1.lan", "rig7": "rig7.lan"})
    assert refused.value.field == "kv_store_allowed_sources" and refused.value.value == "rig7.lan"
    assert "rig rig7" in refused.value.problem and "does not resolve" in refused.value.problem
    assert "router_worker_address for rig7" in refused.value.fix and "kv_store_allowed_sources" in refused.value.fix


def test_a_loopback_rig_is_refused_when_the_store_is_elsewhere_and_needs_no_source_on_the_same_loopback() -> None:
    section = store_section(kv_store_bind_addresses=["127.0.0.1", "10.213.3.1"])
    with pytest.raises(ConfigError) as refused:
        sources(section, {"rig2": "127.0.0.1"})
    assert "rig rig2" in refused.value.problem and "loopback" in refused.value.problem
    # the lab: rigs on the host network and the store on one of them, all at 127.0.0.1
    assert sources(section, {"rig1": "127.0.0.1", "rig3": "10.213.3.2"}, store=("rig2", "127.0.0.1")) == ["10.213.3.2"]


def test_no_rig_to_allow_is_refused_unless_valkey_listens_on_loopback_only() -> None:
    with pytest.raises(ConfigError) as refused:
        sources(store_section(kv_store_bind_addresses=["10.213.3.1"]), {})
    assert "no rig" in refused.value.problem
    assert sources(store_section(), {}) == []


def test_a_bad_declared_source_is_refused_with_the_store_setting_named() -> None:
    with pytest.raises(ConfigError) as refused:
        store_section(kv_store_allowed_sources=["10.0.0.5/24"])
    assert refused.value.field == "kv_store_allowed_sources" and "10.0.0.0/24" in str(refused.value)
    with pytest.raises(ConfigError) as refused:
        store_section(kv_store_allowed_sources=["::/0"])
    assert "turn kv_store_firewall off" in str(refused.value)


def test_the_real_resolver_gives_each_address_once() -> None:
    assert kv_store.resolve_address("10.213.3.2") == ["10.213.3.2"]  # one per socket type without dedup
    assert kv_store.resolve_address("::1") == ["::1"]
    assert "127.0.0.1" in kv_store.resolve_address("localhost")  # /etc/hosts: no DNS needed


def test_the_rigs_are_the_inventorys_hosts_that_are_neither_router_nor_store_at_the_routers_address() -> None:
    from pyinfra.api import Inventory

    from rigkit.fleet.inventory import inventory_rigs
    from rigkit.router import rig_address

    rig = {
        "serving_profile": "cpu-lab",
        "serving_image": "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "3f" * 32,
        "gpus": 0,
        "num_gpu_blocks_override": 72,
    }
    inventory = Inventory(
        (["rig1", "rig3", "gw", "store1"], {}),
        rigs=(["rig1", "rig3"], {}),
        routers=(["gw"], {}),
        kv_stores=(["store1"], {}),
        override_data=None,
    )
    inventory.get_host("rig1").data.__dict__["override_datas"].update(
        {**rig, "bind_address": "0.0.0.0", "ssh_hostname": "10.213.3.2"}
    )
    inventory.get_host("rig3").data.__dict__["override_datas"].update(
        {**rig, "bind_address": "10.213.3.4", "ssh_hostname": "rig3.lan"}
    )
    rigs = inventory_rigs(inventory)
    assert list(rigs) == ["rig1", "rig3"]
    addresses = {name: rig_address(name, data, knobs["bind_address"]) for name, (data, knobs) in rigs.items()}
    assert addresses == {"rig1": "10.213.3.2", "rig3": "10.213.3.4"}  # the wildcard bind's SSH address, the one bind


# ---- what mutation found no test held: each text in full, each choice at its edge ----


def test_valkey_conf_is_this_text() -> None:
    assert kv_store.config_text(store_section(), PLANTED) == (
        "# rigkit: written by roles/kv_store.py (included last by valkey.conf); edits are overwritten\n"
        "bind 127.0.0.1\n"
        "port 6379\n"
        "protected-mode yes\n"
        f'requirepass "{PLANTED}"\n'
        "maxmemory 1073741824\n"
        "maxmemory-policy allkeys-lru\n"
        'save ""\n'
        "appendonly no\n"
    )
    with pytest.raises(ValueError, match=r"^kv_store_password contains a quote or a backslash, which valkey\.conf "):
        kv_store.config_text(store_section(), PLANTED + '"')


def test_a_long_password_of_visible_characters_passes_whatever_its_letters() -> None:
    assert kv_store.password_problem("XXXX-" + PLANTED) is None
    assert kv_store.password_problem(PLANTED + "\\") == (
        "contains a quote or a backslash, which valkey.conf and .env would each need escaped"
    )


@pytest.mark.parametrize(
    "bound, checked",
    [(["10.0.0.5", "127.0.0.1"], "127.0.0.1"), (["10.0.0.5", "::1"], "::1"), (["10.0.0.5", "10.0.0.6"], "10.0.0.5")],
)
def test_the_roles_check_connects_to_loopback_when_valkey_binds_it(bound, checked) -> None:
    assert kv_store.check_address({"kv_store_bind_addresses": bound}) == checked


def test_a_store_answering_otherwise_is_told_in_full() -> None:
    answers = {"unauthenticated": "PONG", "authenticated": "-ERR", "config": {"maxmemory": "0"}}
    assert kv_store.answers_as_declared(store_section(), answers) == [
        "a PING without the password got 'PONG', not NOAUTH",
        "a PING with the password got '-ERR', not PONG",
        "CONFIG GET maxmemory is '0', not '1073741824'",
        "CONFIG GET maxmemory-policy is None, not 'allkeys-lru'",
    ]


@pytest.mark.parametrize("address", ["10.213.3.1", "fd00::5"])
def test_the_probe_reaches_the_store_lmcache_is_given(address) -> None:
    """LMCache splits startup_nodes at its last ':' (an IPv6 address goes without brackets): so does the probe."""
    assert kv_store.store_node(adapter_json(address, 6380)) == (address, 6380)


@pytest.mark.parametrize(
    "output, why",
    [
        ("store=up\n", None),
        ("noise\nstore=down: no answer within 10 s\n", "no answer within 10 s"),
        ("", "no answer"),
        (None, "no answer"),
        ("Traceback: boom\n", "no answer"),
    ],
)
def test_the_probes_line_is_read_as_up_or_why_not(output, why) -> None:
    assert kv_store.parse_store_probe(output) == why


@pytest.mark.parametrize("bound", ["0.0.0.0", "::"])
def test_a_wildcard_bind_adds_no_source_of_its_own(bound) -> None:
    section = store_section(kv_store_bind_addresses=[bound], kv_store_allowed_sources=["192.168.20.0/24"])
    assert sources(section, {}) == ["192.168.20.0/24"]


def test_the_resolver_drops_an_ipv6_zone(monkeypatch) -> None:
    answers = [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fe80::1%eth0", 0, 0, 2))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: answers)
    assert kv_store.resolve_address("rig1.lan") == ["fe80::1"]


def test_the_sources_refusals_in_full() -> None:
    fix = "or declare kv_store_allowed_sources on the store host: the rigs' addresses as the store sees them"
    with pytest.raises(ConfigError) as none:
        sources(store_section(kv_store_bind_addresses=["10.213.3.1"]), {})
    assert str(none.value) == (
        "kv_store_allowed_sources=None: kv_store_firewall is on and the inventory has no rig to allow: store1 would "
        f"take connections to kv_store_port from its own loopback only. Fix: deploy the store in the same inventory "
        f"as its rigs, {fix}"
    )
    with pytest.raises(ConfigError) as loopback:
        sources(store_section(kv_store_bind_addresses=["10.213.3.1"]), {"rig2": "127.0.0.1"})
    assert str(loopback.value) == (
        "kv_store_allowed_sources='127.0.0.1': rig rig2's address 127.0.0.1 is loopback while the store store1 is at "
        "10.213.3.1: the rig reaches the store from an address the inventory does not name. Fix: set "
        f"router_worker_address for rig2 to its address on the store's network, {fix}"
    )
    with pytest.raises(ConfigError) as unknown:
        sources(store_section(kv_store_bind_addresses=["10.213.3.1"]), {"rig1": "rig1.lan"}, store=("s", "s.lan"))
    assert str(unknown.value) == (
        "kv_store_allowed_sources='s.lan': the store host s's address s.lan does not resolve on the controller "
        f"([Errno -2] Name or service not known). Fix: {fix}"
    )
