"""A second revision of the lab model differing in its weights only (rigkit.lab.lab_weights)."""

import json
import struct

from rigkit.lab.lab_weights import NEGATED_TENSOR, WEIGHTS_FILE, negate_tensor, other_weights_revision
from rigkit.settings.model_source import resolve_directory


def _safetensors(tensors: dict[str, bytes]) -> bytes:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, data in tensors.items():
        header[name] = {"dtype": "BF16", "shape": [len(data) // 2], "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + b"".join(tensors.values())


def test_only_the_named_tensor_changes_sign(tmp_path):
    # bf16 1.0 = 0x3f80, -2.0 = 0xc000 (little-endian bytes)
    weights = _safetensors({"model.embed_tokens.weight": b"\x80\x3f" * 4, NEGATED_TENSOR: b"\x80\x3f\x00\xc0"})
    flipped = negate_tensor(weights)
    assert len(flipped) == len(weights) and flipped[:-4] == weights[:-4]
    assert flipped[-4:] == b"\x80\xbf\x00\x40"  # -1.0, 2.0
    assert negate_tensor(flipped) == weights

    model = tmp_path / "a"
    model.mkdir()
    (model / WEIGHTS_FILE).write_bytes(weights)
    (model / "config.json").write_text("{}")
    first = resolve_directory(str(model))
    other = other_weights_revision(model, tmp_path / "b")
    second = resolve_directory(str(other))
    assert first.revision != second.revision
    assert (other / "config.json").read_text() == "{}" and (other / WEIGHTS_FILE).read_bytes() == flipped
