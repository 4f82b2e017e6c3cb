"""Identify a checkpoint's format from its layout and decide whether it is complete, incomplete or corrupt.

Formats: torch.save ZIP archives (``.pt``, ``.pth``, ``.bin``, Lightning ``.ckpt``), safetensors (single and sharded
with an index), torch Distributed Checkpoint, torchsnapshot, DeepSpeed, Hugging Face Trainer, Orbax and Megatron.
The cheap check reads only structure (a ZIP's end records and central directory, a safetensors header, marker files);
the deep check also reads every byte (ZIP CRC32s) and, where torch is installed, loads the checkpoint with it.

Symlinks are followed only while they stay inside the checkpoint's own directory: a checkpoint directory is often
writable by the job it belongs to, and the agent that checks it runs with more rights than the job.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO

VERDICTS = ("complete", "incomplete", "corrupt")
FORMATS = (
    "torch-zip",
    "safetensors",
    "safetensors-sharded",
    "torch-dcp",
    "torchsnapshot",
    "deepspeed",
    "hf-trainer",
    "orbax",
    "megatron",
)

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
SAFETENSORS_INDEX_SUFFIX = ".safetensors.index.json"
FALLBACK = "the last complete checkpoint should be used"

_CHUNK = 1 << 20
_MAX_SAFETENSORS_HEADER = 100_000_000  # the safetensors library refuses larger headers
_MAX_MARKER = 4096  # `latest`-style marker files hold one short line

_EOCD = struct.Struct("<4s4H2LH")
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")
_CENTRAL_HEADER = struct.Struct("<4s6H3L5H2L")
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")
_EOCD_SIG, _ZIP64_LOC_SIG, _ZIP64_EOCD_SIG = b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06"
_CENTRAL_SIG, _LOCAL_SIG = b"PK\x01\x02", b"PK\x03\x04"

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

_HF_STEP = re.compile(r"checkpoint-\d+")
_MEGATRON_STEP = re.compile(r"iter_(\d{7})")
_DEEPSPEED_STEP = re.compile(r"global_step(\d+)")
_DCP_METADATA = re.compile(r"(__\d+)?\.metadata")
_ORBAX_TMP = ".orbax-checkpoint-tmp-"
_ORBAX_MARKERS = ("commit_success.txt", "_CHECKPOINT_METADATA", "_METADATA", "manifest.ocdbt")
_MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"


@dataclass(frozen=True)
class CheckResult:
    path: str
    """The path as given."""
    format: str | None
    """One of FORMATS, or None when the layout is not a known checkpoint format."""
    verdict: str
    """``complete``, ``incomplete`` (a save that did not finish, or is still running) or ``corrupt`` (finished, then
    damaged, or never valid)."""
    reason: str
    """A sentence a person can act on."""
    size_bytes: int
    """Bytes of regular files (a directory: all files below it, symlinks not followed)."""
    mtime: float
    """Newest modification time, seconds since the epoch (a directory: of anything below it)."""
    deep: bool
    """Whether the deep check ran (every byte read)."""

    @property
    def complete(self) -> bool:
        return self.verdict == "complete"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_Finding = tuple[str, str]
_OK: _Finding = ("complete", "")
_RANK = {"complete": 0, "incomplete": 1, "corrupt": 2}


class _NotFollowed(Exception):
    """A symlink that leads out of the checkpoint's directory, or a path that is not a regular file."""


def _worst(a: _Finding, b: _Finding) -> _Finding:
    return b if _RANK[b[0]] > _RANK[a[0]] else a


def _inside(path: str, root: str) -> bool:
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    return real == real_root or os.path.commonpath([real, real_root]) == real_root


