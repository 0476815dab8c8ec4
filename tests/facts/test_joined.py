"""Facts of one kind read by one process (rigkit.facts.joined) inside a FactBatch.

The stat, sha1sum and listeners joins run on this machine's own shell through pyinfra's local connector and must
give, fact by fact, exactly what pyinfra's own ``get_fact`` gives for the same fact, over paths chosen to break them
and over real listeners. This machine has no systemd: the systemd join's split is held to a real `systemctl show` captured on a lab rig, and
tests/lab/test_serving_lab.py holds the whole join equal to each fact alone on a real rig.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Directory, File, Link, Sha1File
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from rigkit.facts.apt import AptHeldPackages
from rigkit.facts.batch import FactBatch, FactSpec, facts_now
from rigkit.facts.joined import DpkgJoin, ListenersJoin, Sha1Join, StatJoin, SystemdJoin, join_for
from rigkit.facts.server import PortListeners
from rigkit.facts.surveyed import service_reads

FIXTURES = Path(__file__).parent / "joined"

# names a join must quote, place or refuse: spaces, quotes, $, a glob, a leading dash, unicode, the separator's
# look, a backslash (sha1sum escapes it: read alone), a newline (read alone by both)
AWKWARD = [
    "plain",
    "with space",
    'it\'s "quoted"',
    "$HOME",
    "star*",
    "-dash",
    "ünï",
    "x__rigkit_fact_done__",
    "back\\slash",
    "new\nline",
]


def make_tree(root: Path) -> list[str]:
    paths = []
    for name in AWKWARD:
        (root / name).write_text(f"content of {name!r}\n")
        paths.append(str(root / name))
    (root / "empty").write_text("")
    (root / "dir").mkdir()
    (root / "link-to-file").symlink_to(root / "plain")
    (root / "link-to-dir").symlink_to(root / "dir")
    (root / "dangling").symlink_to(root / "nowhere")
    paths += [str(root / name) for name in ("empty", "dir", "link-to-file", "link-to-dir", "dangling", "absent")]
    # each file's atime after its mtime and ctime: under relatime a read of a file whose atime is not moves it, and
    # the batch's sha1sum runs beside its stat, so that read would race the stat (an atime that differs now and then)
    for name in [*AWKWARD, "empty"]:
        mtime = (root / name).stat().st_mtime_ns
        os.utime(root / name, ns=(time.time_ns() + 3600 * 10**9, mtime))
    return paths


def test_joined_reads_give_each_fact_what_pyinfra_reads_alone(local_host, tmp_path: Path):
    paths = make_tree(tmp_path)
    specs = [FactSpec.of(fact, path=path) for path in paths for fact in (File, Directory, Link, Sha1File)]
    specs.append(FactSpec.of(File, path="~/rigkit-no-such-file"))  # a tilde path: pyinfra's own command, alone

    batch = local_host.get_fact(FactBatch, facts=tuple(specs))

    alone = {spec: local_host.get_fact(spec.fact, **dict(spec.kwargs)) for spec in specs}
    # every fact was answered in the batch, by its join or on its own: none is left for a second round trip
    assert batch == alone
    assert batch[FactSpec.of(File, path=str(tmp_path / "plain"))]["size"] == len("content of 'plain'\n")
    assert batch[FactSpec.of(Directory, path=str(tmp_path / "plain"))] is False
    assert batch[FactSpec.of(Link, path=str(tmp_path / "dangling"))]["link_target"] == str(tmp_path / "nowhere")
    assert batch[FactSpec.of(Sha1File, path=str(tmp_path / "absent"))] is None
    assert batch[FactSpec.of(Sha1File, path=str(tmp_path / "dir"))] is None


def test_a_join_runs_its_tool_once_for_all_its_facts(local_host, tmp_path: Path):
    """The point of a join: one stat and one sha1sum for every path, not one each (a rig's CPU per process)."""
    log = tmp_path / "calls.log"
    wrappers = tmp_path / "bin"
    wrappers.mkdir()
    for tool in ("stat", "sha1sum"):
        (wrappers / tool).write_text(f'#!/bin/sh\necho {tool} >> {log}\nexec /usr/bin/{tool} "$@"\n')
        (wrappers / tool).chmod(0o755)
    files = [tmp_path / f"file{index}" for index in range(6)]
    for file in files:
        file.write_text(file.name)
    specs = tuple(FactSpec.of(fact, path=str(file)) for file in files for fact in (File, Sha1File))

    batch = local_host.get_fact(FactBatch, facts=specs, _env={"PATH": f"{wrappers}:/usr/bin:/bin"})

    assert len(batch) == len(specs) and all(batch.values())
    assert sorted(log.read_text().split()) == ["sha1sum", "stat"]


def test_a_line_a_join_cannot_place_leaves_its_facts_to_be_read_alone(local_host, tmp_path: Path):
    (tmp_path / "a").write_text("a")
    reads = [{"path": str(tmp_path / "a")}, {"path": str(tmp_path / "b")}]
    separator = "::sep::"
    good_line = f"{tmp_path / 'a'}{separator}user=root group=root mode=-rw-r--r-- atime=1 mtime=1 ctime=1 size=1 'a'"
    assert StatJoin().split(reads, ["1", "0", good_line], separator) == {0: [good_line.split(separator)[1]], 1: []}
    # an existing path stat said nothing of: that read alone, the absent one answered
    assert StatJoin().split(reads, ["1", "0"], separator) == {1: []}
    # a line of a path not asked for, or flags that are not flags: every read alone
    assert StatJoin().split(reads, ["1", "0", f"/elsewhere{separator}x"], separator) == {}
    assert StatJoin().split(reads, ["yes", "0", good_line], separator) == {}
    assert Sha1Join().split(reads, ["1"], separator) == {}
    # a path holding the separator's text is still placed by the path asked for, not by the text
    odd = {"path": f"/odd{separator}name"}
    line = f"/odd{separator}name{separator}user=root group=root mode=-rw-r--r-- atime=1 mtime=1 ctime=1 size=1 'x'"
    assert StatJoin().split([odd, reads[0]], ["1", "0", line], separator) == {0: [line.split(separator, 2)[2]], 1: []}

    # facts_now reads what the batch left out on its own: the values are still pyinfra's
    specs = [FactSpec.of(File, path=read["path"]) for read in reads]
    assert facts_now(local_host, specs) == {spec: local_host.get_fact(File, path=spec.kwargs[0][1]) for spec in specs}


SYSTEMD_UNITS = ["docker.service", "rigkit-no-such.service", "rigkit-l2-janitor.service"]
CAPTURED = (FIXTURES / "systemctl-show-3-units.txt").read_text()  # one `systemctl show` of the three on a lab rig
EXPECTED = {"docker.service": True, "rigkit-no-such.service": False, "rigkit-l2-janitor.service": True}

# A stand-in for systemctl (this machine has no systemd), named as such: it records its arguments and prints, for
# each unit asked, that unit's block of the real output captured on a lab rig, blocks separated as systemctl does.
STAND_IN = """#!/usr/bin/env python3
import sys
open(sys.argv[0] + ".log", "a").write(" ".join(sys.argv[1:]) + "\\n")
blocks = {block.splitlines()[0][3:]: block for block in open(sys.argv[0] + ".out").read().strip().split("\\n\\n")}
print("\\n\\n".join(blocks[unit] for unit in sys.argv[1:] if unit.endswith(".service")))
"""


def test_the_systemd_join_asks_systemctl_once_and_hands_each_unit_its_block(local_host, tmp_path: Path):
    stand_in = tmp_path / "bin" / "systemctl"
    stand_in.parent.mkdir()
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    (tmp_path / "bin" / "systemctl.out").write_text(CAPTURED)
    specs = tuple(spec for unit in SYSTEMD_UNITS for spec in service_reads(unit))

    batch = local_host.get_fact(FactBatch, facts=specs, _env={"PATH": f"{stand_in.parent}:/usr/bin:/bin"})

    units = [dict(spec.kwargs)["services"][0] for spec in specs]
    assert batch == {spec: {unit: EXPECTED[unit]} for spec, unit in zip(specs, units)}
    calls = (tmp_path / "bin" / "systemctl.log").read_text().splitlines()
    assert calls == ["show --all --property Id --property SubState --property UnitFileState " + " ".join(SYSTEMD_UNITS)]


def test_the_systemd_join_hands_each_unit_its_own_block_of_a_real_systemctl_show():
    """The captured output, split: three units (docker running, one that does not exist, rigkit's janitor)."""
    output = CAPTURED.splitlines()
    reads = [
        {"services": (unit,), "machine": None, "user_mode": False, "user_name": None}
        for unit in SYSTEMD_UNITS
        for _ in (SystemdStatus, SystemdEnabled)
    ]
    facts = [SystemdStatus, SystemdEnabled] * 3
    for lines in (output, output + ["", ""], [""] + output):  # blank lines around the blocks change nothing
        split = SystemdJoin().split(reads, lines, "")
        values = [fact().process(split[index]) for index, fact in enumerate(facts)]
        assert values == [{unit: EXPECTED[unit]} for unit in SYSTEMD_UNITS for _ in (1, 2)]
    one = SystemdJoin().split(reads[:1], output[:3] + [""], "")  # one unit, a trailing blank line
    assert SystemdStatus().process(one[0]) == {"docker.service": True}
    assert SystemdJoin().split(reads, output[:-4], "") == {}  # a block short: every read alone


@pytest.mark.parametrize(
    "fact, kwargs, joined",
    [
        (File, {"path": "/etc/fstab"}, StatJoin),
        (Link, {"path": "/etc/a b"}, StatJoin),
        (Directory, {"path": "/etc/X11"}, StatJoin),
        (Sha1File, {"path": "/etc/X11/Xsession"}, Sha1Join),
        (File, {"path": "~/x"}, None),
        (File, {"path": "/a\nb"}, None),
        (Sha1File, {"path": "/a\\b"}, None),
        (Sha1File, {"path": "/etc/fstab"}, Sha1Join),
        (SystemdStatus, {"services": ("docker.service",), "machine": None, "user_mode": False}, SystemdJoin),
        (SystemdEnabled, {"services": "docker.service"}, SystemdJoin),
        (SystemdStatus, {"services": ("a.service", "b.service")}, None),
        (SystemdStatus, {"services": ("docker.service",), "user_mode": True}, None),
        (SystemdStatus, {"services": ("docker.service; reboot",)}, None),
        (SystemdStatus, {"services": None}, None),
        (PortListeners, {"port": 8000}, ListenersJoin),
        (PortListeners, {"port": "8000; reboot"}, None),
        (DebPackages, {}, DpkgJoin),
        (AptHeldPackages, {}, DpkgJoin),
    ],
)
def test_which_reads_a_join_takes(fact, kwargs, joined):
    join = join_for(fact(), kwargs)
    assert (type(join) if join else None) is joined


def test_the_listeners_of_every_port_are_read_by_one_python(local_host, tmp_path: Path):
    """Two listeners on loopback and a free port: the join's one Python answers each port as it alone would."""
    log = tmp_path / "calls.log"
    wrapper = tmp_path / "bin" / "python3"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho python3 >> {log}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    servers = []
    for _ in range(2):
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        servers.append(server)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        free_port = free.getsockname()[1]
    ports = [server.getsockname()[1] for server in servers] + [free_port]
    specs = tuple(FactSpec.of(PortListeners, port=port) for port in ports)
    try:
        batch = local_host.get_fact(FactBatch, facts=specs, _env={"PATH": f"{wrapper.parent}:/usr/bin:/bin"})
        alone = {spec: local_host.get_fact(PortListeners, port=dict(spec.kwargs)["port"]) for spec in specs}
    finally:
        for server in servers:
            server.close()
    assert batch == alone
    assert [[listener["pid"] for listener in batch[spec]] for spec in specs] == [[os.getpid()], [os.getpid()], []]
    assert log.read_text().split() == ["python3"]
    assert ListenersJoin().split([{"port": 1}, {"port": 2}], ["[]"], "") == {}  # a line short: every read alone


# A dpkg database (dpkg-query and dpkg -l read the one DPKG_ADMINDIR names): a held package, one installed for two
# architectures (one of them held), one removed with its configuration left, one half-installed with an error.
DPKG_STATUS = """\
Package: dpkg
Status: install ok installed
Architecture: amd64
Version: 1.21.23
Description: package manager

Package: docker.io
Status: hold ok installed
Architecture: amd64
Version: 20.10.24+dfsg1-1+deb12u1+b6
Description: engine

Package: libfoo
Status: hold ok installed
Architecture: i386
Multi-Arch: same
Version: 1:2.0-1
Description: foo

Package: libfoo
Status: install ok installed
Architecture: amd64
Multi-Arch: same
Version: 1:2.0-1
Description: foo

Package: gone
Status: deinstall ok config-files
Architecture: amd64
Version: 3
Description: gone

Package: half
Status: install reinstreq half-installed
Architecture: all
Version: 4
Description: half
"""


def test_installed_and_held_packages_are_read_by_one_dpkg_query(local_host, tmp_path: Path):
    """DebPackages (dpkg -l) and AptHeldPackages (its dpkg-query) from one dpkg-query, as each reads alone."""
    if not all(Path(f"/usr/bin/{tool}").exists() for tool in ("dpkg", "dpkg-query")):
        pytest.skip("needs dpkg")
    admin = tmp_path / "dpkg"
    (admin / "info").mkdir(parents=True)
    (admin / "updates").mkdir()
    (admin / "status").write_text(DPKG_STATUS)
    (admin / "available").write_text("")
    log, wrappers = tmp_path / "calls.log", tmp_path / "bin"
    wrappers.mkdir()
    for tool in ("dpkg", "dpkg-query"):
        (wrappers / tool).write_text(f'#!/bin/sh\necho {tool} >> {log}\nexec /usr/bin/{tool} "$@"\n')
        (wrappers / tool).chmod(0o755)
    env = {"PATH": f"{wrappers}:/usr/bin:/bin", "DPKG_ADMINDIR": str(admin)}
    specs = (FactSpec.of(DebPackages), FactSpec.of(AptHeldPackages))

    batch = local_host.get_fact(FactBatch, facts=specs, _env=env)
    assert log.read_text().split() == ["dpkg-query"]
    alone = {spec: local_host.get_fact(spec.fact, _env=env) for spec in specs}
    assert batch == alone
    assert batch[specs[0]] == {"dpkg": {"1.21.23"}, "docker.io": {"20.10.24+dfsg1-1+deb12u1+b6"}, "libfoo": {"1:2.0-1"}}
    assert batch[specs[1]] == {"docker.io", "libfoo:i386"}


def test_a_dpkg_line_the_join_cannot_read_leaves_both_facts_alone():
    reads = [{"fact": DebPackages}, {"fact": AptHeldPackages}]
    assert DpkgJoin().split(reads, ["ii |dpkg|amd64"], "") == {}
    assert DpkgJoin().split(reads, [], "") == {}
    assert DpkgJoin().split(reads, ["ii |dpkg|amd64|1"], "") == {0: ["ii  dpkg 1 amd64"], 1: ["ii |dpkg|amd64"]}
