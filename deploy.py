"""rigkit's one deploy: every role in pipeline order (roles.PIPELINE) on each rig.

    pyinfra -y inventory/lab.py deploy.py

The host's settings are built once, here, before any host is touched: bad input (a tag image, an
unknown name, a bad value, no serving profile) stops the run while pyinfra prepares. A role that
refuses the rig (rig_lock: another deploy holds it; preflight: the bare host cannot serve) names why
in its failing operation, and the rig gets nothing else.
"""

from pyinfra import host

from rigkit.hostdata import rig_settings
from roles import deploy_rig

deploy_rig(rig_settings(host.data.dict()))
