"""What a deploy file sets in pyinfra's process (rigkit.fleet.deploy_process)."""

import gc

from rigkit.fleet import deploy_process, global_arguments, operation_order


def test_a_deploy_process_freezes_what_it_imported_and_installs_both(monkeypatch):
    installed = []
    monkeypatch.setattr(operation_order, "install", lambda: installed.append("operation_order"))
    monkeypatch.setattr(global_arguments, "install", lambda: installed.append("global_arguments"))
    try:
        deploy_process.install()
        assert gc.get_freeze_count() > 10_000  # pyinfra, pydantic and rigkit, imported by this test session
    finally:
        gc.unfreeze()
    assert installed == ["operation_order", "global_arguments"]
