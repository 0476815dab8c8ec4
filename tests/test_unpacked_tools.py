"""The unit tests' unpacked nft and redis (rigkit/lab/unpacked_tools.py): the key, the completeness rule the
tests' lookup trusts, and the wrappers, on a made-up tree (the real one is exercised by tests/test_firewall.py and
tests/test_kv_store.py, which run its nft and redis-server)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rigkit.lab import unpacked_tools
from rigkit.lab.proc import LabStepError


@pytest.fixture
def tools_root(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setattr(unpacked_tools, "TEST_TOOLS_ROOT", tmp_path)
    return tmp_path


def made_up_tree(target: Path) -> None:
    """Programs that print the library path they were started with, and one library file per lib dir."""
    for program in unpacked_tools.TOOLS.values():
        path = target / "root" / program
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('#!/bin/sh\necho "$LD_LIBRARY_PATH $*"\n')
        path.chmod(0o755)
    for lib_dir in ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu"):
        (target / "root" / lib_dir).mkdir(parents=True, exist_ok=True)
        (target / "root" / lib_dir / "libmadeup.so.1").write_text("")


def test_the_key_changes_with_the_package_list(monkeypatch) -> None:
    before = unpacked_tools.tools_key()
    assert unpacked_tools.tools_key() == before
    monkeypatch.setattr(unpacked_tools, "TOOL_PACKAGES", unpacked_tools.TOOL_PACKAGES + ("libhiredis0.14",))
    assert unpacked_tools.tools_key() != before


def test_a_tree_without_its_completion_marker_is_not_used(tools_root: Path) -> None:
    target = unpacked_tools.tools_dir()
    made_up_tree(target)
    unpacked_tools._write_wrappers(target)
    assert unpacked_tools.unpacked_tool("nft") is None
    (target / unpacked_tools.COMPLETE_MARKER).write_text("")
    assert unpacked_tools.unpacked_tool("nft") == str(target / "bin" / "nft")
    assert unpacked_tools.unpacked_tool("no-such-tool") is None


def test_a_completed_tree_is_not_rebuilt(tools_root: Path) -> None:
    target = unpacked_tools.tools_dir()
    target.mkdir(parents=True)
    (target / unpacked_tools.COMPLETE_MARKER).write_text("")
    # nothing is fetched: apt is never asked (it would fail on an empty tree's missing programs first)
    assert unpacked_tools.ensure_unpacked_tools(lambda message: pytest.fail(message)) == target


def test_a_wrapper_runs_its_program_with_the_trees_libraries_from_anywhere(tools_root: Path, tmp_path: Path) -> None:
    target = unpacked_tools.tools_dir()
    made_up_tree(target)
    unpacked_tools._write_wrappers(target)
    link = tmp_path / "elsewhere" / "nft"
    link.parent.mkdir()
    link.symlink_to(target / "bin" / "nft")
    out = subprocess.run([str(link), "-c", "-f", "x y"], capture_output=True, text=True, check=True).stdout
    root = target / "root"
    assert out == f"{root}/lib/x86_64-linux-gnu:{root}/usr/lib/x86_64-linux-gnu -c -f x y\n"


def test_a_package_list_missing_a_program_is_refused_naming_it(tools_root: Path) -> None:
    target = unpacked_tools.tools_dir()
    made_up_tree(target)
    (target / "root" / unpacked_tools.TOOLS["redis-cli"]).unlink()
    with pytest.raises(LabStepError) as caught:
        unpacked_tools._write_wrappers(target)
    assert caught.value.value == unpacked_tools.TOOLS["redis-cli"] and "TOOL_PACKAGES" in caught.value.fix
