"""GGUF model files (llama.cpp and its kin): the header, every metadata entry skipped over without keeping it, and
every tensor's extent within the data section, so a file cut short while it was written or copied is incomplete.

The layout (GGUF v2 and v3; v1's 32-bit counts are not read): magic ``GGUF``, a uint32 version, uint64 tensor and
metadata counts, the metadata entries (a string key, a uint32 type, a value), the tensor infos (a string name, a
uint32 dimension count, uint64 dimensions, a uint32 ggml type, a uint64 offset into the data section), then the data
section at the next multiple of ``general.alignment`` (32 by default). All little-endian.

Bounded: counts are checked against the bytes left in the file before anything is read for them, strings are
skipped by seeking, no value is kept but the alignment, and the walk checks the deadline.
"""

from __future__ import annotations

import os
import struct
from typing import BinaryIO

from storwatch.checkpoints.formats.common import _OK, FALLBACK, _Bad, _Ctx, _Finding, _open_regular

GGUF_MAGIC = b"GGUF"
_MAX_TENSORS = 1 << 20
_MAX_ENTRIES = 1 << 20
_MAX_DIMS = 8
_MAX_STRING = 1 << 24
_DEFAULT_ALIGNMENT = 32

# value type -> fixed size in bytes (8 string and 9 array are variable)
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4

# ggml type -> (elements per block, bytes per block), for the types models are published in; others skip the check
# of their size (their offsets are still checked).
_GGML_BLOCKS = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    9: (32, 36),  # Q8_1
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    15: (256, 292),  # Q8_K
    24: (1, 1),  # I8
    25: (1, 2),  # I16
    26: (1, 4),  # I32
    27: (1, 8),  # I64
    28: (1, 8),  # F64
    30: (1, 2),  # BF16
}


class _Reader:
    def __init__(self, f: BinaryIO, size: int, ctx: _Ctx) -> None:
        self.f, self.size, self.ctx = f, size, ctx
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > self.size:
            raise _Bad(
                "incomplete",
                f"the header is cut off at byte {self.size}: the file was truncated during writing; {FALLBACK}",
            )
        data = self.f.read(n)
        if len(data) != n:
            raise _Bad("incomplete", f"the file ended at byte {self.pos + len(data)} while it was read; {FALLBACK}")
        self.pos += n
        return data

    def skip(self, n: int) -> None:
        if self.pos + n > self.size:
            self.take(self.size - self.pos + 1)  # raises: cut off
        self.f.seek(n, os.SEEK_CUR)
        self.pos += n

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])

    def string(self, keep: bool = False) -> bytes:
        n = self.u64()
        if n > _MAX_STRING:
            raise _Bad("corrupt", f"a string of {n} bytes at byte {self.pos - 8}: not a GGUF header; {FALLBACK}")
        if keep:
            return self.take(n)
        self.skip(n)
        return b""

    def value(self, vtype: int, depth: int = 0) -> int | None:
        """Skip a value; return it when it is a uint32 (general.alignment's type)."""
        self.ctx.deadline.check()
        if vtype in _SCALAR:
            raw = self.take(_SCALAR[vtype])
            return int(struct.unpack("<I", raw)[0]) if vtype == _UINT32 else None
        if vtype == _STRING:
            self.string()
            return None
        if vtype == _ARRAY and depth < 2:
            etype, count = self.u32(), self.u64()
            least = _SCALAR.get(etype, 8)  # a string element is at least its 8-byte length
            if count * least > self.size - self.pos:
                raise _Bad("incomplete", f"an array of {count} entries runs past the end of the file; {FALLBACK}")
            if etype in _SCALAR:
                self.skip(count * _SCALAR[etype])
            else:
                for _ in range(count):
                    self.value(etype, depth + 1)
            return None
        raise _Bad("corrupt", f"unknown metadata value type {vtype} at byte {self.pos}: not a GGUF file; {FALLBACK}")


def _check_gguf(path: str, ctx: _Ctx) -> _Finding:
    f, size = _open_regular(path, os.path.dirname(os.path.abspath(path)))
    with f:
        r = _Reader(f, size, ctx)
        if r.take(4) != GGUF_MAGIC:
            return "corrupt", f"the file does not start with GGUF; {FALLBACK}"
        version = r.u32()
        if version not in (2, 3):
            return "unknown", f"GGUF version {version} is not one storwatch reads (2 and 3 are)"
        tensors, entries = r.u64(), r.u64()
        if tensors > _MAX_TENSORS or entries > _MAX_ENTRIES:
            return "corrupt", f"the header declares {tensors} tensors and {entries} metadata entries; {FALLBACK}"
        alignment = _DEFAULT_ALIGNMENT
        for _ in range(entries):
            key = r.string(keep=True)
            value = r.value(r.u32())
            if key == b"general.alignment" and value is not None:
                alignment = value
        if alignment <= 0 or alignment & (alignment - 1):
            return "corrupt", f"general.alignment is {alignment}, not a power of two; {FALLBACK}"
        end = 0
        for i in range(tensors):
            ctx.deadline.check()
            r.string()
            dims = r.u32()
            if dims > _MAX_DIMS:
                return "corrupt", f"tensor {i} has {dims} dimensions; {FALLBACK}"
            count = 1
            for _ in range(dims):
                count *= r.u64()
            ggml_type, offset = r.u32(), r.u64()
            if offset % alignment:
                return "corrupt", f"tensor {i} starts at {offset}, not a multiple of the alignment {alignment}"
            block = _GGML_BLOCKS.get(ggml_type)
            length = -(-count // block[0]) * block[1] if block is not None else 0
            end = max(end, offset + length)
        data_start = -(-r.pos // alignment) * alignment
        if data_start + end > size:
            return (
                "incomplete",
                f"the tensor data ends {data_start + end - size} bytes past the end of the file: it was truncated "
                f"during writing or copying; {FALLBACK}",
            )
    return _OK
