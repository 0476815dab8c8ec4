"""The rig probe (rigkit/files/rig_limits.py) as validation runs it: its source on stdin over the SSH connection the
controller already holds (a RigCommand, rigkit.validation.ttft), nothing installed on the rig. Two halves:

- the disk half by the rig's python3 (the probe's disk half is standard library only), its files written in the L2
  store's parent directory: the store's filesystem, outside the directory the connector and the L2 janitor own;
- the GPU half by the serving container's python through `docker exec` (torch is in the image, not on the rig).

Their JSON is merged into one RigLimits (rigkit.validation.pays). A half that prints no result is an error the card
lists under "not measured", never a failed validation: the probe only adds the floor to a card."""

from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from rigkit.files import rig_limits
from rigkit.remote.probe import RigCommand
from rigkit.validation.pays import RigLimits

# One reader thread (what dd measures) and vLLM's fs tier's default (16 threads: issue 42's H100 run): a single
# stream is no ceiling, the tier's own thread count is the floor's
DISK_THREADS = (1, 16)


@dataclass(frozen=True)
class ProbeSizes:
    """What the tier moves at a time: one offloaded block into one GPU, one file read from the disk tier."""

    block_bytes: Optional[int] = None  # None: the probe's own default
    file_bytes: tuple[int, ...] = ()  # () : the probe's own default

    @classmethod
    def of(
        cls,
        block_tokens: Optional[int],
        gpu_bytes_per_token: Optional[int],
        store_chunk_tokens: Optional[int],
        store_bytes_per_token: Optional[float],
    ) -> "ProbeSizes":
        """A block: the GPU pool's block (vllm:cache_config_info) x each GPU's KV bytes per token; a file: the
        connector's chunk (LMCache stores whole chunks) or one block (vLLM's fs tier writes a file per block) x the
        tier's bytes per token."""
        block = block_tokens * gpu_bytes_per_token if block_tokens and gpu_bytes_per_token else None
        file_tokens = store_chunk_tokens or block_tokens
        per_token = store_bytes_per_token or gpu_bytes_per_token
        files = (int(file_tokens * per_token),) if file_tokens and per_token else ()
        return cls(block, files)


def _source() -> str:
    return Path(rig_limits.__file__).read_text()


def disk_command(l2_dir: Optional[str], sizes: ProbeSizes) -> str:
    """The rig's python3 reading the probe from stdin: GPU identity (nvidia-smi), and the disk where the L2 store
    lives (nothing of the disk without one)."""
    args = ["python3", "-"]
    if l2_dir:
        args += ["--l2-dir", posixpath.dirname(l2_dir.rstrip("/")) or "/"]
        args += ["--threads", ",".join(str(t) for t in DISK_THREADS)]
        if sizes.file_bytes:
            args += ["--file-bytes", ",".join(str(b) for b in sizes.file_bytes)]
    return shlex.join(args)


def gpu_command(container: str, sizes: ProbeSizes) -> str:
    """The serving container's python reading the probe from stdin, timing host-to-device copies."""
    args = ["docker", "exec", "-i", container, "python3", "-", "--gpu"]
    if sizes.block_bytes:
        args += ["--block-bytes", str(sizes.block_bytes)]
    return shlex.join(args)


def parsed(output: Optional[str], half: str, errors: list[str]) -> dict:
    """One half's JSON, or {} with why it is missing in `errors`."""
    try:
        return json.loads(output or "")
    except ValueError:
        errors.append(f"the probe's {half} printed no result ({(output or '').strip()[-200:]!r})")
        return {}


def merged(rig: dict, container: dict, errors: list[str]) -> dict:
    """The rig's half (nvidia-smi's PCIe links, the disk) with the container's host-to-device rates, by GPU index."""
    timed = {gpu.get("index"): gpu for gpu in container.get("gpus") or [] if gpu.get("h2d")}
    gpus = [dict(gpu) for gpu in rig.get("gpus") or []] or [dict(gpu) for gpu in container.get("gpus") or []]
    for gpu in gpus:
        for key in ("h2d", "block_bytes", "blocks", "repeats"):
            if key in timed.get(gpu.get("index"), {}):
                gpu[key] = timed[gpu["index"]][key]
    no_gpu = None if timed else container.get("no_gpu") or rig.get("no_gpu")
    errors = errors + [f"rig: {e}" for e in rig.get("errors") or []]
    errors += [f"container: {e}" for e in container.get("errors") or []]
    return {"gpus": gpus, "no_gpu": no_gpu, "disk": rig.get("disk"), "errors": errors}


def probe_rig_limits(run: RigCommand, l2_dir: Optional[str], container: str, sizes: ProbeSizes) -> RigLimits:
    """Both halves on the rig, merged. A rig without a GPU gets "no GPU" (RigLimits.no_gpu), not an error."""
    errors: list[str] = []
    rig = parsed(run(disk_command(l2_dir, sizes), _source()), "disk half (the rig's python3)", errors)
    silent: list[str] = []
    in_container = parsed(run(gpu_command(container, sizes), _source()), "GPU half (the serving container)", silent)
    if not rig.get("no_gpu"):  # on a rig without a GPU the container's silence is no finding of its own
        errors += silent
    return RigLimits.from_probe(merged(rig, in_container, errors))
