"""Identify a checkpoint's format from its layout and decide whether it is complete, incomplete, corrupt or unknown.

Formats: torch.save ZIP archives (``.pt``, ``.pth``, ``.bin``, Lightning ``.ckpt``), safetensors (single and sharded
with an index), torch Distributed Checkpoint (also Megatron's torch_dist), torchsnapshot, DeepSpeed, Hugging Face
Trainer, Orbax and Megatron.

The cheap check reads structure and metadata, never bulk data: a ZIP's end records and central directory and its
``data.pkl`` (every storage it names must be in the archive with the bytes it needs), a safetensors header, a DCP
``.metadata`` or torchsnapshot manifest (every shard must hold the extent the metadata places in it, so a shard cut
short is ``incomplete``), marker and tracker files. The deep check also reads every byte (ZIP CRC32s, inflated in
bounded chunks) and, where torch is installed, loads a torch.save file with ``weights_only=True`` in a separate,
short-lived, resource-limited process (``deep.py``).

Trust: checkpoint files are written by jobs the agent does not trust. Nothing here unpickles with the standard
unpickler or imports torch: pickles (``data.pkl``, DCP ``.metadata``) are read by the restricted machine in
``pickles.py``, which refuses every global outside its allow-lists; a file that names another global is ``corrupt``.
Every parse is bounded (``limits.DeepLimits``); past a bound the verdict names the bound. Symlinks are followed only
while they stay inside the checkpoint's own directory; FIFOs and devices are never opened for reading.

Verdicts: ``complete``; ``incomplete`` (a save that did not finish, or a file cut short); ``corrupt`` (finished, then
damaged, never valid, or carrying a refused global); ``unknown`` (not a checkpoint, or a check stopped at a limit that
says nothing against the checkpoint). ``check`` never raises: an exception while checking is a ``corrupt`` verdict
naming it.

What cannot be checked cheaply: Orbax writes tensorstore/OCDBT chunks whose layout only tensorstore knows, so an
Orbax step is judged by its commit (the temporary directory renamed, ``commit_success.txt`` on object stores) and
the verdict's reason says that its chunks were not compared.
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
from functools import lru_cache
from typing import Any, BinaryIO

from storwatch.checkpoints import pickles
from storwatch.checkpoints.deep import torch_load_in_child
from storwatch.checkpoints.limits import MIB, Deadline, DeepLimits, LimitReached

VERDICTS = ("complete", "incomplete", "corrupt", "unknown")
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
NOT_A_CHECKPOINT = (
    "is not a recognised checkpoint format (torch.save ZIP, safetensors, DCP, torchsnapshot, DeepSpeed, "
    "Hugging Face Trainer, Orbax or Megatron)"
)
DEFAULT_LIMITS = DeepLimits()

_CHUNK = 1 << 20
_MAX_SAFETENSORS_HEADER = 100_000_000  # the safetensors library refuses larger headers
_MAX_MARKER = 4096  # `latest`-style marker files hold one short line
_MAX_CENTRAL_DIRECTORY = 16 * MIB  # about 350,000 entries: far more tensors than any torch.save writes
_MAX_DIR_ENTRIES = 100_000  # names read from one directory to identify it
_RATIO_FLOOR = 1 * MIB  # an entry's ratio is judged once it has inflated this much
_WALK_CLOCK_EVERY = 1024

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
_TORCH_DTYPE_BYTES = {
    "torch.float64": 8,
    "torch.float32": 4,
    "torch.float16": 2,
    "torch.bfloat16": 2,
    "torch.int64": 8,
    "torch.int32": 4,
    "torch.int16": 2,
    "torch.int8": 1,
    "torch.uint8": 1,
    "torch.bool": 1,
    "torch.complex64": 8,
    "torch.complex128": 16,
}

# ASCII digits only, and few of them: str.isdigit() and \d accept digits int() cannot read ('²') or reads slowly.
_HF_STEP = re.compile(r"checkpoint-\d{1,18}", re.ASCII)
_MEGATRON_STEP = re.compile(r"iter_(\d{7})", re.ASCII)
_DEEPSPEED_STEP = re.compile(r"global_step(\d{1,18})", re.ASCII)
_NUMBER = re.compile(r"\d{1,18}", re.ASCII)
_DCP_METADATA = re.compile(r"(__\d{1,9})?\.metadata", re.ASCII)
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
    """``complete``, ``incomplete`` (a save that did not finish, or is still running), ``corrupt`` (finished, then
    damaged, never valid, or carrying a refused pickle global) or ``unknown`` (not a checkpoint, or a check that
    stopped at a limit)."""
    reason: str
    """A sentence a person can act on."""
    size_bytes: int
    """Bytes of regular files (a directory: all files below it, symlinks not followed)."""
    mtime: float
    """Newest modification time, seconds since the epoch (a directory: of anything below it)."""
    deep: bool
    """Whether the deep check ran (every byte read)."""
    limit: str | None = None
    """The DeepLimits field that stopped the check, when one did (a fixed keyword, fit for a label)."""
    error: str | None = None
    """The exception's type when checking raised one (the verdict is then ``corrupt``)."""

    @property
    def complete(self) -> bool:
        return self.verdict == "complete"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_Finding = tuple[str, str]
