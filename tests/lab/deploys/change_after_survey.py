"""Test deploy: deploy.py on a rig, and once its survey was read, before any operation runs, someone else changes
the rig's compose.yml (out of band: `docker exec` into the lab rig, not this deploy's SSH connection).

The operations read the rig when they run (rigkit.facts.surveyed), so they must find the file changed and put it
right; the stack itself is untouched (it runs the verified release).
"""

import subprocess

from pyinfra import host

from rigkit.lab.state import read_state
from rigkit.paths import RIG_STACK_DIR
from rigkit.serving.render import COMPOSE_FILE_NAME
from rigkit.settings.hostdata import rig_settings
from roles import deploy_rig

CHANGE = "# changed on the rig after the survey"

run = deploy_rig(rig_settings(host.data.dict()))
assert run.survey is not None, "the survey is read while the deploy is prepared"
container = {rig.name: rig.container for rig in read_state().rigs}[host.name]
subprocess.run(
    ["docker", "exec", container, "sh", "-c", f"echo '{CHANGE}' >> {RIG_STACK_DIR}/{COMPOSE_FILE_NAME}"],
    check=True,
    timeout=60,
)
