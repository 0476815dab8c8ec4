"""The kv_store role on the lab's Debian 13 rig (issue 15): valkey-server with a password, a limit and a policy.

`pyinfra inventory kv_store_rig2.py deploy.py` (the rig in group kv_stores gets the store role only): bad input is
refused before anything is installed; the deploy installs and configures valkey; valkey refuses a client without
the password (NOAUTH), answers with it and holds the declared maxmemory and policy; a re-run changes nothing; the
password is in no output and in no world-readable file. The rig is given back without valkey at the end.
KV through Valkey needs LMCache (a GPU): not here.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import pytest
from test_secrets_lab import files_holding

from rigkit.fleet.pyinfra_args import pyinfra_executable
from rigkit.kv_store import RIGKIT_CONF
from rigkit.lab.pyinfra_output import parse_results
from rigkit.paths import REPO_ROOT
from rigkit.settings.sizing import GIB

pytestmark = [pytest.mark.lab]

INVENTORY = Path(__file__).resolve().parent / "inventories" / "kv_store_rig2.py"
STORE = {"kv_store_port": 6390, "kv_store_maxmemory_gib": 1, "kv_store_maxmemory_policy": "allkeys-lfu"}
CLEANUP = (
    "systemctl stop valkey-server 2>/dev/null; DEBIAN_FRONTEND=noninteractive apt-get purge -y -q "
    "valkey-server valkey-tools >/dev/null 2>&1; rm -rf /etc/valkey /var/lib/valkey /var/log/valkey; true"
)


def deploy(password: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RIGKIT_KV_STORE_PASSWORD": password}
    return subprocess.run(
        [pyinfra_executable(), "-y", *args, str(INVENTORY), "deploy.py"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def store_rig(lab, rig_exec):
    rig = next(rig for rig in lab.rigs if rig.distro == "trixie")
    yield rig
    rig_exec(rig, CLEANUP, check=False)


def cli(rig_exec, rig, password: str | None, *command: str) -> str:
    auth = f"REDISCLI_AUTH={password} VALKEYCLI_AUTH={password} " if password else ""
    return rig_exec(
        rig, f"{auth}valkey-cli --no-auth-warning -p {STORE['kv_store_port']} {' '.join(command)}", check=False
    ).stdout.strip()


def test_the_store_role_serves_valkey_with_password_limit_and_policy(store_rig, rig_exec):
    rig, password = store_rig, f"planted-store-{secrets.token_hex(12)}"
    for refused, field in (
        (deploy(password, "--data", "kv_store_maxmemory_policy=volatile-lru"), "kv_store_maxmemory_policy"),
        (deploy("planted with spaces " + secrets.token_hex(4)), "kv_store_password"),
    ):
        assert refused.returncode != 0 and field in refused.stdout + refused.stderr, refused.stdout[-2000:]
        assert "planted with spaces" not in refused.stdout + refused.stderr
    assert rig_exec(rig, "dpkg -s valkey-server", check=False).returncode != 0, "a refused run installed valkey"

    first = deploy(password)
    output = first.stdout + first.stderr
    assert first.returncode == 0, output[-4000:]
    assert password not in output

    assert "NOAUTH" in cli(rig_exec, rig, None, "PING")
    assert cli(rig_exec, rig, password, "PING") == "PONG"
    assert cli(rig_exec, rig, password, "CONFIG", "GET", "maxmemory").splitlines()[-1] == str(GIB)
    assert cli(rig_exec, rig, password, "CONFIG", "GET", "maxmemory-policy").splitlines()[-1] == "allkeys-lfu"
    assert rig_exec(rig, f"stat -c '%U:%G %a' {RIGKIT_CONF}").stdout.strip() == "root:valkey 640"

    again = deploy(password)
    assert again.returncode == 0, again.stdout[-4000:]
    total = parse_results(again.stdout + again.stderr)["Grand total"]  # the results table (stderr off a tty)
    assert (total.success, total.error) == (0, 0) and total.no_change > 0, again.stderr[-3000:]  # every op No Change
    assert password not in again.stdout + again.stderr

    holding = files_holding(rig, rig_exec, password)
    assert set(holding) == {RIGKIT_CONF}, holding
    assert all(mode[-1] == "0" for mode in holding.values()), holding
