"""AptHeldPackages beyond its captured cases: a package of another architecture is named as apt names it, and a
database that names no installed dpkg fails the read instead of reading as "nothing held"."""

import pytest
from pyinfra.api.exceptions import FactProcessError

from rigkit.facts.apt import AptHeldPackages


def test_a_foreign_architecture_is_named_name_arch_as_apt_mark_does():
    # made up: the lab's rigs have one architecture (apt-mark's FullName(true) leaves out only the native one)
    output = ["ii |dpkg|arm64", "hi |libc6|arm64", "hi |libc6|armhf", "hi |tzdata|all"]
    assert AptHeldPackages().process(output) == {"libc6", "libc6:armhf", "tzdata"}


def test_no_installed_dpkg_in_the_output_fails_the_read():
    with pytest.raises(FactProcessError, match="no installed dpkg"):
        AptHeldPackages().process(["hi |docker.io|amd64", "rc |dpkg|amd64"])
