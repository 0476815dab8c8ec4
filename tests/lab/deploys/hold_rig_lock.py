"""Test deploy: take the rig's deploy lock (roles/rig_lock.py), then keep it for `hold_s` seconds.

Stands in for a long deploy so a lab test can start a second one against the same rig meanwhile.
"""

from pyinfra import host
from pyinfra.operations import server

from rigkit.settings.hostdata import rig_settings
from roles import Run
from roles.rig_lock import rig_lock

run = Run()
lock_data = {key: value for key, value in host.data.dict().items() if key != "hold_s"}  # hold_s: this test's own
rig_lock(rig_settings(lock_data, needs_stack=False), run)
if not run.refused_by:
    # start/end lines with times: the lab test checks that two holders never overlapped
    server.shell(
        name="Hold the rig lock",
        commands=[
            "echo start $(date +%s.%N) >> /tmp/rigkit-lock-trace",
            f"sleep {int(host.data.get('hold_s', 20))}",
            "echo end $(date +%s.%N) >> /tmp/rigkit-lock-trace",
        ],
    )
