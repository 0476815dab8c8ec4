"""The fleet's Valkey store (rigkit/kv_store.py) and LMCache's Valkey L2 adapter on the rigs (rendering only).

The server tests run the real valkey-server (or redis-server, which reads the same directives) on this machine's
loopback with the configuration rigkit renders, and ask it with the role's own check command; they are skipped,
saying so, when neither binary is on PATH or in $RIGKIT_TEST_VALKEY_BIN (a directory).
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

from rigkit import kv_store
from rigkit.errors import ConfigError
from rigkit.facts.kv_store import StoreAnswers
from rigkit.hostdata import rig_settings, settings_for_host
from rigkit.render import compose_document, render_env
from rigkit.sizing import GIB

PLANTED = "planted-kv-store-secret-7f3a"
STORE = {"kv_store_password": PLANTED, "kv_store_bind_addresses": ["127.0.0.1"], "kv_store_maxmemory_gib": 1}
LMCACHE_RIG = {"serving_profile": "lmcache-mp", "allow_incubating": True, "model": "m",
               "serving_image": "lmcache/vllm-openai@sha256:" + "a" * 64, "l2_enabled": True,
               "l2_kv_store_address": "10.213.3.1", "kv_store_password": PLANTED, "kv_store_port": 6390}


def store_section(**data) -> dict:
    return dict(rig_settings({**STORE, **data}, needs_stack=False).kv_store)


def test_config_binds_the_declared_addresses_with_password_and_limit() -> None:
    text = kv_store.config_text(store_section(kv_store_bind_addresses=["127.0.0.1", "10.0.0.5"],
                                              kv_store_maxmemory_gib=3), PLANTED)
    lines = text.splitlines()
    assert "bind 127.0.0.1 10.0.0.5" in lines and "protected-mode yes" in lines
    assert f'requirepass "{PLANTED}"' in lines
    assert f"maxmemory {3 * GIB}" in lines and "maxmemory-policy allkeys-lru" in lines


@pytest.mark.parametrize("password, problem", [
    ("short-secret", "fewer than"), ('has"quote-inside-xx', "quote"), ("has\\backslash-inside", "backslash"),
    ("has a space-inside-xx", "whitespace"), ("has\nnewline-inside-xx", "control"), ("tab\there-inside-xxxx", "control"),
])
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
    assert adapter == {"type": "valkey", "startup_nodes": "10.213.3.1:6390"}
    compose = json.dumps(compose_document(settings))
    assert PLANTED not in compose and "RIGKIT_KV_STORE_PASSWORD=${RIGKIT_KV_STORE_PASSWORD:-}" in compose
    env = render_env(settings)
    assert f"RIGKIT_KV_STORE_PASSWORD='{PLANTED}'" in env.splitlines()
    assert "LMCACHE_L2_ADAPTER='{\"type\":\"valkey\",\"startup_nodes\":\"10.213.3.1:6390\"}'" in env.splitlines()


def test_the_entrypoint_adds_the_password_to_the_adapter_json_from_the_environment() -> None:
    settings = settings_for_host(LMCACHE_RIG)
    prelude = settings.profile.connector.prelude
    splice = prelude[prelude.index("l2_adapter="):prelude.index("l2_args=(--l2-adapter")]
    script = splice + 'printf "%s" "$l2_adapter"\n'
    env = {"PATH": os.environ["PATH"], "LMCACHE_L2_ADAPTER": settings.knobs["l2_adapter_json"],
           "RIGKIT_KV_STORE_PASSWORD": PLANTED}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == {"type": "valkey", "startup_nodes": "10.213.3.1:6390", "password": PLANTED}


@pytest.mark.parametrize("change, field", [
    ({"kv_store_password": None}, "kv_store_password"),
    ({"l2_enabled": False}, "l2_enabled"),
    ({"l2_adapter_json": '{"type":"fs","base_path":"/kv"}'}, "l2_adapter_json"),
    ({"l2_kv_store_address": "store.lan"}, "l2_kv_store_address"),
])
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
    return None


BINARIES = _server_binaries()
needs_server = pytest.mark.skipif(BINARIES is None, reason="no valkey-server/redis-server on PATH or in "
                                                            "$RIGKIT_TEST_VALKEY_BIN")


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