_OK: _Finding = ("complete", "")
_RANK = {"complete": 0, "unknown": 1, "incomplete": 2, "corrupt": 3}


class _NotFollowed(Exception):
    """A symlink that leads out of the checkpoint's directory."""


class _NotRegular(Exception):
    """A path that is not a regular file (a FIFO, a device, a socket): never opened for reading."""


class _Bad(Exception):
    """A finding reached deep inside a check: unwinds to ``check`` with its verdict and reason."""

    def __init__(self, verdict: str, reason: str) -> None:
        super().__init__(reason)
        self.finding: _Finding = (verdict, reason)


@dataclass
class _Ctx:
    """What one call of ``check`` carries through its helpers."""

    deep: bool
    now: float
    settle: float
    limits: DeepLimits
    deadline: Deadline


def _worst(a: _Finding, b: _Finding) -> _Finding:
    return b if _RANK[b[0]] > _RANK[a[0]] else a


def _inside(path: str, root: str) -> bool:
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    return real == real_root or os.path.commonpath([real, real_root]) == real_root


def _open_regular(path: str, root: str) -> tuple[BinaryIO, int]:
    """Open a regular file below ``root`` for reading, and its size; never a FIFO or device that could block."""
    if not _inside(path, root):
        raise _NotFollowed(f"{path} is a symlink leading out of {root}; it was not followed")
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _NotRegular(f"{path} is not a regular file ({_file_type(st.st_mode)}); it was not read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


def _file_type(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _read_exact(f: BinaryIO, offset: int, length: int) -> bytes:
    f.seek(offset)
    return f.read(length)


def _dir_names(path: str) -> set[str]:
    """Up to ``_MAX_DIR_ENTRIES`` names of a directory (enough to recognise any layout)."""
    names: set[str] = set()
    with os.scandir(path) as it:
        for entry in it:
            names.add(entry.name)
            if len(names) >= _MAX_DIR_ENTRIES:
                break
    return names


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
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return None
    try:
        head = os.read(fd, 4) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return None
    finally:
        os.close(fd)
    return "torch-zip" if head == _LOCAL_SIG else None


def _identify_dir(path: str, name: str) -> str | None:
    if _ORBAX_TMP in name:
        return "orbax"
    if _HF_STEP.fullmatch(name):
        return "hf-trainer"
    try:
        entries = _dir_names(path)
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


def check(
    path: str,
    deep: bool = False,
    now: float | None = None,
    settle_seconds: float = 60.0,
    limits: DeepLimits | None = None,
) -> CheckResult:
    """Check one checkpoint file or directory; never raises. ``now`` (seconds since the epoch) is injected for the
    settle time; ``limits`` bounds the check (the defaults are safe for an agent reading hostile files)."""
    limits = limits or DEFAULT_LIMITS
    ctx = _Ctx(deep, time.time() if now is None else now, settle_seconds, limits, limits.deadline())
    fmt: str | None = None
    size, mtime = 0, 0.0
    limit: str | None = None
    error: str | None = None
    try:
        fmt = identify(path)
        size, mtime = _footprint(path, ctx.deadline)
        finding = _check_format(path, fmt, ctx)
    except LimitReached as err:
        finding, limit = (err.verdict, str(err)), err.limit
    except _Bad as err:
        finding = err.finding
    except MemoryError:
        finding, error = (
            ("unknown", "the check ran out of memory; it says nothing against the checkpoint"),
            "MemoryError",
        )
    except Exception as err:
        error = type(err).__name__
        finding = ("corrupt", f"checking it failed ({error}: {_describe(err)}); {FALLBACK}")
    return CheckResult(path, fmt, finding[0], finding[1] or "all checks passed", size, mtime, deep, limit, error)


def _describe(err: BaseException) -> str:
    try:
        text = str(err)
    except Exception:  # a str() that fails is itself worth no more than its type
        text = ""
    return text[:300] or type(err).__name__


def _check_format(path: str, fmt: str | None, ctx: _Ctx) -> _Finding:
    if not os.path.lexists(path):
        return "incomplete", f"{path} does not exist; {FALLBACK}"
    if fmt is None:
        try:
            st = os.stat(path)
        except OSError as err:
            return "unknown", f"{path} cannot be read ({err.strerror or err}): no checkpoint found"
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            return "unknown", f"{path} is {_file_type(st.st_mode)}, not a checkpoint; it was not read"
        return "unknown", f"{path} {NOT_A_CHECKPOINT}: no checkpoint found"
    try:
        return _CHECKS[fmt](path, ctx)
    except _NotFollowed as err:
        return "incomplete", f"{err}: the checkpoint cannot be verified where it lies"
    except _NotRegular as err:
        return "unknown", f"{err}: not a checkpoint"
    except OSError as err:
        return (
            "corrupt",
            f"reading {err.filename or path} failed: {err.strerror or err}; the storage may be "
            f"failing or the file was removed while being checked; {FALLBACK}",
        )


def _footprint(path: str, deadline: Deadline) -> tuple[int, float]:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return 0, 0.0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size, st.st_mtime
    size, mtime = 0, st.st_mtime
    for entry_st in _walk_stats(path, deadline):
        mtime = max(mtime, entry_st.st_mtime)
        if stat.S_ISREG(entry_st.st_mode):
            size += entry_st.st_size
    return size, mtime


def _walk_stats(root: str, deadline: Deadline) -> Iterator[os.stat_result]:
    """lstat of everything below ``root``; symlinks are reported, never followed."""
    stack = [root]
    seen = 0
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    seen += 1
                    if not seen % _WALK_CLOCK_EVERY:
                        deadline.check()
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    yield st
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue


def _walk_files(root: str, deadline: Deadline, max_depth: int = 3) -> Iterator[str]:
    stack = [(root, 0)]
    seen = 0
    while stack:
        top, depth = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = []
                for entry in it:
                    seen += 1
                    if not seen % _WALK_CLOCK_EVERY:
                        deadline.check()
                    entries.append(entry)
        except OSError:
            continue
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.is_dir(follow_symlinks=False):
                if depth < max_depth:
                    stack.append((entry.path, depth + 1))
            elif entry.is_file(follow_symlinks=False) or entry.is_symlink():
                yield entry.path


# ---- bounded JSON ------------------------------------------------------------------------------------------------

_JSON_TOKENS = re.compile(rb'[\[\]{}"\\]')


def json_depth_exceeds(raw: bytes, max_depth: int) -> bool:
    """Whether a JSON document nests deeper than ``max_depth``, found in one linear pass before any parse (a parser
    that recurses would fail on 200,000 nested ``[`` only after allocating for them)."""
    depth = 0
    in_string = False
    escaped_at = -1
    for m in _JSON_TOKENS.finditer(raw):
        pos = m.start()
        if pos == escaped_at:
            continue
        token = raw[pos]
        if in_string:
            if token == 0x5C:  # a backslash escapes the next character
                escaped_at = pos + 1
            elif token == 0x22:
                in_string = False
        elif token == 0x22:
            in_string = True
        elif token in (0x5B, 0x7B):
            depth += 1
            if depth > max_depth:
                return True
        elif token in (0x5D, 0x7D):
            depth -= 1
    return False


def _load_json(raw: bytes, what: str, ctx: _Ctx) -> Any:
    """Parse a JSON document within the limits; _Bad (corrupt) when it is not JSON or nests too deeply."""
    limits = ctx.limits
    if len(raw) > limits.max_json_bytes:
        raise LimitReached(
            "max_json_bytes",
            f"{what} is {len(raw):,} bytes of JSON, over the limit of {limits.max_json_bytes:,} "
            "(checkpoints.deep_max_json_bytes): it was not parsed",
        )
    if json_depth_exceeds(raw, limits.max_json_depth):
        raise _Bad(
            "corrupt",
            f"{what} nests deeper than {limits.max_json_depth} levels (checkpoints.deep_max_json_depth), "
            f"which no checkpoint format writes: it is damaged or hostile; it was not parsed; {FALLBACK}",
        )
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise _Bad("corrupt", f"{what} is not valid JSON ({_describe(err)[:120]}); {FALLBACK}") from None


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
        finding = _check_data_pkl(f, size, entries, ctx, budget)
        if finding[0] != "complete" or not ctx.deep:
            return finding
        finding = _zip_crcs(f, size, entries, ctx, budget)
    if finding[0] == "complete" and ctx.limits.torch_load:
        finding = torch_load_in_child(path, size, ctx.limits, ctx.deadline, _extra_torch_globals(ctx.limits))
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


@lru_cache(maxsize=8)
def _torch_resolver(extra: tuple[str, ...]) -> Callable[[str], pickles.Global | None]:
    base = {**pickles.TORCH_WEIGHTS_ONLY, **pickles.HARMLESS_DATA}
    for table in (pickles.DEEPSPEED, pickles.MEGATRON, pickles.HF_TRAINER):
        base.update(table)
    return pickles.with_extra(base, extra)


@lru_cache(maxsize=8)
def _dcp_resolver(extra: tuple[str, ...]) -> Callable[[str], pickles.Global | None]:
    return pickles.with_extra(pickles.DCP_METADATA, extra)


def _extra_torch_globals(limits: DeepLimits) -> tuple[str, ...]:
    """Allowed names beyond torch's own list, for the torch-load child (which stands an inert class in for each)."""
    names = [*pickles.HARMLESS_DATA, *pickles.DEEPSPEED, *pickles.MEGATRON, *pickles.HF_TRAINER]
    names += [n for n in limits.allowed_globals if not n.endswith(".*")]
    return tuple(n for n in names if n not in pickles.TORCH_WEIGHTS_ONLY)


def _refused(what: str, err: pickles.RefusedGlobal) -> _Finding:
    return (
        "corrupt",
        f"{what} {err}: nothing was run, but a checkpoint whose pickle reaches for {err.name} may carry a code "
        f"payload and must not be loaded; if {err.name} is a harmless class your checkpoints carry, add it to "
        f"checkpoints.allowed_globals; {FALLBACK}",
    )


def _check_data_pkl(
    f: BinaryIO, file_size: int, entries: list[_ZipEntry], ctx: _Ctx, budget: _InflateBudget
) -> _Finding:
    """Run data.pkl through the restricted pickle machine: every global allowed, every storage it names present in
    the archive with exactly the bytes it needs."""
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
            bytes(buf), _torch_resolver(limits.allowed_globals), storage, limits.max_pickle_objects, ctx.deadline
        )
    except pickles.RefusedGlobal as err:
        return _refused("data.pkl", err)
    except pickles.PickleError as err:
        return "corrupt", f"data.pkl is not a valid torch.save pickle: {err}; {FALLBACK}"
    return _OK


def _is_data_pkl(name: str) -> bool:
    return name == "data.pkl" or (name.endswith("/data.pkl") and name.count("/") == 1)


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


def _read_all(f: BinaryIO, ctx: _Ctx, length: int | None = None) -> int:
    """Read a file (or ``length`` bytes of it) in bounded chunks; the bytes read."""
    total = 0
    while length is None or total < length:
        chunk = f.read(_CHUNK if length is None else min(_CHUNK, length - total))
        if not chunk:
            break
        total += len(chunk)
        if not (total // _CHUNK) % 16:
            ctx.deadline.check()
    return total


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


def _safe_relative(name: str) -> bool:
    """A path from metadata that stays inside the checkpoint directory."""
    return bool(name) and "\0" not in name and not os.path.isabs(name) and ".." not in name.split("/")


# ---- torch Distributed Checkpoint ------------------------------------------------------------------------------


def _check_dcp(path: str, ctx: _Ctx) -> _Finding:
    entries = _dir_names(path)
    # Without rank coordination each rank writes its own __N.metadata for its own files.
    ranks = sorted(e for e in entries if _DCP_METADATA.fullmatch(e))
    metadata = [".metadata"] if ".metadata" in entries else ranks
    if not metadata:
        tmp = " (only .metadata.tmp: it stopped while writing the metadata)" if ".metadata.tmp" in entries else ""
        return (
            "incomplete",
            f"no .metadata file{tmp}: torch.distributed.checkpoint writes it last, after every rank's "
            f"data, so this save did not finish; {FALLBACK}",
        )
    finding = _OK
    for name in metadata:
        finding = _worst(finding, _check_dcp_metadata(path, name, ctx))
    return finding


def _read_bounded(path: str, root: str, limit: int, limit_name: str, what: str) -> bytes:
    f, size = _open_regular(path, root)
    with f:
        if size > limit:
            raise LimitReached(
                limit_name,
                f"{what} is {size:,} bytes, over the limit of {limit:,} (checkpoints.deep_{limit_name}): it was not "
                "read, so the data files were not compared with it",
            )
        return f.read(size)


def _check_dcp_metadata(path: str, name: str, ctx: _Ctx) -> _Finding:
    data = _read_bounded(os.path.join(path, name), path, ctx.limits.max_pickle_bytes, "max_pickle_bytes", name)
    if not data:
        return "corrupt", f"{name} is empty although DCP renames it into place only when written; {FALLBACK}"
    if data[:1] == b"{":
        # torch's Hugging Face storage writer keeps a safetensors index in .metadata instead of a pickle.
        index = _load_json(data, name, ctx)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            return "corrupt", f"{name} is JSON without a weight_map of file names; {FALLBACK}"
        return _check_weight_map(path, weight_map, name, ctx)
    try:
        metadata = pickles.load(
            data, _dcp_resolver(ctx.limits.allowed_globals), None, ctx.limits.max_pickle_objects, ctx.deadline
        )
    except pickles.RefusedGlobal as err:
        return _refused(name, err)
    except pickles.PickleError as err:
        return "corrupt", f"{name} is not a valid DCP metadata pickle: {err}; {FALLBACK}"
    extents = _dcp_extents(metadata, name)
    if extents is None:
        return (
            "complete",
            f"{name} holds no file-system storage table (a storage layer storwatch does not know wrote it): only "
            "its presence was checked",
        )
    for rel, end in sorted(extents.items()):
        data_path = os.path.join(path, rel)
        if not os.path.lexists(data_path):
            return (
                "incomplete",
                f"{rel}, named in {name}, is missing: the save did not finish or the directory was copied or "
                f"cleaned up only in part; {FALLBACK}",
            )
        f, size = _open_regular(data_path, path)
        with f:
            if end > size:
                return (
                    "incomplete",
                    f"{rel} has {size:,} bytes but {name} places data up to {end:,}: the file was truncated; "
                    f"{FALLBACK}",
                )
            if ctx.deep and _read_all(f, ctx) < end:
                return "incomplete", f"{rel} ended before {end:,} bytes while being read; {FALLBACK}"
    return _OK


def _dcp_extents(metadata: Any, name: str) -> dict[str, int] | None:
    """The end of the last byte the metadata places in each data file (relative path -> offset + length)."""

    def bad(problem: str) -> _Bad:
        return _Bad("corrupt", f"{name} is not DCP metadata as torch writes it: {problem}; {FALLBACK}")

    if not isinstance(metadata, pickles.Record) or not metadata.kind.endswith(".Metadata"):
        raise bad(f"it holds a {getattr(metadata, 'kind', type(metadata).__name__)!s:.80}, not a Metadata")
    storage = metadata.get("storage_data")
    if storage is None:
        return None
    if not isinstance(storage, dict):
        raise bad("its storage_data is not a table")
    extents: dict[str, int] = {}
    for info in storage.values():
        if not isinstance(info, pickles.Record) or not info.kind.endswith("._StorageInfo"):
            if isinstance(info, pickles.Record) and info.kind.endswith("._HFStorageInfo"):
                continue  # safetensors-backed DCP: the files carry their own headers, checked as shards
            raise bad("an entry of its storage_data is not a _StorageInfo")
        rel, offset, length = info.get("relative_path"), info.get("offset"), info.get("length")
        if not isinstance(rel, str) or not _safe_relative(rel):
            raise bad(f"a storage entry names the file {str(rel)[:80]!r}, outside the checkpoint directory")
        if type(offset) is not int or type(length) is not int or not (0 <= offset < 1 << 63 and 0 <= length < 1 << 63):
            raise bad(f"a storage entry of {rel[:80]!r} has no valid offset and length")
        extents[rel] = max(extents.get(rel, 0), offset + length)
    return extents


# ---- torchsnapshot -----------------------------------------------------------------------------------------------


def _check_torchsnapshot(path: str, ctx: _Ctx) -> _Finding:
    if ".snapshot_metadata" not in _dir_names(path):
        return (
            "incomplete",
            f"no .snapshot_metadata: torchsnapshot writes it last, so this snapshot did not finish; {FALLBACK}",
        )
    raw = _read_bounded(
        os.path.join(path, ".snapshot_metadata"),
        path,
        ctx.limits.max_yaml_bytes,
        "max_yaml_bytes",
        ".snapshot_metadata",
    )
    # torchsnapshot 0.1 writes JSON (a subset of YAML); older releases wrote YAML.
    document = _load_json(raw, ".snapshot_metadata", ctx) if raw.lstrip()[:1] == b"{" else _load_yaml(raw, ctx)
    manifest = document.get("manifest") if isinstance(document, dict) else None
    if not isinstance(manifest, dict):
        return "corrupt", f".snapshot_metadata has no manifest: it is damaged or not torchsnapshot's; {FALLBACK}"
    extents: dict[str, int] = {}
    for key, entry in manifest.items():
        for location, end in _snapshot_extents(entry):
            if not _safe_relative(location):
                return "corrupt", f"the manifest entry {str(key)[:80]!r} names a file outside the snapshot"
            extents[location] = max(extents.get(location, 0), end)
    for location, end in sorted(extents.items()):
        data_path = os.path.join(path, location)
        if not os.path.lexists(data_path):
            return (
                "incomplete",
                f"{location}, named in the manifest, is missing: the snapshot was copied or cleaned up only in "
                f"part; {FALLBACK}",
            )
        f, size = _open_regular(data_path, path)
        with f:
            if end > size:
                return (
                    "incomplete",
                    f"{location} has {size:,} bytes but the manifest places data up to {end:,}: the file was "
                    f"truncated; {FALLBACK}",
                )
            if ctx.deep:
                _read_all(f, ctx)
    return _OK


def _snapshot_extents(entry: Any) -> Iterator[tuple[str, int]]:
    """(location, end of its data) for a manifest entry; a whole file without a byte range counts from 0, and a
    file whose size the entry does not fix (torch_save, objects) must hold at least one byte."""
    if not isinstance(entry, dict):
        return
    for nested in ("shards", "chunks"):
        items = entry.get(nested)
        if isinstance(items, list):
            for shard in items:
                if isinstance(shard, dict):
                    yield from _snapshot_extents(shard.get("tensor"))
    location = entry.get("location")
    if not isinstance(location, str):
        return
    span = entry.get("byte_range")
    if isinstance(span, list) and len(span) == 2 and all(type(v) is int and 0 <= v < 1 << 63 for v in span):
        yield location, span[1]
        return
    width = _TORCH_DTYPE_BYTES.get(str(entry.get("dtype")))
    shape = entry.get("shape")
    if entry.get("serializer") == "buffer_protocol" and width and isinstance(shape, list):
        count = 1
        for d in shape:
            if type(d) is not int or d < 0:
                return
            count = min(count * d, 1 << 63)
        yield location, count * width
        return
    yield location, 1


def _load_yaml(raw: bytes, ctx: _Ctx) -> Any:
    """A YAML document as plain dicts, lists and strings, built from the parser's events with bounds on nesting and
    size and no aliases (an alias bomb re-uses one node exponentially often)."""
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML is a dependency of the agent
        raise _Bad("unknown", ".snapshot_metadata is YAML and PyYAML is not installed: it was not checked") from None
    max_depth, max_nodes = ctx.limits.max_json_depth, ctx.limits.max_pickle_objects
    stack: list[Any] = []
    keys: list[Any] = []
    root: Any = None
    nodes = 0

    def add(value: Any) -> None:
        nonlocal root
        if not stack:
            root = value
            return
        top = stack[-1]
        if isinstance(top, list):
            top.append(value)
        elif keys[-1] is _NO_KEY:
            keys[-1] = value if isinstance(value, (str, int, float, bool)) or value is None else str(value)
        else:
            top[keys[-1]] = value
            keys[-1] = _NO_KEY

    try:
        for event in yaml.parse(raw.decode("utf-8"), Loader=yaml.SafeLoader):
            nodes += 1
            if not nodes % _WALK_CLOCK_EVERY:
                ctx.deadline.check()
            if nodes > max_nodes:
                raise LimitReached("max_pickle_objects", "the YAML manifest holds more nodes than the object limit")
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise _Bad(
                    "corrupt", f".snapshot_metadata uses YAML anchors, which torchsnapshot never writes; {FALLBACK}"
                )
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if len(stack) >= max_depth:
                    raise _Bad("corrupt", f".snapshot_metadata nests deeper than {max_depth} levels; {FALLBACK}")
                container: Any = {} if isinstance(event, yaml.MappingStartEvent) else []
                add(container)
                stack.append(container)
                keys.append(_NO_KEY)
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                stack.pop()
                keys.pop()
            elif isinstance(event, yaml.ScalarEvent):
                add(_yaml_scalar(event.value, event.implicit[0]))
    except yaml.YAMLError as err:
        raise _Bad("corrupt", f".snapshot_metadata is not valid YAML ({_describe(err)[:120]}); {FALLBACK}") from None
    except UnicodeDecodeError:
        raise _Bad("corrupt", f".snapshot_metadata is not UTF-8 text; {FALLBACK}") from None
    return root


class _NoKey:
    pass


_NO_KEY = _NoKey()


def _yaml_scalar(value: str, plain: bool) -> Any:
    if plain and _NUMBER.fullmatch(value):
        return int(value)
    if plain and value in ("null", "~", ""):
        return None
    return value


# ---- layouts with marker files -------------------------------------------------------------------------------


def _check_orbax(path: str, ctx: _Ctx) -> _Finding:
    name = os.path.basename(os.path.normpath(path))
    if _ORBAX_TMP in name:
        return (
            "incomplete",
            "this is an Orbax temporary directory: Orbax renames it to its step name when the save "
            f"commits, so the save did not finish (or is still running); {FALLBACK}",
        )
    # commit_success.txt is the commit on object stores; on a POSIX filesystem the rename above is.
    return (
        "complete",
        "committed (Orbax renamed its temporary directory); its tensorstore chunks are not compared with its "
        "metadata (only tensorstore knows their layout), so a chunk cut short afterwards is not seen",
    )


def _read_marker(path: str, root: str) -> str | None:
    try:
        f, _ = _open_regular(path, root)
    except FileNotFoundError:
        return None
    with f:
        return f.read(_MAX_MARKER).decode("utf-8", "replace").strip()


def _check_members(root: str, ctx: _Ctx) -> tuple[_Finding, int]:
    """Check every checkpoint file below ``root`` (torch.save, safetensors); the worst finding and how many."""
    finding, count = _OK, 0
    for file_path in _walk_files(root, ctx.deadline):
        rel = os.path.relpath(file_path, root)
        if not rel.endswith((*TORCH_SUFFIXES, ".safetensors", SAFETENSORS_INDEX_SUFFIX)):
            continue
        fmt = identify(file_path)
        if fmt not in ("torch-zip", "safetensors", "safetensors-sharded"):
            if os.path.islink(file_path):
                return ("incomplete", f"{rel} is a symlink that leads nowhere readable; it was not followed"), count
            continue
        if not _inside(file_path, root):
            return ("incomplete", f"{rel} is a symlink leading out of {root}; it was not followed"), count
        count += 1
        try:
            member = (
                _CHECKS[fmt](file_path, ctx) if fmt != "safetensors" else _safetensors_file(file_path, root, ctx)[0]
            )
        except _Bad as err:
            member = err.finding
        except _NotRegular as err:
            member = ("unknown", str(err))
        except LimitReached as err:
            raise LimitReached(err.limit, f"{rel}: {err}", err.verdict) from None
        if member[0] != "complete":
            finding = _worst(finding, (member[0], f"{rel}: {member[1]}"))
    return finding, count


def _tracked_step(tracked: str, parse: re.Pattern[str]) -> int | None:
    """The step a tracker names (``global_step20``, ``iter_0000020``, ``20``); None when it names none."""
    match = parse.fullmatch(tracked)
    if match:
        return int(match.group(1))
    if _NUMBER.fullmatch(tracked):
        return int(tracked)
    return None


def _bad_tracker(tracker: str, tracked: str) -> _Finding:
    return (
        "corrupt",
        f"{tracker} holds {tracked[:40]!r}, which is not a step it could name (ASCII digits or a step directory): "
        f"the tracker is damaged or hostile; {FALLBACK}",
    )


def _check_step_dir(
    path: str, tracker: str, tracked: str | None, step: int, parse: re.Pattern[str], what: str, ctx: _Ctx
) -> _Finding:
    if tracked is None:
        return (
            "incomplete",
            f"{tracker} is missing next to this step: {what} writes it after a save finishes, so "
            f"this save did not finish; {FALLBACK}",
        )
    tracked_step = _tracked_step(tracked, parse)
    if tracked_step is None and tracked != "release":
        return _bad_tracker(tracker, tracked)
    if tracked_step is None or tracked_step < step:
        return (
            "incomplete",
            f"{tracker} names {tracked[:40]!r}, not this step or a later one: {what} writes it when a "
            f"save finishes, so this save did not finish (or is still running); {FALLBACK}",
        )
    finding, count = _check_members(path, ctx)
    if count == 0 and not any(_DCP_METADATA.fullmatch(e) for e in _dir_names(path)):
        return "incomplete", f"no checkpoint files in the step directory: the save did not write them; {FALLBACK}"
    return finding


def _check_tracked_root(
    path: str, tracker: str, dir_for: Callable[[str], str | None], ctx: _Ctx, what: str
) -> _Finding:
    tracked = _read_marker(os.path.join(path, tracker), path)
    if tracked is None:
        return (
            "incomplete",
            f"no {tracker}: {what} writes it after the first save finishes, so no save has finished here",
        )
    step_name = dir_for(tracked)
    if step_name is None or not _safe_relative(step_name) or "/" in step_name:
        return _bad_tracker(tracker, tracked)
    step_dir = os.path.join(path, step_name)
    if not os.path.isdir(step_dir) or not _inside(step_dir, path):
        return (
            "incomplete",
            f"{tracker} names {tracked[:40]!r} but {step_name[:80]} is missing: the "
            f"directory was cleaned up or copied in part; {FALLBACK}",
        )
    return _CHECKS[what.lower()](step_dir, ctx)


def _deepspeed_dir(tracked: str) -> str | None:
    return tracked if tracked and "\0" not in tracked else None


def _check_deepspeed(path: str, ctx: _Ctx) -> _Finding:
    name = os.path.basename(os.path.normpath(path))
    match = _DEEPSPEED_STEP.fullmatch(name)
    if match is None:
        return _check_tracked_root(path, "latest", _deepspeed_dir, ctx, "DeepSpeed")
    parent = os.path.dirname(os.path.abspath(path))
    tracked = _read_marker(os.path.join(parent, "latest"), parent)
    return _check_step_dir(path, "latest", tracked, int(match.group(1)), _DEEPSPEED_STEP, "DeepSpeed", ctx)


def _megatron_dir(tracked: str) -> str | None:
    if _NUMBER.fullmatch(tracked):
        return f"iter_{int(tracked):07d}"
    return "release" if tracked == "release" else None


def _check_megatron(path: str, ctx: _Ctx) -> _Finding:
    name = os.path.basename(os.path.normpath(path))
    match = _MEGATRON_STEP.fullmatch(name)
    if match is None:
        return _check_tracked_root(path, _MEGATRON_TRACKER, _megatron_dir, ctx, "Megatron")
    parent = os.path.dirname(os.path.abspath(path))
    tracked = _read_marker(os.path.join(parent, _MEGATRON_TRACKER), parent)
    finding = _check_step_dir(path, _MEGATRON_TRACKER, tracked, int(match.group(1)), _MEGATRON_STEP, "Megatron", ctx)
    if finding[0] == "complete" and identify_dcp(path):
        finding = _worst(finding, _check_dcp(path, ctx))
    return finding


def identify_dcp(path: str) -> bool:
    """Whether a directory holds torch Distributed Checkpoint files (Megatron's torch_dist format does)."""
    try:
        return any(_DCP_METADATA.fullmatch(e) or e.endswith(".distcp") for e in _dir_names(path))
    except OSError:
        return False


def _check_hf_trainer(path: str, ctx: _Ctx) -> _Finding:
    if not os.path.exists(os.path.join(path, "trainer_state.json")):
        return (
            "incomplete",
            "no trainer_state.json: the Hugging Face Trainer writes it at the end of a save, so this "
            f"save did not finish (or is still running); {FALLBACK}",
        )
    newest = max((st.st_mtime for st in _walk_stats(path, ctx.deadline)), default=os.stat(path).st_mtime)
    newest = max(newest, os.stat(path).st_mtime)
    age = ctx.now - newest
    if age < ctx.settle:
        return (
            "incomplete",
            f"something in the directory changed {max(age, 0.0):.0f} s ago, less than the "
            f"{ctx.settle:.0f} s settle time: the save may still be running; check again later",
        )
    finding, _ = _check_members(path, ctx)
    return finding


_CHECKS: dict[str, Callable[[str, _Ctx], _Finding]] = {
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