def _open_regular(path: str, root: str) -> tuple[BinaryIO, int]:
    """Open a regular file below ``root`` for reading, and its size; never a FIFO or device that could block."""
    if not _inside(path, root):
        raise _NotFollowed(f"{path} is a symlink leading out of {root}; it was not followed")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _NotFollowed(f"{path} is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


def _read_exact(f: BinaryIO, offset: int, length: int) -> bytes:
    f.seek(offset)
    return f.read(length)


# ---- identification ----------------------------------------------------------------------------------------------


def identify(path: str) -> str | None:
    """The checkpoint format of a file or directory, from names and a few leading bytes; None when unknown."""
    name = os.path.basename(os.path.normpath(path))
    if os.path.isdir(path):
        return _identify_dir(path, name)
    if not os.path.isfile(path):
        return None
    if name.endswith(SAFETENSORS_INDEX_SUFFIX):
        return "safetensors-sharded"
    if name.endswith(".safetensors"):
        return "safetensors"
    if name.endswith(TORCH_SUFFIXES):
        return "torch-zip"
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return None
    return "torch-zip" if head == _LOCAL_SIG else None


def _identify_dir(path: str, name: str) -> str | None:
    if _ORBAX_TMP in name:
        return "orbax"
    if _HF_STEP.fullmatch(name):
        return "hf-trainer"
    try:
        entries = set(os.listdir(path))
    except OSError:
        return None
    if _MEGATRON_STEP.fullmatch(name) or _MEGATRON_TRACKER in entries:
        return "megatron"
    if _DEEPSPEED_STEP.fullmatch(name) or any(_DEEPSPEED_STEP.fullmatch(e) for e in entries):
        return "deepspeed"
    if any(e.endswith(SAFETENSORS_INDEX_SUFFIX) for e in entries):
        return "safetensors-sharded"
    if any(_DCP_METADATA.fullmatch(e) or e.endswith(".distcp") or e == ".metadata.tmp" for e in entries):
        return "torch-dcp"
    if ".snapshot_metadata" in entries:
        return "torchsnapshot"
    if any(m in entries for m in _ORBAX_MARKERS):
        return "orbax"
    return None


# ---- entry point -------------------------------------------------------------------------------------------------


def check(path: str, deep: bool = False, now: float | None = None, settle_seconds: float = 60.0) -> CheckResult:
    """Check one checkpoint file or directory. ``now`` (seconds since the epoch) is injected for the settle time."""
    fmt = identify(path)
    size, mtime = _footprint(path)
    if not os.path.lexists(path):
        finding: _Finding = ("incomplete", f"{path} does not exist; {FALLBACK}")
    elif fmt is None:
        finding = (
            "corrupt",
            f"{path} is not a recognised checkpoint format (torch.save ZIP, safetensors, DCP, "
            "torchsnapshot, DeepSpeed, Hugging Face Trainer, Orbax or Megatron)",
        )
    else:
        when = time.time() if now is None else now
        try:
            finding = _CHECKS[fmt](path, deep, when, settle_seconds)
        except _NotFollowed as err:
            finding = ("incomplete", f"{err}: the checkpoint cannot be verified where it lies")
        except OSError as err:
            finding = (
                "corrupt",
                f"reading {err.filename or path} failed: {err.strerror or err}; the storage may be "
                f"failing or the file was removed while being checked; {FALLBACK}",
            )
    return CheckResult(path, fmt, finding[0], finding[1] or "all checks passed", size, mtime, deep)


def _footprint(path: str) -> tuple[int, float]:
    try:
        st = os.stat(path)
    except OSError:
        return 0, 0.0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size, st.st_mtime
    size, mtime = 0, st.st_mtime
    for entry_st in _walk_stats(path):
        mtime = max(mtime, entry_st.st_mtime)
        if stat.S_ISREG(entry_st.st_mode):
            size += entry_st.st_size
    return size, mtime


def _walk_stats(root: str) -> Iterator[os.stat_result]:
    """lstat of everything below ``root``; symlinks are reported, never followed."""
    stack = [root]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    yield st
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue


def _walk_files(root: str, max_depth: int = 3) -> Iterator[str]:
    stack = [(root, 0)]
    while stack:
        top, depth = stack.pop()
        try:
            entries = sorted(os.scandir(top), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if depth < max_depth:
                    stack.append((entry.path, depth + 1))
            elif entry.is_file(follow_symlinks=True) or entry.is_symlink():
                yield entry.path


# ---- torch.save ZIP ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ZipEntry:
    name: str
    method: int
    crc: int
    compressed_size: int
    size: int
    header_offset: int


def _check_torch_zip(path: str, deep: bool, now: float, settle: float) -> _Finding:
    root = os.path.dirname(os.path.abspath(path))
    f, size = _open_regular(path, root)
    with f:
        finding, entries = _zip_structure(f, size)
        if finding[0] != "complete" or not deep:
            return finding
        finding = _zip_crcs(f, entries)
    if finding[0] == "complete":
        finding = _torch_load(path)
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
    if cd_offset + cd_size > cd_end_limit:
        return _corrupt_zip(f"the central directory ({cd_size} bytes at {cd_offset}) runs past its end record"), []
    entries, problem = _parse_central_directory(_read_exact(f, cd_offset, cd_size), count, cd_offset)
    if problem:
        return _corrupt_zip(problem), []
    if not any(e.name == "data.pkl" or (e.name.endswith("/data.pkl") and e.name.count("/") == 1) for e in entries):
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


def _zip_crcs(f: BinaryIO, entries: list[_ZipEntry]) -> _Finding:
    for entry in sorted(entries, key=lambda e: e.header_offset):
        header = _read_exact(f, entry.header_offset, _LOCAL_HEADER.size)
        if len(header) < _LOCAL_HEADER.size or header[:4] != _LOCAL_SIG:
            return _corrupt_zip(f"the local header of {entry.name!r} is missing")
        name_len, extra_len = _LOCAL_HEADER.unpack(header)[9:11]
        f.seek(entry.header_offset + _LOCAL_HEADER.size + name_len + extra_len)
        crc, remaining = 0, entry.compressed_size
        inflate = zlib.decompressobj(-15) if entry.method == 8 else None
        if entry.method not in (0, 8):
            return (
                "corrupt",
                f"entry {entry.name!r} uses ZIP compression method {entry.method}, which torch never "
                "writes: the file is not what it claims to be",
            )
        while remaining:
            chunk = f.read(min(_CHUNK, remaining))
            if not chunk:
                return _corrupt_zip(f"the data of {entry.name!r} ends early")
            remaining -= len(chunk)
            crc = zlib.crc32(inflate.decompress(chunk) if inflate else chunk, crc)
        if inflate is not None:
            crc = zlib.crc32(inflate.flush(), crc)
        # torch.serialization.set_crc32_options(False) writes 0 for every entry: nothing to compare against.
        if crc != entry.crc and (entry.crc != 0 or entry.size == 0):
            return (
                "corrupt",
                f"CRC32 mismatch in entry {entry.name!r} (stored {entry.crc:08x}, computed {crc:08x}): "
                "the data changed after it was written (a failing disk, memory or network path, or an "
                f"overwrite in place); {FALLBACK}",
            )
    return _OK


def _torch_load(path: str) -> _Finding:
    try:
        import torch
    except ImportError:
        return "complete", "every entry's CRC32 matches; torch is not installed, so torch.load was not tried"
    try:
        torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    except Exception as err:  # torch raises many types for a damaged archive
        if "Weights only load failed" in str(err):
            # An object outside torch's allow-list (Lightning hyper-parameters, custom classes) is not damage.
            return _OK
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return "corrupt", f"torch.load failed: {first[:300]}; {FALLBACK}"
    return _OK


# ---- safetensors -------------------------------------------------------------------------------------------------


def _check_safetensors(path: str, deep: bool, now: float, settle: float) -> _Finding:
    finding, _ = _safetensors_file(path, os.path.dirname(os.path.abspath(path)), deep)
    return finding


def _safetensors_file(path: str, root: str, deep: bool) -> tuple[_Finding, set[str]]:
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
        raw = f.read(header_len)
        finding, names, data_end = _safetensors_header(raw)
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
        if deep:
            # safetensors carries no checksums: the deep check proves every byte can still be read.
            while f.read(_CHUNK):
                pass
    return _OK, names


def _safetensors_header(raw: bytes) -> tuple[_Finding, set[str], int]:
    def bad(problem: str) -> tuple[_Finding, set[str], int]:
        return ("corrupt", f"the safetensors header is invalid: {problem}; {FALLBACK}"), set(), 0

    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return bad("it is not JSON")
    if not isinstance(header, dict):
        return bad("it is not a JSON object")
    spans: list[tuple[int, int, str]] = []
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(spec, dict):
            return bad(f"tensor {name!r} is not an object")
        dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            return bad(f"tensor {name!r} has no valid shape")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]
        ):
            return bad(f"tensor {name!r} has no valid data_offsets")
        if not isinstance(dtype, str):
            return bad(f"tensor {name!r} has no dtype")
        width = _SAFETENSORS_DTYPE_BYTES.get(dtype)
        if width is not None:
            count = 1
            for d in shape:
                count *= d
            if count * width != offsets[1] - offsets[0]:
                return bad(
                    f"tensor {name!r} spans {offsets[1] - offsets[0]} bytes, its {dtype}{shape} needs {count * width}"
                )
        spans.append((offsets[0], offsets[1], name))
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            return bad(f"tensor {name!r} starts at {begin}, not where the previous one ended ({end})")
        end = stop
    return _OK, {s[2] for s in spans}, end


