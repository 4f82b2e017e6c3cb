"""Large legal checkpoint metadata for the memory tests and benchmarks: a safetensors file whose JSON header lists a
quarter of a million tensors in about 14.6 MB (under the format's checked limit of 16 MiB). Standard library only
(the benchmarks import it too)."""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

WIDE_TENSORS = 250_000


def wide_header(tensors: int = WIDE_TENSORS, stored: int = 0, seed: int = 20) -> bytes:
    """A safetensors header of ``tensors`` F32 tensors in a shuffled order (JSON key order is the writer's), the
    first ``stored`` of them one element each, laid end to end, the rest empty (``shape [0]``, the legal way to
    list many tensors in few bytes: every one sits at the end of the data before it)."""
    order = list(range(tensors))
    random.Random(seed).shuffle(order)
    entries: dict[str, object] = {}
    for i in order:
        if i < stored:
            spec = {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
        else:
            end = 4 * stored
            spec = {"dtype": "F32", "shape": [0], "data_offsets": [end, end]}
        entries[f"w{i:06d}"] = spec
    entries["__metadata__"] = {"format": "pt"}
    return json.dumps(entries, separators=(",", ":")).encode()


def wide_safetensors(path: Path, tensors: int = WIDE_TENSORS, stored: int = 0) -> Path:
    """Write the file: the header's length, the header, then the stored tensors' bytes."""
    header = wide_header(tensors, stored)
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * (4 * stored))
    return path
