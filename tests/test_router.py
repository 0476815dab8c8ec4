"""The router's pure decisions (rigkit.router), and the real vllm-router from .venv started with the rendered
command line in front of fake workers on loopback (tests/fake_openai.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from fake_openai import FakeOpenAI

from rigkit.errors import ConfigError
from rigkit.router import (
    HEALTH_FLAGS,
    ROUTER_API_KEY_FILE,
    ROUTER_BREAKER_FAILURE_THRESHOLD,
    ROUTER_BREAKER_SUCCESS_THRESHOLD,
    ROUTER_BREAKER_TIMEOUT_S,
    ROUTER_BREAKER_WINDOW_S,
    ROUTER_FRONT_SOURCE,
    ROUTER_HEALTH_CHECK_INTERVAL_S,
    ROUTER_HEALTH_FAILURE_THRESHOLD,
    ROUTER_HEALTH_SUCCESS_THRESHOLD,
    ROUTER_LAUNCHER,
    ROUTER_LAUNCHER_SOURCE,
    ROUTER_PYTHON,
    ROUTER_UNHEALTHY_WITHIN_S,
    Worker,
    api_key,
    argv_file_text,
    command_line,
    front_argv,
    front_listen,
    is_gateway,
    pip_find_links,
    pip_install_args,
    refuse_router_on_controller,
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


# name, host data, bind_address -> where the gateway reaches the rig's API
WORKER_ADDRESSES = {
    "wildcard-ssh-hostname": ("rig1", {"ssh_hostname": "10.0.0.5"}, "0.0.0.0", "10.0.0.5"),
    "ipv6-wildcard-ssh-hostname": ("rig1", {"ssh_hostname": "fd00::5"}, "::", "fd00::5"),
    # no ssh_hostname: the inventory name is the SSH address
    "wildcard-inventory-name": ("rig1.lan", {}, "0.0.0.0", "rig1.lan"),
    "one-address": ("rig1", {"ssh_hostname": "rig1.lan"}, "192.168.7.5", "192.168.7.5"),
    # the lab: the gateway shares the host's loopback with a host-network rig
    "loopback-lab": ("rig1", {"ssh_hostname": "127.0.0.1"}, "127.0.0.1", "127.0.0.1"),
    "localhost-inventory-name": ("localhost", {}, "localhost", "localhost"),
    "declared": ("rig1", {"ssh_hostname": "10.0.0.5", "router_worker_address": "10.9.9.9"}, "127.0.0.1", "10.9.9.9"),
}


@pytest.mark.parametrize(("name", "data", "bind", "expected"), WORKER_ADDRESSES.values(), ids=WORKER_ADDRESSES)
def test_worker_address_follows_the_bind_address(name: str, data: dict, bind: str, expected: str) -> None:
    assert worker_address(name, data, bind) == expected


def test_workers_are_every_rig_in_order_and_distinct() -> None:
    rigs = {
        "rig1": ({"ssh_hostname": "127.0.0.1"}, KNOBS),
        "rig2": ({"ssh_hostname": "127.0.0.1"}, {**KNOBS, "serving_port": 8102}),
    }
    assert workers(rigs) == [
        Worker("rig1", "http://127.0.0.1:8101", "tiny"),
        Worker("rig2", "http://127.0.0.1:8102", "tiny"),
    ]


def test_ipv6_worker_url_is_bracketed() -> None:
    assert (
        workers({"r": ({"ssh_hostname": "fd00::5"}, {**KNOBS, "bind_address": "::"})})[0].url == "http://[fd00::5]:8101"
    )


def test_a_worker_without_ssh_hostname_is_reached_at_its_inventory_name() -> None:
    rigs = {"rig1.lan": ({}, {**KNOBS, "bind_address": "0.0.0.0"})}
    assert workers(rigs) == [Worker("rig1.lan", "http://rig1.lan:8101", "tiny")]


def test_worker_of_takes_a_worker_or_its_fields() -> None:
    worker = Worker("rig1", "http://a:1", "m")
    assert Worker.of(worker) is worker
    assert Worker.of({"rig": "rig1", "url": "http://a:1", "model": "m"}) == worker


# Every refusal in full: the field, the value, what is wrong and the fix (rigkit.errors.RigkitError)
TWO_RIGS_ONE_URL = {
    "rig1": ({"ssh_hostname": "127.0.0.1"}, KNOBS),
    "rig2": ({"ssh_hostname": "127.0.0.1"}, KNOBS),
}
ONE_WORKER = [Worker("rig1", "http://127.0.0.1:8101", "tiny")]
REFUSALS = {
    "rig-on-its-own-loopback": (
        lambda: worker_address("rig3", {"ssh_hostname": "10.213.3.2"}, "127.0.0.1"),
        "rig3.bind_address='127.0.0.1': the rig's API listens on its own loopback, which the router cannot reach "
        "at 10.213.3.2. Fix: set bind_address to an address the gateway reaches (0.0.0.0 behind the API "
        "firewall), or router_worker_address for rig3, or leave rig3 out of the router's inventory",
    ),
    "no-rig": (
        lambda: workers({}),
        "inventory=None: the run has a gateway (group routers) but no rig to route to. "
        "Fix: add the rigs to the same inventory as the hosts of group routers",
    ),
    "two-rigs-one-url": (
        lambda: workers(TWO_RIGS_ONE_URL),
        "rig2.serving_port=8101: rig2 and rig1 both reach the router as http://127.0.0.1:8101. "
        "Fix: give each rig on one address its own serving_port, or set router_worker_address",
    ),
    "wheelhouse-neither-url-nor-directory": (
        lambda: pip_find_links("wheels"),
        "router_pip_find_links='wheels': is neither an http(s) URL nor an absolute directory. "
        "Fix: set it to the wheelhouse's URL (http://HOST:PORT/) or its absolute path on the gateway",
    ),
    "wheelhouse-blank": (
        lambda: pip_find_links("/srv/my wheels"),
        "router_pip_find_links='/srv/my wheels': holds a blank or a shell character. "
        "Fix: give the wheelhouse a plain URL or path",
    ),
    "api-key-newline": (
        lambda: api_key({**ROUTER, "router_api_key": "se\nkret-value"}, {}),
        "router_api_key='<secret>': holds a blank, a newline or a NUL. Fix: use a key of visible characters only",
    ),
    "api-key-nul": (
        lambda: api_key({**ROUTER, "router_api_key": "se\x00kret-value"}, {}),
        "router_api_key='<secret>': holds a blank, a newline or a NUL. Fix: use a key of visible characters only",
    ),
    "api-key-blank-from-the-controller": (
        lambda: api_key(ROUTER, {"RIGKIT_ROUTER_API_KEY": "se kret-value"}),
        "router_api_key='<secret>': holds a blank, a newline or a NUL. Fix: use a key of visible characters only",
    ),
    "metrics-port-is-router-port": (
        lambda: command_line({**ROUTER, "router_metrics_port": 8300}, ONE_WORKER, with_api_key=False),
        "router_metrics_port=8300: is router_port too: the router would fail at start. "
        "Fix: set router_metrics_port to another port, e.g. 8301",
    ),
    "unit-nul-in-bind-address": (
        lambda: unit_text({**ROUTER, "router_bind_address": "a\x00b"}),
        "router_bind_address='a\\x00b': a command-line argument cannot contain a NUL byte. "
        "Fix: give plain addresses and URLs",
    ),
    "router-on-controller": (
        lambda: refuse_router_on_controller("@local", ROUTER),
        "router_on_controller=False: @local is the controller itself: the router role would install vllm-router, "
        "its systemd unit and files under /etc and /usr/local on this machine. Fix: name the gateway by its SSH "
        "address, leave @local out of this run (--limit the rigs; a router you run yourself there is still "
        "drained through), or set router_on_controller: true in @local's data",
    ),
}


@pytest.mark.parametrize(("refused", "message"), REFUSALS.values(), ids=REFUSALS)
def test_refusal_names_the_field_the_value_and_the_fix(refused, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        refused()
    assert str(error.value) == message
    assert "kret" not in str(error.value)


@pytest.mark.parametrize("port, suggested", [(8200, 8201), (65534, 65535), (65535, 65534)])
def test_shared_port_fix_suggests_a_port_that_exists(port, suggested) -> None:
    with pytest.raises(ConfigError) as refused:
        command_line({**ROUTER, "router_port": port, "router_metrics_port": port}, ONE_WORKER, with_api_key=False)
    assert refused.value.fix == f"set router_metrics_port to another port, e.g. {suggested}"


def test_the_router_and_the_controller_may_share_a_host_when_the_data_says_so() -> None:
    refuse_router_on_controller("@local", {**ROUTER, "router_on_controller": True})
    refuse_router_on_controller("gw.lan", ROUTER)


@pytest.mark.parametrize(
    "value", ["http://127.0.0.1:8999/", "https://wheels.lan/simple/", "HTTPS://WHEELS-X.lan/", "/srv/wheels", "/srv/X"]
)
def test_wheelhouse_accepted(value: str) -> None:
    assert pip_install_args(pip_find_links(value)) == f"--no-index --find-links {value}"


def test_no_wheelhouse_means_the_package_index() -> None:
    assert pip_find_links(None) is None and pip_install_args(None) is None


NOT_URL_NOR_DIRECTORY = "is neither an http(s) URL nor an absolute directory"
SHELL_CHARACTER = "holds a blank or a shell character"
WHEELHOUSES_REFUSED = {
    "relative": ("wheels", NOT_URL_NOR_DIRECTORY),
    "ftp": ("ftp://x/", NOT_URL_NOR_DIRECTORY),
    "command-substitution": ("http://x/$(id)", SHELL_CHARACTER),
    "blank": ("/srv/my wheels", SHELL_CHARACTER),
    "semicolon": ("http://x/;rm", SHELL_CHARACTER),
    "backtick": ("/srv/`id`", SHELL_CHARACTER),
}


@pytest.mark.parametrize(("value", "problem"), WHEELHOUSES_REFUSED.values(), ids=WHEELHOUSES_REFUSED)
def test_wheelhouse_refused(value: str, problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        pip_find_links(value)
    assert (refused.value.field, refused.value.value, refused.value.problem) == (
        "router_pip_find_links",
        value,
        problem,
    )


def test_api_key_from_data_or_the_controller_and_never_echoed() -> None:
    assert api_key({**ROUTER, "router_api_key": "k1"}, {"RIGKIT_ROUTER_API_KEY": "k2"}) == "k1"
    assert api_key(ROUTER, {"RIGKIT_ROUTER_API_KEY": "k2"}) == "k2"
    assert api_key(ROUTER, {"RIGKIT_ROUTER_API_KEY": ""}) is None
    assert api_key(ROUTER, {}) is None


def test_unit_text_in_full() -> None:
    assert unit_text(ROUTER) == (
        "[Unit]\n"
        "Description=rigkit router: vllm-router 0.1.17 behind its front on 127.0.0.1:8300\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n"
        "\n"
        "[Service]\n"
        'ExecStart="/opt/rigkit-router/bin/python" "/usr/local/lib/rigkit/router_front.py" '
        '"--listen" "127.0.0.1:8300" "--argv-file" "/etc/rigkit/router/argv.json" "--restart-delay" "2" '
        '"--ready-timeout" "90" "--stop-timeout" "60"\n'
        "ExecReload=/bin/kill -HUP $MAINPID\n"
        "Restart=always\n"
        "RestartSec=2\n"
        "TimeoutStopSec=70\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )
    assert '"--listen" "[fd00::1]:8300"' in unit_text({**ROUTER, "router_bind_address": "fd00::1"})


def test_argv_file_in_full() -> None:
    declared = [Worker("rig1", "http://10.0.0.5:8101", "tiny"), Worker("rig2", "http://[fd00::6]:8101", "tiny")]
    assert json.loads(argv_file_text(ROUTER, declared, with_api_key=True)) == [
        "/opt/rigkit-router/bin/python",
        "/usr/local/lib/rigkit/router_launch.py",
        "--api-key-file",
        ROUTER_API_KEY_FILE,
        *("--prometheus-host", "127.0.0.1", "--prometheus-port", "8301", "--policy", "cache_aware"),
        *("--worker-startup-timeout-secs", "60", "--worker-startup-check-interval", "2"),
        *("--health-check-interval-secs", "2", "--health-check-timeout-secs", "2"),
        *("--health-failure-threshold", "2", "--health-success-threshold", "2"),
        *("--cb-failure-threshold", "2", "--cb-window-duration-secs", "8"),
        *("--cb-timeout-duration-secs", "4", "--cb-success-threshold", "2"),
        *("--worker-urls", "http://10.0.0.5:8101", "http://[fd00::6]:8101"),
    ]


def test_the_breaker_is_set_from_the_health_checks_figures() -> None:
    """One source of truth: the breaker retries a worker no later than the health checks could take it back (a rig
    that recovered was kept out 15-28 s by vllm-router's default 60 s), with their thresholds."""
    assert ROUTER_BREAKER_TIMEOUT_S == ROUTER_HEALTH_SUCCESS_THRESHOLD * ROUTER_HEALTH_CHECK_INTERVAL_S
    assert (ROUTER_BREAKER_FAILURE_THRESHOLD, ROUTER_BREAKER_SUCCESS_THRESHOLD, ROUTER_BREAKER_WINDOW_S) == (
        ROUTER_HEALTH_FAILURE_THRESHOLD,
        ROUTER_HEALTH_SUCCESS_THRESHOLD,
        ROUTER_UNHEALTHY_WITHIN_S,
    )
    flags = dict(zip(HEALTH_FLAGS[::2], HEALTH_FLAGS[1::2]))
    assert flags["--cb-timeout-duration-secs"] == str(ROUTER_BREAKER_TIMEOUT_S)
    assert int(flags["--cb-timeout-duration-secs"]) < 60  # vllm-router 0.1.17's default


def test_the_key_is_in_no_unit_and_no_command_line() -> None:
    declared = [Worker("rig1", "http://127.0.0.1:8101", "tiny")]
    keyed = {**ROUTER, "router_api_key": "sekrit"}
    assert "sekrit" not in unit_text(keyed) + argv_file_text(keyed, declared, with_api_key=True)
    assert '"--api-key-file",\n"/etc/rigkit/router/api_key"' in argv_file_text(keyed, declared, with_api_key=True)
    assert "--api-key-file" not in argv_file_text(ROUTER, declared, with_api_key=False)


def test_unit_quotes_by_systemds_rules_and_refuses_what_it_cannot() -> None:
    unit = unit_text({**ROUTER, "router_bind_address": "a%b$c"})
    assert '"--listen" "a%%b$$c:8300"' in unit


def test_router_url_reaches_a_wildcard_bind_on_loopback() -> None:
    assert router_url(ROUTER) == "http://127.0.0.1:8300"
    assert router_url({**ROUTER, "router_bind_address": "0.0.0.0", "router_port": 9}) == "http://127.0.0.1:9"


def test_worker_mismatch_names_missing_and_extra() -> None:
    declared = [Worker("rig1", "http://a:1", "m"), Worker("rig2", "http://b:2", "m")]
    assert worker_mismatch(declared, ["http://a:1", "http://b:2"]) is None
    assert (
        worker_mismatch(declared, ["http://a:1", "http://c:3"]) == "missing rig2 (http://b:2); not declared http://c:3"
    )
    assert worker_mismatch(declared, []) == "missing rig1 (http://a:1), rig2 (http://b:2)"
    assert worker_mismatch([], ["http://c:3", "http://d:4"]) == "not declared http://c:3, http://d:4"


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


def family(pid: int) -> list[int]:
    """The process and its children."""
    return [pid, *(int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]


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
        argv = json.loads(argv_file_text(config, declared, with_api_key=True))
        assert argv[:2] == [ROUTER_PYTHON, ROUTER_LAUNCHER]
        argv[:2] = [sys.executable, str(ROUTER_LAUNCHER_SOURCE)]  # the gateway's paths, here
        argv[argv.index("--api-key-file") + 1] = str(key_file)
        argv_file = tmp_path / "argv.json"
        argv_file.write_text(json.dumps(argv))
        # the unit's command: the front on router_port, the router behind it
        front = front_argv(sys.executable, str(ROUTER_FRONT_SOURCE), front_listen(config), str(argv_file))
        process = subprocess.Popen(front, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
            shown = [Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace") for pid in family(process.pid)]
            assert len(shown) == 2 and not any("sekrit" in line for line in shown)
        finally:
            process.terminate()
            process.wait(timeout=20)