def _check_safetensors_sharded(path: str, deep: bool, now: float, settle: float) -> _Finding:
    if os.path.isdir(path):
        root = path
        indexes = sorted(e for e in os.listdir(path) if e.endswith(SAFETENSORS_INDEX_SUFFIX))
        index_path = os.path.join(path, "model" + SAFETENSORS_INDEX_SUFFIX)
        if not os.path.exists(index_path):
            index_path = os.path.join(path, indexes[0])
    else:
        root, index_path = os.path.dirname(os.path.abspath(path)), path
    f, size = _open_regular(index_path, root)
    with f:
        raw = f.read(min(size, _MAX_SAFETENSORS_HEADER))
    try:
        index = json.loads(raw)
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError("weight_map is not an object of file names")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        return (
            "corrupt",
            f"the index {os.path.basename(index_path)} is not valid ({err}): it was truncated or damaged; {FALLBACK}",
        )
    wanted: dict[str, set[str]] = {}
    for tensor, shard in weight_map.items():
        wanted.setdefault(shard, set()).add(tensor)
    finding = _OK
    for shard, tensors in sorted(wanted.items()):
        shard_path = os.path.join(root, shard)
        if os.path.isabs(shard) or os.path.normpath(shard).startswith(".."):
            return "corrupt", f"the index names shard {shard!r} outside the checkpoint directory"
        if not os.path.lexists(shard_path):
            finding = _worst(
                finding,
                (
                    "incomplete",
                    f"shard {shard} named in the index is missing: the save or copy was interrupted; {FALLBACK}",
                ),
            )
            continue
        shard_finding, names = _safetensors_file(shard_path, root, deep)
        if shard_finding[0] == "complete" and not tensors <= names:
            missing = sorted(tensors - names)
            shard_finding = (
                "corrupt",
                f"the index places {missing[0]!r} in {shard}, which does not hold it: the "
                "shard and the index come from different saves",
            )
        if shard_finding[0] != "complete":
            finding = _worst(finding, (shard_finding[0], f"shard {shard}: {shard_finding[1]}"))
    return finding


