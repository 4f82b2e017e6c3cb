"""safetensors files (the JSON header, bounded in size, depth and tensors, read entry by entry, and every tensor's
extent within the file) and sharded safetensors (an index whose weight map names shards that must each hold their
tensors)."""

from __future__ import annotations

import bisect
import codecs
import itertools
import json
import os
import re
import struct
from array import array
from collections.abc import Iterator
from typing import Any

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
    json_depth_exceeds,
    json_parse_bytes,
)
from storwatch.checkpoints.limits import PARSE_BUDGET, LimitReached

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


def _safetensors_file(path: str, root: str, ctx: _Ctx, wanted: set[str] | None = None) -> tuple[_Finding, set[str]]:
    """The file's finding and the names of ``wanted`` that its header declares."""
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
        finding, names, data_end = _safetensors_header(raw, ctx, wanted)
        del raw
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


# The header is read entry by entry, never built as one dict: a legal header of 16 MiB lists a quarter of a million
# tensors, and json.loads would build about a million objects for it. What is kept per tensor is its extent and the
# hash of its name, in arrays; the per-tensor work is one match of _ENTRY. An entry that does not match (another key
# order, escapes in its name, a float where an integer belongs) is parsed on its own with json.loads, bounded in size.
_WS = rb"[ \t\n\r]*"
_UINT = rb"(?:0|[1-9][0-9]{0,19})"
_ENTRY = re.compile(
    _WS + rb'"([^"\\\x00-\x1f]*)"' + _WS + rb":" + _WS + rb"\{" + _WS
    + rb'"dtype"' + _WS + rb":" + _WS + rb'"([A-Za-z0-9_]{1,32})"' + _WS + rb"," + _WS
    + rb'"shape"' + _WS + rb":" + _WS + rb"\[([0-9 \t\n\r,]{0,1024})\]" + _WS + rb"," + _WS
    + rb'"data_offsets"' + _WS + rb":" + _WS + rb"\[" + _WS + rb"(" + _UINT + rb")" + _WS + rb"," + _WS
    + rb"(" + _UINT + rb")" + _WS + rb"\]" + _WS + rb"\}" + _WS + rb"([,}])"
)  # fmt: skip
_SHAPE = re.compile(_WS + rb"(?:" + _UINT + _WS + rb"(?:," + _WS + _UINT + _WS + rb")*)?")
_OPEN = re.compile(_WS + rb"\{" + _WS)
_KEY_START = re.compile(_WS + rb'"')
_COLON = re.compile(_WS + rb":" + _WS)
_SEPARATOR = re.compile(_WS + rb"([,}])")
_TRAILING = re.compile(_WS)  # the writer pads the header with spaces to an 8-byte boundary
_STRING_STOP = re.compile(rb'["\\]')
_VALUE_STOP = re.compile(rb'[\[\]{}"]')
_MAX_ENTRY_PARSED = 64 * 1024
"""An entry that _ENTRY does not match is parsed alone with json.loads up to this size; a longer one stops the check
(``unknown``)."""
_BYTES_PER_TENSOR = 96
"""Memory per tensor while the extents are checked: 24 bytes in arrays, and a sorted list of one of them at a time."""
_CLOCK_EVERY = 4096


class _HeaderEnd(Exception):
    """The header is not a safetensors header; the message says where."""


def _string_end(raw: bytes, quote: int) -> int:
    """The index just past the JSON string that opens at ``quote``."""
    i = quote + 1
    while True:
        m = _STRING_STOP.search(raw, i)
        if m is None:
            raise _HeaderEnd("a string is not closed")
        if raw[m.start()] == 0x22:
            return m.end()
        i = m.start() + 2  # a backslash and the character it escapes


def _value_end(raw: bytes, start: int, ctx: _Ctx) -> int:
    """The index just past the JSON object or array that opens at ``start`` (its brackets counted, strings
    skipped; the whole header's depth was bounded before)."""
    depth, i, seen = 0, start, 0
    while True:
        m = _VALUE_STOP.search(raw, i)
        if m is None:
            raise _HeaderEnd("a value is not closed")
        seen += 1
        if not seen % _CLOCK_EVERY:
            ctx.deadline.check()
        token = raw[m.start()]
        if token == 0x22:
            i = _string_end(raw, m.start())
            continue
        depth += 1 if token in b"[{" else -1
        i = m.end()
        if depth == 0:
            return i


