"""Test deploy: take the rig's deploy lock (roles/rig_lock.py), then keep it for `hold_s` seconds.

Stands in for a long deploy so a lab test can start a second one against the same rig meanwhile.
"""

from pyinfra import host
from pyinfra.operations import server

from roles.rig_lock import rig_lock

if rig_lock():
    server.shell(name="Hold the rig lock", commands=[f"sleep {int(host.data.get('hold_s', 20))}"])
