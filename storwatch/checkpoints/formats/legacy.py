"""torch.save's legacy format (``_use_new_zipfile_serialization=False``, and every torch before 1.6): pickles one
after another (the magic number, the protocol version, sys_info, the saved object, whose persistent ids name
storages, and the sorted list of storage keys), then each storage's bytes, as an 8-byte little-endian element count
followed by the data (torch/serialization.py, ``_legacy_save`` and ``_legacy_load``).

The pickles are read by the restricted machine through a window of at most ``max_pickle_bytes``, straight from the
file (no bulk read); each storage's count is compared with the element count its persistent id names, seeking over
the data, so a file cut short is ``incomplete`` and one whose storages do not match its pickle ``corrupt``. The deep
check reads every storage's bytes (the format has no checksums), then tries ``torch.load(weights_only=True)`` in the
limited child, without mmap (torch maps only its ZIP format)."""

from __future__ import annotations

import os
from typing import Any, BinaryIO

from storwatch.checkpoints import pickles
from storwatch.checkpoints.deep import torch_load_in_child
from storwatch.checkpoints.formats.common import (
    _OK,
    FALLBACK,
    _Bad,
    _Ctx,
    _extra_torch_globals,
    _Finding,
    _open_regular,
    _read_all,
    _read_exact,
    _torch_resolver,
    _unsafe,
)
from storwatch.checkpoints.formats.zip import _merge_unknown, note_refusal
from storwatch.checkpoints.limits import LimitReached

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
"""The first pickle of every legacy torch.save file (torch.serialization.MAGIC_NUMBER)."""
PROTOCOL_VERSION = 1001
"""The second pickle (torch.serialization.PROTOCOL_VERSION): the only one torch has written or reads."""
SNIFF_BYTES = 64
"""Enough to hold the magic number's pickle in any protocol (with protocol 4's frame header)."""
_COUNT_BYTES = 8
_MAGIC_LE = MAGIC_NUMBER.to_bytes(10, "little")
_MAGIC_PICKLES = (
    # Protocols 0 and 1: LONG, the decimal digits and an "L" suffix; 2 and 3: PROTO, LONG1 with 10 bytes; 4 and 5
    # add a FRAME of the 13 bytes that follow. Each ends with STOP. (pickle.dumps(MAGIC_NUMBER, protocol=N).)
    b"L" + str(MAGIC_NUMBER).encode() + b"L\n.",
    *(b"\x80" + bytes([proto]) + b"\x8a\x0a" + _MAGIC_LE + b"." for proto in (2, 3)),
    *(
        b"\x80" + bytes([proto]) + b"\x95" + (13).to_bytes(8, "little") + b"\x8a\x0a" + _MAGIC_LE + b"."
        for proto in (4, 5)
    ),
)


def is_legacy_cut(head: bytes) -> bool:
    """Whether ``head``, a whole file shorter than the magic number's pickle, is the start of that pickle as
    torch.save writes it in some protocol: a legacy save cut short before its first pickle ended (a file that long
    is shorter than ``SNIFF_BYTES``, so the head read is all of it)."""
    return bool(head) and any(len(head) < len(p) and p.startswith(head) for p in _MAGIC_PICKLES)


def is_legacy_head(head: bytes) -> bool:
    """Whether a file starting with ``head`` starts with the legacy format's magic number."""
    if not head.startswith(b"\x80") and not head.startswith(b"L"):
        return False  # a pickle protocol 2+ header, or protocol 0's long literal
    try:
        value = pickles.load(head[:SNIFF_BYTES], lambda _name: None, max_objects=64)
    except (pickles.PickleError, pickles.UnsafeGlobal, LimitReached):
        return False
    return type(value) is int and value == MAGIC_NUMBER


class _Window:
    """The file's first ``limit`` bytes as a stream for ``pickletools.genops``: a read never returns past the window,
    so a huge length field allocates nothing. ``ended`` says the file itself ran out, ``capped`` that the window
    did."""

    def __init__(self, f: BinaryIO, file_size: int, limit: int) -> None:
        self.f = f
        self.file_size = file_size
        self.end = min(file_size, limit)
        self.ended = False
        self.capped = False

    def read(self, n: int = -1) -> bytes:
        left = max(self.end - self.f.tell(), 0)
        if n < 0 or n > left:
            self._short()
            n = left
        return self.f.read(n)

    def readline(self, size: int = -1) -> bytes:
        left = max(self.end - self.f.tell(), 0)
        line = self.f.readline(left if size < 0 else min(size, left))
        if not line.endswith(b"\n"):
            self._short()
        return line

    def tell(self) -> int:
        return self.f.tell()

    def _short(self) -> None:
        if self.end >= self.file_size:
            self.ended = True
        else:
            self.capped = True


def _check_torch_legacy(path: str, ctx: _Ctx) -> _Finding:
    root = os.path.dirname(os.path.abspath(path))
    f, size = _open_regular(path, root)
    with f:
        unknown: dict[str, int] = {}
        finding, storages, data_start = _read_pickles(f, size, ctx, unknown)
        _merge_unknown(ctx, unknown)
        if finding[0] != "complete":
            return finding
        finding = _check_storages(f, size, storages, data_start, ctx)
    if finding[0] == "complete" and ctx.deep and ctx.limits.torch_load:
        extra = _extra_torch_globals(ctx.limits, unknown)
        finding = note_refusal(ctx, torch_load_in_child(path, size, ctx.limits, ctx.deadline, extra, mmap=False))
    return finding


def _cut_short(where: str) -> _Finding:
    return "incomplete", f"the file ends inside {where}: it was cut short (likely an interrupted save); {FALLBACK}"


