"""The lab's model as a controller-side model_source, staged onto lab rigs by rigkit.model.stage and mounted.

``lab_model_source()`` pins the lab's trained model (rigkit.lab.lab_model ``ensure_lab_model``: real safetensors,
cached by its inputs; rigkit.settings.model_source.resolve_directory: manifest written, hash returned); `rigkit lab up`
records it in the lab state for the lab's group data. ``other_weights_revision()`` writes a second revision of it
that differs in its weights only (a rollback between the two must change what the engine answers).
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Callable

from rigkit.lab.lab_model import ensure_lab_model
from rigkit.settings.model_source import resolve_directory

WEIGHTS_FILE = "model.safetensors"
# the final RMSNorm's scale: negated, every logit changes sign (the greedy token becomes the least likely one)
NEGATED_TENSOR = "model.norm.weight"


def lab_model_source(progress: Callable[[str], None] = print) -> str:
    """model_source for the lab's rigs: controller:<the trained lab model's directory>@<manifest sha256>."""
    return resolve_directory(str(ensure_lab_model(progress))).spec


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
