"""The router's pure decisions (rigkit.router), and the real vllm-router from .venv started with the rendered
command line in front of fake workers on loopback (tests/fake_openai.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
import requests
from fake_openai import FakeOpenAI

from rigkit.errors import ConfigError
from rigkit.router import (
    ROUTER_LAUNCHER,
    ROUTER_LAUNCHER_SOURCE,
    ROUTER_PYTHON,
    Worker,
    api_key,
    command_line,
    is_gateway,
    pip_find_links,
    pip_install_args,
    router_url,
    unit_text,
    worker_address,
    worker_mismatch,
    workers,
)
from rigkit.settings.defaults import ROUTER_VARIABLES
from rigkit.settings.variables import resolve

ROUTER = resolve(ROUTER_VARIABLES, {})
KNOBS = {"bind_address": "127.0.0.1", "serving_port": 8101, "served_model_name": "tiny"}


def test_gateway_is_the_routers_group() -> None:
    assert is_gateway(["lab", "routers"]) and not is_gateway(["lab"])


def test_worker_address_follows_the_bind_address() -> None:
    assert worker_address("rig1", {"ssh_hostname": "10.0.0.5"}, "0.0.0.0") == "10.0.0.5"
    assert worker_address("rig1", {"ssh_hostname": "rig1.lan"}, "192.168.7.5") == "192.168.7.5"
    # the lab: the gateway shares the host's loopback with a host-network rig
    assert worker_address("rig1", {"ssh_hostname": "127.0.0.1"}, "127.0.0.1") == "127.0.0.1"
    assert (
        worker_address("rig1", {"ssh_hostname": "10.0.0.5", "router_worker_address": "10.9.9.9"}, "127.0.0.1")
        == "10.9.9.9"
    )


def test_a_rig_bound_to_its_own_loopback_is_refused() -> None:
    with pytest.raises(ConfigError) as refused:
        worker_address("rig3", {"ssh_hostname": "10.213.3.2"}, "127.0.0.1")
    assert refused.value.field == "rig3.bind_address" and "0.0.0.0" in refused.value.fix


def test_workers_are_every_rig_in_order_and_distinct() -> None:
    rigs = {
        "rig1": ({"ssh_hostname": "127.0.0.1"}, KNOBS),
        "rig2": ({"ssh_hostname": "127.0.0.1"}, {**KNOBS, "serving_port": 8102}),
    }
    assert workers(rigs) == [
        Worker("rig1", "http://127.0.0.1:8101", "tiny"),
        Worker("rig2", "http://127.0.0.1:8102", "tiny"),
    ]
    with pytest.raises(ConfigError, match="both reach the router as http://127.0.0.1:8101"):
        workers({"rig1": rigs["rig1"], "rig2": ({"ssh_hostname": "127.0.0.1"}, KNOBS)})
    with pytest.raises(ConfigError, match="no rig to route to"):
        workers({})


def test_ipv6_worker_url_is_bracketed() -> None:
    assert (
        workers({"r": ({"ssh_hostname": "fd00::5"}, {**KNOBS, "bind_address": "::"})})[0].url == "http://[fd00::5]:8101"
    )


@pytest.mark.parametrize("value", ["http://127.0.0.1:8999/", "/srv/wheels"])
def test_wheelhouse_accepted(value: str) -> None:
    assert pip_install_args(pip_find_links(value)) == f"--no-index --find-links {value}"


@pytest.mark.parametrize("value", ["wheels", "ftp://x/", "http://x/$(id)", "/srv/my wheels", "http://x/;rm"])
def test_wheelhouse_refused(value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        pip_find_links(value)
    assert refused.value.field == "router_pip_find_links"


def test_api_key_from_data_or_the_controller_and_never_echoed() -> None:
    assert api_key({**ROUTER, "router_api_key": "k1"}, {}) == "k1"
    assert api_key(ROUTER, {"RIGKIT_ROUTER_API_KEY": "k2"}) == "k2"
    assert api_key(ROUTER, {}) is None
    with pytest.raises(ConfigError) as refused:
        api_key({**ROUTER, "router_api_key": "se\nkret-value"}, {})
    assert "kret" not in str(refused.value) and refused.value.value == "<secret>"


def test_the_key_is_in_no_unit_and_no_command_line() -> None:
    declared = [Worker("rig1", "http://127.0.0.1:8101", "tiny")]
    unit = unit_text({**ROUTER, "router_api_key": "sekrit"}, declared, with_api_key=True)
    assert "sekrit" not in unit and '"--api-key-file" "/etc/rigkit/router/api_key"' in unit
    assert "--api-key-file" not in unit_text(ROUTER, declared, with_api_key=False)


def test_unit_quotes_by_systemds_rules_and_refuses_what_it_cannot() -> None:
    declared = [Worker("rig1", "http://127.0.0.1:8101", "tiny")]
    unit = unit_text({**ROUTER, "router_bind_address": "a%b$c"}, declared, with_api_key=False)
    assert '"--host" "a%%b$$c"' in unit
    with pytest.raises(ConfigError) as refused:
        unit_text({**ROUTER, "router_bind_address": "a\x00b"}, declared, with_api_key=False)
    assert refused.value.field == "router_bind_address"


def test_metrics_port_must_differ_from_the_api_port() -> None:
    with pytest.raises(ConfigError, match="router_metrics_port=8300"):
        command_line({**ROUTER, "router_metrics_port": 8300}, [Worker("r", "http://a:1", "m")], with_api_key=False)


def test_router_url_reaches_a_wildcard_bind_on_loopback() -> None:
    assert router_url(ROUTER) == "http://127.0.0.1:8300"
    assert router_url({**ROUTER, "router_bind_address": "0.0.0.0", "router_port": 9}) == "http://127.0.0.1:9"


def test_worker_mismatch_names_missing_and_extra() -> None:
    declared = [Worker("rig1", "http://a:1", "m"), Worker("rig2", "http://b:2", "m")]
    assert worker_mismatch(declared, ["http://a:1", "http://b:2"]) is None
    assert (
        worker_mismatch(declared, ["http://a:1", "http://c:3"]) == "missing rig2 (http://b:2); not declared http://c:3"
    )


# --- the real vllm-router ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_health(url: str, process: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the router exited {process.returncode}: {process.stdout.read()[-3000:]}"
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the router did not answer /health within {timeout_s} s")


def test_real_router_serves_through_with_the_rendered_command_line(tmp_path) -> None:
    pytest.importorskip("vllm_router")
    key_file = tmp_path / "api_key"
    key_file.write_text("sekrit-worker-key\n")
    key_file.chmod(0o600)
    with FakeOpenAI() as one, FakeOpenAI() as two:
        declared = [Worker("rig1", one.url, "tiny"), Worker("rig2", two.url, "tiny")]
        config = {
            **ROUTER,
            "router_port": free_port(),
            "router_metrics_port": free_port(),
            "router_policy": "round_robin",
        }
        argv = command_line(config, declared, with_api_key=True)
        assert argv[:2] == [ROUTER_PYTHON, ROUTER_LAUNCHER]
        argv[:2] = [sys.executable, str(ROUTER_LAUNCHER_SOURCE)]  # the gateway's paths, here
        argv[argv.index("--api-key-file") + 1] = str(key_file)
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            url = router_url(config)
            wait_health(url, process)
            listed = requests.get(f"{url}/list_workers", timeout=5).json()["urls"]
            assert sorted(listed) == sorted([one.url, two.url]) and worker_mismatch(declared, listed) is None
            for _ in range(4):
                response = requests.post(
                    f"{url}/v1/chat/completions",
                    timeout=30,
                    headers={"Authorization": "Bearer client-key"},
                    json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                )
                assert response.status_code == 200
                assert response.json()["choices"][0]["message"]["content"] == "Hello there."
            # round robin: both rigs answered. Measured on 0.1.17: a request carries the client's own key to the
            # rig; the router's --api-key (read from the file) is not what it sends
            assert one.chat_authorizations and two.chat_authorizations
            assert set(one.chat_authorizations + two.chat_authorizations) == {"Bearer client-key"}
            shown = open(f"/proc/{process.pid}/cmdline", "rb").read().decode(errors="replace")
            assert "sekrit" not in shown
        finally:
            process.terminate()
            process.wait(timeout=20)