def _read_pickles(
    f: BinaryIO, size: int, ctx: _Ctx, unknown: dict[str, int]
) -> tuple[_Finding, list[tuple[str, int, int]], int]:
    """Read the five pickles; the finding, the storages in the order their data follows (key, element count, bytes
    per element) and where that data starts."""
    limits = ctx.limits
    window = _Window(f, size, limits.max_pickle_bytes)
    named: dict[str, tuple[int, int | None, str]] = {}

    def storage(reader: pickles.Reader, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) == 4 and pid[0] == "module":
            return pid[1]  # a pickled nn.Module class with its source: the class stands for itself, inert
        if not (isinstance(pid, tuple) and len(pid) == 6 and pid[0] == "storage"):
            raise pickles.PickleError("a persistent id that is not a torch storage")
        _, kind, key, location, numel, view = pid
        if not isinstance(kind, pickles.Global) or not isinstance(key, str) or not isinstance(location, str):
            raise pickles.PickleError("a malformed storage id")
        if type(numel) is not int or not 0 <= numel < 1 << 62:
            raise pickles.PickleError("a storage id with no valid element count")
        # The first reference fixes the storage's type and size, as torch's loader takes them.
        first = named.setdefault(key, (numel, pickles.STORAGE_ELEMENT_BYTES.get(kind.name), kind.name))
        if view is not None:
            if not (isinstance(view, tuple) and len(view) == 3 and isinstance(view[0], str)):
                raise pickles.PickleError("a malformed storage view")
            _, offset, view_size = view
            if type(offset) is not int or type(view_size) is not int or offset < 0 or view_size < 0:
                raise pickles.PickleError("a storage view with no valid offset and size")
            if offset + view_size > first[0]:
                raise _Bad(
                    "corrupt",
                    f"a view of storage {key[:40]!r} reaches element {offset + view_size:,} of its {first[0]:,}; "
                    f"the file is damaged; {FALLBACK}",
                )
        return pickles.Record("torch.storage", (key,))

    reader = pickles.Reader(
        _torch_resolver(limits.allowed_globals), storage, limits.max_pickle_objects, ctx.deadline, unknown
    )
    stage = "the magic number"
    try:
        magic = reader.load_stream(window, window.end)
        if type(magic) is not int or magic != MAGIC_NUMBER:
            return ("corrupt", f"it does not start with torch's magic number; {FALLBACK}"), [], 0
        stage = "the protocol version"
        version = reader.load_stream(window, 0)
        if type(version) is not int or version != PROTOCOL_VERSION:
            return (
                ("unknown", f"legacy torch.save protocol version {str(version)[:20]}, which torch does not read"),
                [],
                0,
            )
        stage = "sys_info"
        reader.load_stream(window, 0)
        stage = "the saved object's pickle"
        reader.load_stream(window, 0)
        stage = "the list of storage keys"
        keys = reader.load_stream(window, 0)
    except pickles.UnsafeGlobal as err:
        return _unsafe(stage, err), [], 0
    except pickles.PickleError as err:
        if window.ended:
            return _cut_short(stage), [], 0
        if window.capped:
            raise LimitReached(
                "max_pickle_bytes",
                f"the pickles of this legacy torch.save file run past {limits.max_pickle_bytes:,} bytes "
                "(checkpoints.deep_max_pickle_bytes): they were not read to the end",
            ) from None
        return ("corrupt", f"{stage} is not a valid pickle: {err}; {FALLBACK}"), [], 0
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        return ("corrupt", f"the list of storage keys is not a list of names; {FALLBACK}"), [], 0
    missing = [k for k in named if k not in set(keys)]
    if missing:
        return (
            (
                "corrupt",
                f"the saved object names storage {missing[0][:40]!r}, which the file's storage list does not hold: "
                f"torch would load it as uninitialised memory; {FALLBACK}",
            ),
            [],
            0,
        )
    order: list[tuple[str, int, int]] = []
    for key in keys:
        if key not in named:
            return (
                ("corrupt", f"the storage list names {key[:40]!r}, which the saved object never uses; {FALLBACK}"),
                [],
                0,
            )
        numel, width, kind = named[key]
        if width is None:
            return (
                (
                    "unknown",
                    f"storage {key[:40]!r} is a {kind[:80]}, whose element size storwatch does not know: the data "
                    "after it cannot be located, so it was not compared with the pickle",
                ),
                [],
                0,
            )
        order.append((key, numel, width))
    return _OK, order, window.tell()


def _check_storages(f: BinaryIO, size: int, storages: list[tuple[str, int, int]], start: int, ctx: _Ctx) -> _Finding:
    pos = start
    for i, (key, numel, width) in enumerate(storages):
        if not i % 1024:
            ctx.deadline.check()
        head = _read_exact(f, pos, _COUNT_BYTES)
        if len(head) < _COUNT_BYTES:
            return _cut_short(f"the size of storage {key[:40]!r}")
        count = int.from_bytes(head, "little", signed=True)
        if count != numel:
            return (
                "corrupt",
                f"storage {key[:40]!r} is stored with {count:,} elements where the pickle names {numel:,}: the file "
                f"was assembled from different saves or damaged; {FALLBACK}",
            )
        end = pos + _COUNT_BYTES + numel * width
        if end > size:
            return _cut_short(f"the data of storage {key[:40]!r} (it needs {end:,} bytes, the file has {size:,})")
        if ctx.deep:
            f.seek(pos + _COUNT_BYTES)
            if _read_all(f, ctx, numel * width) < numel * width:
                return "incomplete", f"storage {key[:40]!r} ended early while being read; {FALLBACK}"
        pos = end
    if pos < size:
        ctx.note(
            f"{size - pos:,} bytes follow the last storage (another object saved after it into the same file, "
            "which torch.load ignores)"
        )
    return _OK
