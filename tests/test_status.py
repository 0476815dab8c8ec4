"""`rigkit status`: the one script a rig runs, its sections parsed, and the drift and health decisions.

The end-to-end cases run the real script on a rig made on this machine (tests/status_sandbox.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rigkit import status as st
from rigkit.errors import ConfigError
from rigkit.status_drift import Drift
from rigkit.status_rig import RigStatus
from status_sandbox import IMAGE_1


def test_a_long_table_fits_a_terminal():
    statuses = [RigStatus(f"rig-with-a-rather-long-name-{i}", image=IMAGE_1,
                          drift=[Drift(".env", knob, "'a'", "'b'") for knob in
                                 ("served_model_name", "max_model_len", "max_num_batched_tokens")],
                          health={"engine": "ok", "container": "rigkit-serving restarting", "api": "down"},
                          ledger={"kind": "rollback", "smoke": "fail", "deployed_at": "2026-12-01T12:30:05+00:00",
                                  "note": "automatic: deploy failed " * 20},
                          driver="580.159.04", cuda="13.0") for i in range(3)]
    for status in statuses:
        status.unhealthy = ["container: rigkit-serving restarting"]
    report = st.format_report(statuses)
    table = report.split("\n")[:len(statuses) + 1]
    assert max(len(line) for line in table) <= st.TABLE_WIDTH
    assert table[0].split()[:3] == ["rig", "state", "image"]
    assert "drift .env: max_model_len: rig 'a', today 'b'" in report  # the details name every knob in full


def test_cli_values_are_read_as_pyinfra_reads_them():
    samples = ["true", "False", "8", "-3", "0.5", '{"method": "mtp"}', '["--x"]', "tiny", "0,1", ""]
    # pyinfra_cli patches the whole process with gevent on import: compared in a child
    code = ("import json, sys; from pyinfra_cli.util import parse_cli_arg; "
            "print(json.dumps([parse_cli_arg(a) for a in json.loads(sys.argv[1])]))")
    theirs = json.loads(subprocess.run([sys.executable, "-c", code, json.dumps(samples)], capture_output=True,
                                       text=True, check=True).stdout)
    assert [st.cli_value(sample) for sample in samples] == theirs
    with pytest.raises(ConfigError):
        st.parse_data(["no-equals-sign"])
