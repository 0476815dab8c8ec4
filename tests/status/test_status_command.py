"""`rigkit status`, the command: --data values read as pyinfra reads them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rigkit.errors import ConfigError
from rigkit.status.command import cli_value, parse_data


def test_cli_values_are_read_as_pyinfra_reads_them():
    samples = ["true", "False", "8", "-3", "0.5", '{"method": "mtp"}', '["--x"]', "tiny", "0,1", ""]
    # pyinfra_cli patches the whole process with gevent on import: compared in a child
    code = ("import json, sys; from pyinfra_cli.util import parse_cli_arg; "
            "print(json.dumps([parse_cli_arg(a) for a in json.loads(sys.argv[1])]))")
    theirs = json.loads(subprocess.run([sys.executable, "-c", code, json.dumps(samples)], capture_output=True,
                                       text=True, check=True).stdout)
    assert [cli_value(sample) for sample in samples] == theirs
    with pytest.raises(ConfigError):
        parse_data(["no-equals-sign"])