# ---- torch Distributed Checkpoint ------------------------------------------------------------------------------


def _check_dcp(path: str, deep: bool, now: float, settle: float) -> _Finding:
    entries = set(os.listdir(path))
    metadata = (
        ".metadata"
        if ".metadata" in entries
        else next((e for e in sorted(entries) if _DCP_METADATA.fullmatch(e)), None)
    )
    if metadata is None:
        tmp = " (only .metadata.tmp: it stopped while writing the metadata)" if ".metadata.tmp" in entries else ""
        return (
            "incomplete",
            f"no .metadata file{tmp}: torch.distributed.checkpoint writes it last, after every rank's "
            f"data, so this save did not finish; {FALLBACK}",
        )
    f, size = _open_regular(os.path.join(path, metadata), path)
    f.close()
    if size == 0:
        return "corrupt", f"{metadata} is empty although DCP renames it into place only when written; {FALLBACK}"
    if not deep:
        return _OK
    try:
        from torch.distributed.checkpoint.filesystem import FileSystemReader
    except ImportError:
        return "complete", "the .metadata file is present; torch is not installed, so the data files were not checked"
    try:
        storage = FileSystemReader(path).read_metadata().storage_data
    except Exception as err:  # an unpickling failure has many types
        return "corrupt", f"{metadata} cannot be read by torch ({type(err).__name__}: {err}); {FALLBACK}"
    sizes: dict[str, int] = {}
    for info in storage.values():
        rel = str(info.relative_path)
        if rel not in sizes:
            data_path = os.path.join(path, rel)
            if not os.path.lexists(data_path):
                return (
                    "incomplete",
                    f"{rel}, named in {metadata}, is missing: the directory was copied or cleaned "
                    f"up only in part; {FALLBACK}",
                )
            data, sizes[rel] = _open_regular(data_path, path)
            data.close()
        if info.offset + info.length > sizes[rel]:
            return (
                "incomplete",
                f"{rel} has {sizes[rel]} bytes but {metadata} places data up to "
                f"{info.offset + info.length}: the file was truncated; {FALLBACK}",
            )
    return _OK


