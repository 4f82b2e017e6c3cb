"""torch.save's ZIP archives (``.pt``, ``.pth``, ``.bin``, Lightning ``.ckpt``): the end records and central directory
(ZIP64 included), every storage ``data.pkl`` names (read by the restricted unpickler), and in the deep check every
entry's CRC32, inflated in bounded chunks under the DeepLimits, then ``torch.load(weights_only=True)`` in a
resource-limited child where torch is installed."""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from storwatch.checkpoints import pickles
from storwatch.checkpoints.deep import WEIGHTS_ONLY_REFUSED, torch_load_in_child
from storwatch.checkpoints.formats.common import (
    _CHUNK,
    _MAX_CENTRAL_DIRECTORY,
    _OK,
    _RATIO_FLOOR,
    FALLBACK,
    _Bad,
    _Ctx,
    _extra_torch_globals,
    _Finding,
    _open_regular,
    _read_exact,
    _torch_resolver,
    _unsafe,
)
from storwatch.checkpoints.limits import LimitReached

_EOCD = struct.Struct("<4s4H2LH")
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")
_CENTRAL_HEADER = struct.Struct("<4s6H3L5H2L")
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")
_EOCD_SIG, _ZIP64_LOC_SIG, _ZIP64_EOCD_SIG = b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06"
_CENTRAL_SIG, _LOCAL_SIG = b"PK\x01\x02", b"PK\x03\x04"


# ---- torch.save ZIP ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ZipEntry:
    name: str
    method: int
    crc: int
    compressed_size: int
    size: int
    header_offset: int


def _check_torch_zip(path: str, ctx: _Ctx) -> _Finding:
    root = os.path.dirname(os.path.abspath(path))
    f, size = _open_regular(path, root)
    with f:
        finding, entries = _zip_structure(f, size)
        if finding[0] != "complete":
            return finding
        budget = _InflateBudget(size, ctx)
        unknown: dict[str, int] = {}
        finding = _check_data_pkl(f, size, entries, ctx, budget, unknown)
        _merge_unknown(ctx, unknown)
        if finding[0] != "complete" or not ctx.deep:
            return finding
        finding = _zip_crcs(f, size, entries, ctx, budget)
    if finding[0] == "complete" and ctx.limits.torch_load:
        extra = _extra_torch_globals(ctx.limits, unknown)
        finding = note_refusal(ctx, torch_load_in_child(path, size, ctx.limits, ctx.deadline, extra))
    return finding


def _merge_unknown(ctx: _Ctx, unknown: dict[str, int]) -> None:
    for name, count in unknown.items():
        if name in ctx.unknown:
            ctx.unknown[name] += count
        elif len(ctx.unknown) < pickles.MAX_UNKNOWN_NAMES:
            ctx.unknown[name] = count


def note_refusal(ctx: _Ctx, finding: _Finding) -> _Finding:
    """torch's weights_only loader refusing a class storwatch reads as inert is a note, not the verdict's reason."""
    if finding == ("complete", WEIGHTS_ONLY_REFUSED):
        ctx.note(WEIGHTS_ONLY_REFUSED)
        return _OK
    return finding


