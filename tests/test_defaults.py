"""rigkit.defaults: every role variable declared once, prefixed by its role, documented, its default valid."""

from __future__ import annotations

from rigkit.defaults import ALL_VARIABLES, ROLE_SECTIONS
from rigkit.knobs import KNOBS

SECTION_PREFIXES = {"rig_lock": "rig_lock_", "nvidia_driver": "nvidia_driver_", "docker": "docker_",
                    "nvidia_container_toolkit": "nvidia_ctk_", "l2_disk": "l2_"}


def test_every_section_variable_carries_its_role_prefix():
    for section, prefix in SECTION_PREFIXES.items():
        for variable in ROLE_SECTIONS[section]:
            assert variable.name.startswith(prefix), f"{section}: {variable.name} lacks the prefix {prefix}"


def test_every_setting_is_declared_once_documented_and_its_default_valid():
    names = [variable.name for variable in ALL_VARIABLES] + [knob.name for knob in KNOBS]
    assert len(names) == len(set(names)), sorted(name for name in names if names.count(name) > 1)
    for variable in ALL_VARIABLES:
        assert variable.doc.strip(), f"{variable.name} has no doc"
        assert variable.coerce(variable.default) == variable.default, variable.name