# ---- layouts with marker files -------------------------------------------------------------------------------


def _check_torchsnapshot(path: str, deep: bool, now: float, settle: float) -> _Finding:
    if ".snapshot_metadata" not in os.listdir(path):
        return (
            "incomplete",
            f"no .snapshot_metadata: torchsnapshot writes it last, so this snapshot did not finish; {FALLBACK}",
        )
    return _OK


def _check_orbax(path: str, deep: bool, now: float, settle: float) -> _Finding:
    name = os.path.basename(os.path.normpath(path))
    if _ORBAX_TMP in name:
        return (
            "incomplete",
            "this is an Orbax temporary directory: Orbax renames it to its step name when the save "
            f"commits, so the save did not finish (or is still running); {FALLBACK}",
        )
    # commit_success.txt is the commit on object stores; on a POSIX filesystem the rename above is.
    return _OK


def _read_marker(path: str, root: str) -> str | None:
    try:
        f, _ = _open_regular(path, root)
    except FileNotFoundError:
        return None
    with f:
        return f.read(_MAX_MARKER).decode("utf-8", "replace").strip()


def _check_members(root: str, deep: bool) -> tuple[_Finding, int]:
    """Check every checkpoint file below ``root`` (torch.save, safetensors); the worst finding and how many."""
    finding, count = _OK, 0
    for file_path in _walk_files(root):
        fmt = identify(file_path)
        rel = os.path.relpath(file_path, root)
        if fmt not in ("torch-zip", "safetensors", "safetensors-sharded") or not rel.endswith(
            (*TORCH_SUFFIXES, ".safetensors", SAFETENSORS_INDEX_SUFFIX)
        ):
            continue
        if not _inside(file_path, root):
            return ("incomplete", f"{rel} is a symlink leading out of {root}; it was not followed"), count
        count += 1
        member = (
            _CHECKS[fmt](file_path, deep, 0.0, 0.0)
            if fmt != "safetensors"
            else _safetensors_file(file_path, root, deep)[0]
        )
        if member[0] != "complete":
            finding = _worst(finding, (member[0], f"{rel}: {member[1]}"))
    return finding, count


def _check_step_dir(
    path: str, tracker: str, tracked: str | None, step: int, parse: re.Pattern[str], what: str, deep: bool
) -> _Finding:
    if tracked is None:
        return (
            "incomplete",
            f"{tracker} is missing next to this step: {what} writes it after a save finishes, so "
            f"this save did not finish; {FALLBACK}",
        )
    match = parse.fullmatch(tracked)
    tracked_step = int(match.group(1)) if match else int(tracked) if tracked.isdigit() else -1
    if tracked_step < step:
        return (
            "incomplete",
            f"{tracker} names {tracked!r}, not this step or a later one: {what} writes it when a "
            f"save finishes, so this save did not finish (or is still running); {FALLBACK}",
        )
    finding, count = _check_members(path, deep)
    if count == 0 and not any(_DCP_METADATA.fullmatch(e) for e in os.listdir(path)):
        return "incomplete", f"no checkpoint files in the step directory: the save did not write them; {FALLBACK}"
    return finding


