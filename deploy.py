"""rigkit's one deploy: every role in pipeline order (roles.PIPELINE).

    pyinfra -y inventory/lab.py deploy.py

Host data is validated for every host first: bad input (a tag image, an unknown knob, a bad
value) stops the run before any host is touched. A role returning False refused this rig (e.g.
rig_lock: another deploy holds it); its failing operation names why and the rig gets nothing else.
"""

from pyinfra import host

import roles
from rigkit.hostdata import settings_for_host

settings_for_host(host.data.dict())

for role_name in roles.PIPELINE:
    role = roles.load(role_name)
    if role is not None and role() is False:
        break