def _zip_structure(f: BinaryIO, size: int) -> tuple[_Finding, list[_ZipEntry]]:
    truncated = (
        "incomplete",
        "ZIP end of central directory not found: the file was truncated during writing "
        f"(likely an interrupted save); {FALLBACK}",
    )
    if size == 0:
        return (
            "incomplete",
            f"the file is empty: the save was interrupted before any data was written; {FALLBACK}",
        ), []
    # The EOCD is the last 22 bytes plus a comment of up to 64 KiB; torch writes no comment.
    tail_len = min(size, _EOCD.size + 0xFFFF)
    tail = _read_exact(f, size - tail_len, tail_len)
    pos = tail.rfind(_EOCD_SIG, 0, len(tail) - _EOCD.size + 4)
    while pos >= 0 and pos + _EOCD.size + _EOCD.unpack_from(tail, pos)[7] != len(tail):
        pos = tail.rfind(_EOCD_SIG, 0, pos)
    if pos < 0:
        return truncated, []
    eocd_offset = size - tail_len + pos
    _, disk, cd_disk, count_disk, count, cd_size, cd_offset, _ = _EOCD.unpack_from(tail, pos)
    cd_end_limit = eocd_offset
    loc_offset = eocd_offset - _ZIP64_LOCATOR.size
    if loc_offset >= 0 and _read_exact(f, loc_offset, 4) == _ZIP64_LOC_SIG:
        _, _, z64_offset, _ = _ZIP64_LOCATOR.unpack(_read_exact(f, loc_offset, _ZIP64_LOCATOR.size))
        if z64_offset + _ZIP64_EOCD.size > loc_offset:
            return _corrupt_zip("the ZIP64 end record lies outside the file"), []
        record = _read_exact(f, z64_offset, _ZIP64_EOCD.size)
        if record[:4] != _ZIP64_EOCD_SIG:
            return _corrupt_zip("the ZIP64 end record is missing where its locator points"), []
        _, _, _, _, disk, cd_disk, count_disk, count, cd_size, cd_offset = _ZIP64_EOCD.unpack(record)
        cd_end_limit = z64_offset
    elif 0xFFFF in (count, count_disk) or 0xFFFFFFFF in (cd_size, cd_offset):
        return _corrupt_zip("the end record asks for ZIP64 but there is no ZIP64 locator"), []
    if disk != 0 or cd_disk != 0 or count_disk != count:
        return _corrupt_zip("the archive claims to span several disks"), []
    if cd_size > _MAX_CENTRAL_DIRECTORY:
        raise LimitReached(
            "central_directory",
            f"the ZIP central directory is {cd_size:,} bytes, over storwatch's bound of {_MAX_CENTRAL_DIRECTORY:,}: "
            "the archive was not read",
        )
    if cd_offset + cd_size > cd_end_limit:
        return _corrupt_zip(f"the central directory ({cd_size} bytes at {cd_offset}) runs past its end record"), []
    entries, problem = _parse_central_directory(_read_exact(f, cd_offset, cd_size), count, cd_offset)
    if problem:
        return _corrupt_zip(problem), []
    if not any(_is_data_pkl(e.name) for e in entries):
        return (
            "corrupt",
            "the ZIP archive has no data.pkl entry: it is not a torch.save checkpoint, or it was "
            "overwritten by another file",
        ), entries
    return _OK, entries


def _corrupt_zip(problem: str) -> _Finding:
    return "corrupt", f"ZIP structure is inconsistent: {problem}; the file is damaged, {FALLBACK}"


def _parse_central_directory(cd: bytes, count: int, cd_offset: int) -> tuple[list[_ZipEntry], str]:
    entries: list[_ZipEntry] = []
    pos = 0
    for i in range(count):
        if pos + _CENTRAL_HEADER.size > len(cd) or cd[pos : pos + 4] != _CENTRAL_SIG:
            return entries, f"central directory entry {i} of {count} is missing or malformed"
        (_, _, _, _, method, _, _, crc, csize, usize, name_len, extra_len, comment_len, _, _, _, offset) = (
            _CENTRAL_HEADER.unpack_from(cd, pos)
        )
        start = pos + _CENTRAL_HEADER.size
        name = cd[start : start + name_len].decode("utf-8", "replace")
        extra = cd[start + name_len : start + name_len + extra_len]
        pos = start + name_len + extra_len + comment_len
        if pos > len(cd):
            return entries, f"central directory entry {i} ({name!r}) runs past the directory"
        usize, csize, offset = _zip64_extra(extra, usize, csize, offset)
        if offset + _LOCAL_HEADER.size + name_len + csize > cd_offset:
            return entries, f"entry {name!r} claims data past the start of the central directory"
        entries.append(_ZipEntry(name, method, crc, csize, usize, offset))
    if pos != len(cd):
        return entries, f"the central directory holds {len(cd) - pos} bytes beyond its {count} entries"
    return entries, ""


