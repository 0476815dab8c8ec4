"""The lab's model as a controller-side model_source, staged onto lab rigs by rigkit.model.stage and mounted.

``lab_model_dir()`` is the one place that says which directory that is: the small trained model with real
safetensors when rigkit.lab.lab_model (``ensure_lab_model``) exists, else today's tiny model copied out of the
lab's serving image (config and tokenizer; its weights are vLLM's dummy ones), cached by the image digest.
``lab_model_source()`` pins it (rigkit.model.source.resolve_directory: manifest written, hash returned).
``other_weights_revision()`` writes a second revision of it that differs in its weights only (a rollback between
the two must change what the engine answers).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Callable, Optional

from rigkit.lab.engine import DOCKER_SOCKET
from rigkit.lab.proc import LabStepError
from rigkit.model.source import resolve_directory
from rigkit.paths import CACHE_DIR
from rigkit.serving.ledger import short_digest

try:  # the lab's trained model (issue: GPU truths), where this checkout has it
    from rigkit.lab.lab_model import ensure_lab_model as _trained_model
except ImportError:
    _trained_model = None

FROM_IMAGE_ROOT = CACHE_DIR / "lab-model-from-image"
WEIGHTS_FILE = "model.safetensors"
# the final RMSNorm's scale: negated, every logit changes sign (the greedy token becomes the least likely one)
NEGATED_TENSOR = "model.norm.weight"
IMAGE_MODEL_DIR = "/models/tiny"


def _docker(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "DOCKER_HOST": f"unix://{DOCKER_SOCKET}"},
    )


def model_from_serving_image(image: str, progress: Callable[[str], None] = print) -> Path:
    """The model directory baked into the lab's serving image ``image`` (repo@sha256:...), copied out once."""
    target = FROM_IMAGE_ROOT / short_digest(image)
    if (target / "config.json").is_file():
        return target
    progress(f"[lab model] copying {IMAGE_MODEL_DIR} out of {image}")
    created = _docker("create", image, "true")
    if created.returncode != 0:
        raise LabStepError(
            "lab model",
            image,
            f"docker create failed: {created.stderr.strip()}",
            "bring the lab up (`rigkit lab up`): it builds the serving image",
        )
    container = created.stdout.strip()
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    try:
        copied = _docker("cp", f"{container}:{IMAGE_MODEL_DIR}", str(staging))
        if copied.returncode != 0:
            raise LabStepError(
                "lab model",
                image,
                f"docker cp failed: {copied.stderr.strip()}",
                "rebuild the lab's serving image (`rigkit lab up`)",
            )
    finally:
        _docker("rm", "-f", container)
    os.replace(staging, target)
    return target


def lab_model_dir(serving_image: Optional[str] = None, progress: Callable[[str], None] = print) -> Path:
    """The directory the lab stages as its model (see the module doc for which)."""
    if _trained_model is not None:
        return Path(_trained_model(progress))
    if serving_image is None:
        raise LabStepError(
            "lab model",
            None,
            "no trained lab model in this checkout and no serving image given",
            "pass the lab's serving image (state.serving_image releases)",
        )
    return model_from_serving_image(serving_image, progress)


def lab_model_source(serving_image: Optional[str] = None, progress: Callable[[str], None] = print) -> str:
    """model_source for the lab's rigs: controller:<lab_model_dir>@<manifest sha256>."""
    return resolve_directory(str(lab_model_dir(serving_image, progress))).spec


def negate_tensor(weights: bytes, name: str = NEGATED_TENSOR) -> bytes:
    """A safetensors file (8-byte little-endian header length, JSON header, data) with one bf16/f16/f32 tensor's
    sign flipped (its sign bits; the header and every other byte unchanged)."""
    (header_length,) = struct.unpack("<Q", weights[:8])
    header = json.loads(weights[8 : 8 + header_length])
    entry = header[name]
    width = {"BF16": 2, "F16": 2, "F32": 4}[entry["dtype"]]
    start, end = (8 + header_length + offset for offset in entry["data_offsets"])
    data = bytearray(weights)
    for high in range(start + width - 1, end, width):  # little-endian: the sign bit is in each value's last byte
        data[high] ^= 0x80
    return bytes(data)


def other_weights_revision(directory: Path, target: Path) -> Path:
    """A copy of the model ``directory`` at ``target`` whose weights differ (NEGATED_TENSOR negated): another
    revision of the same model, with the same files, names and sizes."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(directory, target, ignore=shutil.ignore_patterns(".*"))
    (target / WEIGHTS_FILE).write_bytes(negate_tensor((directory / WEIGHTS_FILE).read_bytes()))
    return target
