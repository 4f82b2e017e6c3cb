"""safetensors files (the JSON header, bounded in size and depth, and every tensor's extent within the file) and
sharded safetensors (an index whose weight map names shards that must each hold their tensors)."""

from __future__ import annotations

import os
import struct

from storwatch.checkpoints.formats.common import (
    _MAX_SAFETENSORS_HEADER,
    _OK,
    FALLBACK,
    _Bad,
    _Ctx,
    _dir_names,
    _Finding,
    _load_json,
    _open_regular,
    _read_all,
    _safe_relative,
    _worst,
)
from storwatch.checkpoints.limits import LimitReached

SAFETENSORS_INDEX_SUFFIX = ".safetensors.index.json"

# Bytes per element; sub-byte and unknown dtypes skip the size check.
_SAFETENSORS_DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "C64": 8,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}


# ---- safetensors -------------------------------------------------------------------------------------------------


def _check_safetensors(path: str, ctx: _Ctx) -> _Finding:
    finding, _ = _safetensors_file(path, os.path.dirname(os.path.abspath(path)), ctx)
    return finding


def _safetensors_file(path: str, root: str, ctx: _Ctx) -> tuple[_Finding, set[str]]:
    """The file's finding and the tensor names its header declares."""
    f, size = _open_regular(path, root)
    with f:
        if size < 8:
            return (
                "incomplete",
                f"the file has {size} bytes, less than the 8-byte header length: it was truncated "
                f"during writing; {FALLBACK}",
            ), set()
        header_len = struct.unpack("<Q", f.read(8))[0]
        if header_len > _MAX_SAFETENSORS_HEADER:
            return (
                "corrupt",
                f"the header length field says {header_len} bytes, more than safetensors allows: the "
                f"file is not safetensors or its first bytes are damaged; {FALLBACK}",
            ), set()
        if 8 + header_len > size:
            return (
                "incomplete",
                f"the JSON header is cut off ({size - 8} of {header_len} bytes present): the file "
                f"was truncated during writing; {FALLBACK}",
            ), set()
        if header_len > ctx.limits.max_json_bytes:
            raise LimitReached(
                "max_json_bytes",
                f"the safetensors header is {header_len:,} bytes, over the limit of {ctx.limits.max_json_bytes:,} "
                "(checkpoints.deep_max_json_bytes): it was not parsed",
            )
        raw = f.read(header_len)
        finding, names, data_end = _safetensors_header(raw, ctx)
        if finding[0] != "complete":
            return finding, names
        data_size = size - 8 - header_len
        if data_end > data_size:
            return (
                "incomplete",
                f"the data section is {data_end - data_size} bytes short of what the header "
                f"declares: the file was truncated during writing; {FALLBACK}",
            ), names
        if data_end < data_size:
            return (
                "corrupt",
                f"{data_size - data_end} bytes follow the last tensor: the file was appended to or "
                f"overwritten; {FALLBACK}",
            ), names
        if ctx.deep:
            # safetensors carries no checksums: the deep check proves every byte can still be read.
            _read_all(f, ctx)
    return _OK, names


def _safetensors_header(raw: bytes, ctx: _Ctx) -> tuple[_Finding, set[str], int]:
    def bad(problem: str) -> tuple[_Finding, set[str], int]:
        return ("corrupt", f"the safetensors header is invalid: {problem}; {FALLBACK}"), set(), 0

    try:
        header = _load_json(raw, "the safetensors header", ctx)
    except _Bad as err:
        return err.finding, set(), 0
    if not isinstance(header, dict):
        return bad("it is not a JSON object")
    spans: list[tuple[int, int, str]] = []
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(spec, dict):
            return bad(f"tensor {name[:80]!r} is not an object")
        dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
        if not (isinstance(shape, list) and all(type(d) is int and 0 <= d < 1 << 63 for d in shape)):
            return bad(f"tensor {name[:80]!r} has no valid shape")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1] < 1 << 63
        ):
            return bad(f"tensor {name[:80]!r} has no valid data_offsets")
        if not isinstance(dtype, str):
            return bad(f"tensor {name[:80]!r} has no dtype")
        width = _SAFETENSORS_DTYPE_BYTES.get(dtype)
        if width is not None:
            count = 1
            for d in shape:
                count *= d
                if count > 1 << 63:
                    return bad(f"tensor {name[:80]!r} has more elements than any file can hold")
            if count * width != offsets[1] - offsets[0]:
                return bad(
                    f"tensor {name[:80]!r} spans {offsets[1] - offsets[0]} bytes, its {dtype[:20]}{shape[:8]} needs "
                    f"{count * width}"
                )
        spans.append((offsets[0], offsets[1], name))
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            return bad(f"tensor {name[:80]!r} starts at {begin}, not where the previous one ended ({end})")
        end = stop
    return _OK, {s[2] for s in spans}, end


def _check_safetensors_sharded(path: str, ctx: _Ctx) -> _Finding:
    if os.path.isdir(path):
        root = path
        indexes = sorted(e for e in _dir_names(path) if e.endswith(SAFETENSORS_INDEX_SUFFIX))
        index_path = os.path.join(path, "model" + SAFETENSORS_INDEX_SUFFIX)
        if not os.path.exists(index_path):
            index_path = os.path.join(path, indexes[0])
    else:
        root, index_path = os.path.dirname(os.path.abspath(path)), path
    index_name = os.path.basename(index_path)
    f, size = _open_regular(index_path, root)
    with f:
        raw = f.read(min(size, ctx.limits.max_json_bytes + 1))
    index = _load_json(raw, f"the index {index_name}", ctx)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        return (
            "corrupt",
            f"the index {index_name} has no weight_map of file names: it was truncated or damaged; {FALLBACK}",
        )
    return _check_weight_map(root, weight_map, index_name, ctx)


def _check_weight_map(root: str, weight_map: dict[str, str], index_name: str, ctx: _Ctx) -> _Finding:
    wanted: dict[str, set[str]] = {}
    for tensor, shard in weight_map.items():
        wanted.setdefault(shard, set()).add(tensor)
    finding = _OK
    for shard, tensors in sorted(wanted.items()):
        if not _safe_relative(shard):
            return "corrupt", f"{index_name} names shard {shard[:80]!r} outside the checkpoint directory"
        shard_path = os.path.join(root, shard)
        if not os.path.lexists(shard_path):
            finding = _worst(
                finding,
                (
                    "incomplete",
                    f"shard {shard} named in {index_name} is missing: the save or copy was interrupted; {FALLBACK}",
                ),
            )
            continue
        shard_finding, names = _safetensors_file(shard_path, root, ctx)
        if shard_finding[0] == "complete" and not tensors <= names:
            missing = sorted(tensors - names)
            shard_finding = (
                "corrupt",
                f"{index_name} places {missing[0][:80]!r} in {shard}, which does not hold it: the "
                "shard and the index come from different saves",
            )
        if shard_finding[0] != "complete":
            finding = _worst(finding, (shard_finding[0], f"shard {shard}: {shard_finding[1]}"))
    return finding