def _zip64_extra(extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int, int]:
    # In the ZIP64 extra field (id 1) only the fields that are 0xFFFFFFFF in the header appear, in this order.
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<2H", extra, pos)
        body = extra[pos + 4 : pos + 4 + length]
        pos += 4 + length
        if tag != 1:
            continue
        values, at = [], 0
        for field in (usize, csize, offset):
            if field == 0xFFFFFFFF and at + 8 <= len(body):
                values.append(struct.unpack_from("<Q", body, at)[0])
                at += 8
            else:
                values.append(field)
        return values[0], values[1], values[2]
    return usize, csize, offset


class _InflateBudget:
    """Bytes one check may still inflate from deflated entries of one file: the smaller of the absolute cap and the
    file's size times the factor."""

    def __init__(self, file_size: int, ctx: _Ctx) -> None:
        limits = ctx.limits
        self.cap = min(limits.max_inflated_bytes, int(max(file_size, _CHUNK) * limits.max_inflated_factor))
        self.used = 0

    def spend(self, n: int) -> None:
        self.used += n
        if self.used > self.cap:
            raise LimitReached(
                "max_inflated_bytes",
                f"stopped at the inflated-bytes limit ({self.cap:,} bytes: the smaller of "
                "checkpoints.deep_max_inflated_bytes and the file's size times deep_max_inflated_factor); "
                "torch.save never compresses entries, so this archive was written by something else",
            )


def _stream_entry(
    f: BinaryIO, file_size: int, entry: _ZipEntry, ctx: _Ctx, budget: _InflateBudget, sink: Callable[[bytes], Any]
) -> int:
    """Feed an entry's (inflated) bytes to ``sink`` in chunks of at most 1 MiB; return their CRC32.

    Deflated entries are inflated with a bounded output per call (``max_length`` and ``unconsumed_tail``), so a
    decompression bomb never sits in memory: it stops at the ratio, inflated-bytes or declared-size bound."""
    header = _read_exact(f, entry.header_offset, _LOCAL_HEADER.size)
    if len(header) < _LOCAL_HEADER.size or header[:4] != _LOCAL_SIG:
        raise _Bad(*_corrupt_zip(f"the local header of {entry.name!r} is missing"))
    if entry.method not in (0, 8):
        raise _Bad(
            "corrupt",
            f"entry {entry.name!r} uses ZIP compression method {entry.method}, which torch never writes: the file "
            "is not what it claims to be",
        )
    name_len, extra_len = _LOCAL_HEADER.unpack(header)[9:11]
    start = entry.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    if start + entry.compressed_size > file_size:
        raise _Bad(*_corrupt_zip(f"the data of {entry.name!r} runs past the end of the file"))
    f.seek(start)
    ratio = ctx.limits.max_inflate_ratio
    inflate = zlib.decompressobj(-15) if entry.method == 8 else None
    crc, remaining, consumed, produced, chunks = 0, entry.compressed_size, 0, 0, 0
    while remaining:
        chunk = f.read(min(_CHUNK, remaining))
        if not chunk:
            raise _Bad(*_corrupt_zip(f"the data of {entry.name!r} ends early"))
        remaining -= len(chunk)
        consumed += len(chunk)
        chunks += 1
        if not chunks % 16:
            ctx.deadline.check()
        if inflate is None:
            crc = zlib.crc32(chunk, crc)
            sink(chunk)
            produced += len(chunk)
            continue
        data = chunk
        while True:
            out = inflate.decompress(data, _CHUNK)
            data = inflate.unconsumed_tail
            produced += len(out)
            budget.spend(len(out))
            if produced > entry.size:
                raise _Bad(
                    "corrupt",
                    f"entry {entry.name!r} inflates past its declared {entry.size:,} bytes: the archive is "
                    f"damaged or a decompression bomb; {FALLBACK}",
                )
            used = consumed - len(data)
            if produced > _RATIO_FLOOR and produced > ratio * max(used, 1):
                raise LimitReached(
                    "max_inflate_ratio",
                    f"stopped at the decompression-ratio limit ({produced / max(used, 1):.0f}:1 > {ratio:g}:1, "
                    f"checkpoints.deep_max_inflate_ratio) in entry {entry.name!r}; torch.save never compresses "
                    "entries: this is a decompression bomb or not a torch.save archive",
                    verdict="corrupt",
                )
            crc = zlib.crc32(out, crc)
            sink(out)
            if inflate.eof or (not data and len(out) < _CHUNK):
                break
        if inflate.eof:
            break
    if inflate is not None and not inflate.eof:
        raise _Bad(*_corrupt_zip(f"the deflated data of {entry.name!r} ends before its end marker"))
    if produced != entry.size:
        raise _Bad(*_corrupt_zip(f"entry {entry.name!r} holds {produced:,} bytes, its header declares {entry.size:,}"))
    return crc


