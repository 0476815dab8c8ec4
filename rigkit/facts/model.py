"""Facts about the model store on a rig (rigkit.model.stage stages it; the serving role mounts it)."""

from __future__ import annotations

import json
import shlex
from typing import Optional

from pyinfra.api import FactBase


class StagedModel(FactBase):
    """The verified stamp of a staged revision (rigkit/files/model_store.py writes it after every file matched
    the manifest), None when the revision is not staged there: its directory or its stamp is missing."""

    def command(self, revision_dir: str, stamp: str) -> str:
        return f"test -d {shlex.quote(revision_dir)} && cat {shlex.quote(stamp)} 2>/dev/null || true"

    def process(self, output: list[str]) -> Optional[dict]:
        text = "\n".join(output).strip()
        try:
            stamp = json.loads(text) if text else None
        except ValueError:
            return None
        return {"manifest": stamp.get("manifest"), "files": len(stamp.get("files", {}))} if stamp else None
