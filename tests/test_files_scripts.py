"""The shell scripts of rigkit/files/ pass shellcheck (they run in containers and on rigs, where a quoting slip is a
silent bug). Connector preludes are fragments inlined before the engine's exec: their variables come from the
container's environment (.env), which shellcheck cannot see (SC2154)."""

import shutil
import subprocess
from pathlib import Path

import pytest

from rigkit.paths import FILES_DIR

SCRIPTS = sorted(FILES_DIR.glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_shellcheck_finds_nothing(script: Path):
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: bin/setup installs it"
    result = subprocess.run(
        [shellcheck, "--shell=bash", "--exclude=SC2154", str(script)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout


def test_every_script_is_used_by_a_profile():
    from rigkit.settings.profiles import load_profiles

    preludes = {profile.connector.prelude for profile in load_profiles().values() if profile.connector}
    assert {script.read_text() for script in SCRIPTS} <= preludes