def _check_tracked_root(path: str, tracker: str, dir_for: Any, deep: bool, what: str) -> _Finding:
    tracked = _read_marker(os.path.join(path, tracker), path)
    if tracked is None:
        return (
            "incomplete",
            f"no {tracker}: {what} writes it after the first save finishes, so no save has finished here",
        )
    step_dir = os.path.join(path, dir_for(tracked))
    if not os.path.isdir(step_dir) or not _inside(step_dir, path):
        return (
            "incomplete",
            f"{tracker} names {tracked!r} but {os.path.basename(step_dir)} is missing: the "
            f"directory was cleaned up or copied in part; {FALLBACK}",
        )
    return _CHECKS[what.lower()](step_dir, deep, 0.0, 0.0)


def _check_deepspeed(path: str, deep: bool, now: float, settle: float) -> _Finding:
    name = os.path.basename(os.path.normpath(path))
    match = _DEEPSPEED_STEP.fullmatch(name)
    if match is None:
        return _check_tracked_root(path, "latest", lambda tag: tag, deep, "DeepSpeed")
    parent = os.path.dirname(os.path.abspath(path))
    tracked = _read_marker(os.path.join(parent, "latest"), parent)
    return _check_step_dir(path, "latest", tracked, int(match.group(1)), _DEEPSPEED_STEP, "DeepSpeed", deep)


def _megatron_dir(tracked: str) -> str:
    return f"iter_{int(tracked):07d}" if tracked.isdigit() else tracked


def _check_megatron(path: str, deep: bool, now: float, settle: float) -> _Finding:
    name = os.path.basename(os.path.normpath(path))
    match = _MEGATRON_STEP.fullmatch(name)
    if match is None:
        return _check_tracked_root(path, _MEGATRON_TRACKER, _megatron_dir, deep, "Megatron")
    parent = os.path.dirname(os.path.abspath(path))
    tracked = _read_marker(os.path.join(parent, _MEGATRON_TRACKER), parent)
    finding = _check_step_dir(path, _MEGATRON_TRACKER, tracked, int(match.group(1)), _MEGATRON_STEP, "Megatron", deep)
    if finding[0] == "complete" and identify_dcp(path):
        finding = _check_dcp(path, deep, now, settle)
    return finding


def identify_dcp(path: str) -> bool:
    """Whether a directory holds torch Distributed Checkpoint files (Megatron's torch_dist format does)."""
    try:
        return any(_DCP_METADATA.fullmatch(e) or e.endswith(".distcp") for e in os.listdir(path))
    except OSError:
        return False


def _check_hf_trainer(path: str, deep: bool, now: float, settle: float) -> _Finding:
    if not os.path.exists(os.path.join(path, "trainer_state.json")):
        return (
            "incomplete",
            "no trainer_state.json: the Hugging Face Trainer writes it at the end of a save, so this "
            f"save did not finish (or is still running); {FALLBACK}",
        )
    newest = max((st.st_mtime for st in _walk_stats(path)), default=os.stat(path).st_mtime)
    newest = max(newest, os.stat(path).st_mtime)
    age = now - newest
    if age < settle:
        return (
            "incomplete",
            f"something in the directory changed {max(age, 0.0):.0f} s ago, less than the "
            f"{settle:.0f} s settle time: the save may still be running; check again later",
        )
    finding, _ = _check_members(path, deep)
    return finding


_CHECKS: dict[str, Callable[[str, bool, float, float], _Finding]] = {
    "torch-zip": _check_torch_zip,
    "safetensors": _check_safetensors,
    "safetensors-sharded": _check_safetensors_sharded,
    "torch-dcp": _check_dcp,
    "torchsnapshot": _check_torchsnapshot,
    "deepspeed": _check_deepspeed,
    "hf-trainer": _check_hf_trainer,
    "orbax": _check_orbax,
    "megatron": _check_megatron,
}