def _header_entries(raw: bytes, ctx: _Ctx) -> Iterator[tuple[bytes, Any]]:
    """Each entry of the header: the name's UTF-8 bytes and either the tuple (dtype, shape, begin, end) of a tensor
    that _ENTRY matched, or the entry's value as json.loads builds it; ``__metadata__`` is skipped unparsed. Raises
    _HeaderEnd (not a header), _Bad or LimitReached."""
    m = _OPEN.match(raw)
    if m is None:
        raise _HeaderEnd("it is not a JSON object")
    pos = m.end()
    if raw[pos : pos + 1] == b"}":
        pos += 1
    else:
        count = 0
        while True:
            count += 1
            if not count % _CLOCK_EVERY:
                ctx.deadline.check()
            e = _ENTRY.match(raw, pos)
            if e is not None:
                name, dtype, shape, begin, end, sep = e.groups()
                if not _SHAPE.fullmatch(shape):
                    raise _HeaderEnd(f"tensor {name[:80]!r} has no valid shape")
                dims = [int(d) for d in shape.split(b",")] if shape.strip(b" \t\n\r") else []
                yield name, (dtype.decode(), dims, int(begin), int(end))
                pos = e.end()
            else:
                k = _KEY_START.match(raw, pos)
                if k is None:
                    raise _HeaderEnd(f"no tensor name at byte {pos}")
                key_end = _string_end(raw, k.end() - 1)
                try:
                    key = json.loads(raw[k.end() - 1 : key_end])
                except ValueError:
                    raise _HeaderEnd(f"the name at byte {k.end() - 1} is not a JSON string") from None
                c = _COLON.match(raw, key_end)
                if c is None:
                    raise _HeaderEnd(f"no ':' after {key[:80]!r}")
                value_start = c.end()
                if key == "__metadata__" and raw.startswith(b"null", value_start):
                    value_end = value_start + 4
                elif raw[value_start : value_start + 1] != b"{":
                    raise _HeaderEnd(f"{key[:80]!r} is not an object")
                else:
                    value_end = _value_end(raw, value_start, ctx)
                if key != "__metadata__":
                    if value_end - value_start > _MAX_ENTRY_PARSED:
                        raise LimitReached(
                            "max_json_bytes",
                            f"the safetensors header's entry for {key[:80]!r} is {value_end - value_start:,} bytes, "
                            f"more than the {_MAX_ENTRY_PARSED:,} a tensor's entry is read up to: it was not parsed",
                        )
                    try:
                        value = json.loads(raw[value_start:value_end])
                    except (ValueError, RecursionError) as err:
                        raise _HeaderEnd(f"the entry of {key[:80]!r} is not valid JSON ({err})") from None
                    yield key.encode("utf-8", "surrogatepass"), value
                s = _SEPARATOR.match(raw, value_end)
                if s is None:
                    raise _HeaderEnd(f"no ',' or '}}' after the entry of {key[:80]!r}")
                sep, pos = s.group(1), s.end()
            if sep == b"}":
                break
    if _TRAILING.fullmatch(raw, pos) is None:
        raise _HeaderEnd(f"bytes other than spaces follow the header's closing brace at byte {pos}")


def _tensor_problem(name: str, spec: Any) -> str | None:
    """What is wrong with one tensor's entry, or None; ``spec`` as _header_entries yields it."""
    if isinstance(spec, tuple):
        dtype, shape, begin, end = spec
    elif not isinstance(spec, dict):
        return f"tensor {name[:80]!r} is not an object"
    else:
        dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
        if not (isinstance(shape, list) and all(type(d) is int for d in shape)):
            return f"tensor {name[:80]!r} has no valid shape"
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            return f"tensor {name[:80]!r} has no valid data_offsets"
        begin, end = offsets
    if not all(0 <= d < 1 << 63 for d in shape):
        return f"tensor {name[:80]!r} has no valid shape"
    if not 0 <= begin <= end < 1 << 63:
        return f"tensor {name[:80]!r} has no valid data_offsets"
    if not isinstance(dtype, str):
        return f"tensor {name[:80]!r} has no dtype"
    width = _SAFETENSORS_DTYPE_BYTES.get(dtype)
    if width is not None:
        count = 1
        for d in shape:
            count *= d
            if count > 1 << 63:
                return f"tensor {name[:80]!r} has more elements than any file can hold"
        if count * width != end - begin:
            return f"tensor {name[:80]!r} spans {end - begin} bytes, its {dtype[:20]}{shape[:8]} needs {count * width}"
    return None


def _utf8_problem(raw: bytes) -> str | None:
    """Where the header is not UTF-8 (the format requires it), decoded a chunk at a time and thrown away."""
    if raw.isascii():
        return None
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(raw)
    try:
        for at in range(0, len(raw), _UTF8_CHUNK):
            decoder.decode(view[at : at + _UTF8_CHUNK], final=at + _UTF8_CHUNK >= len(raw))
    except UnicodeDecodeError as err:
        return f"it is not UTF-8 text ({err.reason})"
    return None


_UTF8_CHUNK = 1 << 20


def _name_at(raw: bytes, ctx: _Ctx, begin: int, empty: bool) -> str:
    """The name of the first tensor (empty or not) that starts at ``begin``, read again from the header (the check
    keeps no names)."""
    for name, spec in _header_entries(raw, ctx):
        if name != b"__metadata__":
            start, stop = _extent(spec)
            if start == begin and (stop == start) == empty:
                return name.decode("utf-8", "replace")
    return "?"


def _extent(spec: Any) -> tuple[int, int]:
    return (spec[2], spec[3]) if isinstance(spec, tuple) else (spec["data_offsets"][0], spec["data_offsets"][1])