def _zip_crcs(f: BinaryIO, file_size: int, entries: list[_ZipEntry], ctx: _Ctx, budget: _InflateBudget) -> _Finding:
    for entry in sorted(entries, key=lambda e: e.header_offset):
        crc = _stream_entry(f, file_size, entry, ctx, budget, _discard)
        # torch.serialization.set_crc32_options(False) writes 0 for every entry: nothing to compare against.
        if crc != entry.crc and (entry.crc != 0 or entry.size == 0):
            return (
                "corrupt",
                f"CRC32 mismatch in entry {entry.name!r} (stored {entry.crc:08x}, computed {crc:08x}): "
                "the data changed after it was written (a failing disk, memory or network path, or an "
                f"overwrite in place); {FALLBACK}",
            )
    return _OK


def _discard(_: bytes) -> None:
    pass


def _check_data_pkl(
    f: BinaryIO,
    file_size: int,
    entries: list[_ZipEntry],
    ctx: _Ctx,
    budget: _InflateBudget,
    unknown: dict[str, int],
) -> _Finding:
    """Run data.pkl through the restricted pickle machine: no unsafe global, every storage it names present in the
    archive with exactly the bytes it needs; the unknown globals it names are counted in ``unknown``."""
    entry = next(e for e in entries if _is_data_pkl(e.name))
    limits = ctx.limits
    if entry.size > limits.max_pickle_bytes:
        raise LimitReached(
            "max_pickle_bytes",
            f"data.pkl is {entry.size:,} bytes, over the limit of {limits.max_pickle_bytes:,} "
            "(checkpoints.deep_max_pickle_bytes): it was not read",
        )
    buf = bytearray()
    crc = _stream_entry(f, file_size, entry, ctx, budget, buf.extend)
    if entry.crc != 0 and crc != entry.crc:
        return (
            "corrupt",
            f"CRC32 mismatch in {entry.name!r} (stored {entry.crc:08x}, computed {crc:08x}): the data changed "
            f"after it was written; {FALLBACK}",
        )
    prefix = entry.name[: -len("data.pkl")]
    sizes = {e.name: e.size for e in entries}

    def storage(reader: pickles.Reader, pid: Any) -> pickles.Record:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickles.PickleError("a persistent id that is not a torch storage")
        _, kind, key, _location, numel = pid
        if not isinstance(kind, pickles.Global) or not isinstance(key, str) or type(numel) is not int or numel < 0:
            raise pickles.PickleError("a malformed storage id")
        member = f"{prefix}data/{key}"
        if member not in sizes:
            raise _Bad(
                "corrupt",
                f"data.pkl names storage {key[:40]!r}, which the archive does not hold: the archive was assembled "
                f"from different saves or damaged; {FALLBACK}",
            )
        width = pickles.STORAGE_ELEMENT_BYTES.get(kind.name)
        if width is not None and sizes[member] != numel * width:
            raise _Bad(
                "corrupt",
                f"storage {key[:40]!r} holds {sizes[member]:,} bytes where data.pkl needs {numel * width:,}: the "
                f"archive was assembled from different saves or damaged; {FALLBACK}",
            )
        return pickles.Record("torch.storage", (key,))

    try:
        pickles.load(
            bytes(buf),
            _torch_resolver(limits.allowed_globals),
            storage,
            limits.max_pickle_objects,
            ctx.deadline,
            unknown,
        )
    except pickles.UnsafeGlobal as err:
        return _unsafe("data.pkl", err)
    except pickles.PickleError as err:
        return "corrupt", f"data.pkl is not a valid torch.save pickle: {err}; {FALLBACK}"
    return _OK


def _is_data_pkl(name: str) -> bool:
    return name == "data.pkl" or (name.endswith("/data.pkl") and name.count("/") == 1)
