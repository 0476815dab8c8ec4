"""The vllm-router the tests and bench run on the controller is the release the router role pins."""

import re

from rigkit.paths import REPO_ROOT
from rigkit.settings.defaults import ROUTER_VARIABLES


def test_the_test_extra_pins_the_router_role_s_release():
    pinned = re.search(r'"vllm-router==([^"]+)"', (REPO_ROOT / "pyproject.toml").read_text()).group(1)
    default = next(variable.default for variable in ROUTER_VARIABLES if variable.name == "router_version")
    assert pinned == default