def _safetensors_header(raw: bytes, ctx: _Ctx, wanted: set[str] | None = None) -> tuple[_Finding, set[str], int]:
    """The header's finding, the names of ``wanted`` it declares, and where its data ends. Memory: the header's bytes
    and a few dozen bytes per tensor, held in the parse budget; never one object per JSON value."""

    def bad(problem: str) -> tuple[_Finding, set[str], int]:
        return ("corrupt", f"the safetensors header is invalid: {problem}; {FALLBACK}"), set(), 0

    limits = ctx.limits
    tensors_bound = raw.count(b"{")  # every tensor's entry is an object
    if tensors_bound > limits.max_json_values:
        raise LimitReached(
            "max_json_values",
            f"the safetensors header may list up to {tensors_bound:,} tensors, over the limit of "
            f"{limits.max_json_values:,}: it was not parsed, which says nothing against the checkpoint",
        )
    # Held at once: the bytes, then either the copies the depth check makes or the arrays of extents.
    need = len(raw) + max(2 * len(raw), tensors_bound * _BYTES_PER_TENSOR) + 2 * _MAX_ENTRY_PARSED * 25
    with PARSE_BUDGET.hold(need, "the safetensors header", limits, ctx.deadline):
        if json_depth_exceeds(raw, limits.max_json_depth):
            raise _Bad(
                "corrupt",
                f"the safetensors header nests deeper than {limits.max_json_depth} levels "
                f"(checkpoints.deep_max_json_depth), which no checkpoint format writes: it is damaged or hostile; "
                f"it was not parsed; {FALLBACK}",
            )
        problem = _utf8_problem(raw)
        if problem is not None:
            return bad(problem)
        begins, ends, empties, hashes = array("Q"), array("Q"), array("Q"), array("q")
        found: set[str] = set()
        try:
            for name, spec in _header_entries(raw, ctx):
                if name == b"__metadata__":
                    continue
                text = name.decode("utf-8", "surrogatepass")
                problem = _tensor_problem(text, spec)
                if problem is not None:
                    return bad(problem)
                if len(hashes) >= limits.max_json_values:
                    raise LimitReached(
                        "max_json_values",
                        f"the safetensors header lists more than {limits.max_json_values:,} tensors: it was not "
                        "checked to the end, which says nothing against the checkpoint",
                    )
                hashes.append(hash(name))
                begin, end = _extent(spec)
                if begin == end:
                    empties.append(begin)
                else:
                    begins.append(begin)
                    ends.append(end)
                if wanted is not None and text in wanted:
                    found.add(text)
        except _HeaderEnd as err:
            return bad(str(err))
        # Twice the same name: safetensors would keep one and lose the other's bytes. Hashes first, names to confirm.
        ordered = sorted(hashes)
        twice = {a for a, b in itertools.pairwise(ordered) if a == b}
        del ordered, hashes
        if twice:
            seen: set[bytes] = set()
            for name, _ in _header_entries(raw, ctx):
                if name != b"__metadata__" and hash(name) in twice:
                    if name in seen:
                        return bad(f"tensor {name.decode('utf-8', 'replace')[:80]!r} is listed twice")
                    seen.add(name)
        # The extents must follow one another from 0 (sorted by start, each starts where the one before ended). For
        # non-empty extents that holds exactly when the sorted starts, shifted by one, equal the sorted ends; an
        # empty tensor must sit on one of those boundaries.
        starts = array("Q", sorted(begins))
        del begins
        stops = array("Q", sorted(ends))
        del ends
        expected = 0
        for i, begin in enumerate(starts):
            if begin != expected:
                culprit = _name_at(raw, ctx, begin, empty=False)
                return bad(f"tensor {culprit[:80]!r} starts at {begin}, not where the previous one ended ({expected})")
            expected = stops[i]
            if not i % _CLOCK_EVERY:
                ctx.deadline.check()
        data_end = expected
        for offset in empties:
            at = bisect.bisect_left(starts, offset)
            if not (offset == data_end or (at < len(starts) and starts[at] == offset)):
                culprit = _name_at(raw, ctx, offset, empty=True)
                return bad(f"tensor {culprit[:80]!r} is empty at {offset}, inside another tensor's bytes")
    return _OK, found, data_end


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
    return _check_index(raw, root, index_name, ctx)


def _check_index(raw: bytes, root: str, index_name: str, ctx: _Ctx) -> _Finding:
    """A safetensors index (or torch's JSON ``.metadata``) and the shards it names. The parsed index lives while its
    shards are read, so its share of the parse budget is held until then (each shard's header takes its own)."""
    with PARSE_BUDGET.hold(json_parse_bytes(raw), f"the index {index_name}", ctx.limits, ctx.deadline):
        index = _load_json(raw, f"the index {index_name}", ctx, budget=False)
        del raw
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
        shard_finding, names = _safetensors_file(shard_path, root, ctx, tensors)
        if shard_finding[0] == "complete" and len(names) < len(tensors):
            missing = sorted(tensors - names)
            shard_finding = (
                "corrupt",
                f"{index_name} places {missing[0][:80]!r} in {shard}, which does not hold it: the "
                "shard and the index come from different saves",
            )
        if shard_finding[0] != "complete":
            finding = _worst(finding, (shard_finding[0], f"shard {shard}: {shard_finding[1]}"))
    return finding
