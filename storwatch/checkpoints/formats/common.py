"""The parts every format's check shares: the verdict (CheckResult), the context a check carries, reads that
never follow a link out of the checkpoint nor open what is not a regular file, the footprint walk, the bounded
JSON and YAML readers, and the restricted-unpickler resolvers for torch and DCP globals."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, BinaryIO

from storwatch.checkpoints import pickles
from storwatch.checkpoints.limits import MIB, PARSE_BUDGET, Deadline, DeepLimits, LimitReached
from storwatch.nofollow import file_kind
from storwatch.paths import own_fd

VERDICTS = ("complete", "incomplete", "corrupt", "unsafe", "unknown")

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
FALLBACK = "the last complete checkpoint should be used"
NOT_A_CHECKPOINT = (
    "is not a recognised checkpoint format (torch.save ZIP or legacy, safetensors, DCP, torchsnapshot, DeepSpeed, "
    "Hugging Face Trainer, Accelerate, Orbax, Megatron or GGUF)"
)
DEFAULT_LIMITS = DeepLimits()

_CHUNK = 1 << 20
_MAX_SAFETENSORS_HEADER = 100_000_000  # the safetensors library refuses larger headers
_MAX_MARKER = 4096  # `latest`-style marker files hold one short line
_MAX_CENTRAL_DIRECTORY = 16 * MIB  # about 350,000 entries: far more tensors than any torch.save writes
_MAX_DIR_ENTRIES = 100_000  # names read from one directory to identify it
_RATIO_FLOOR = 1 * MIB  # an entry's ratio is judged once it has inflated this much
_WALK_CLOCK_EVERY = 1024
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
_NUMBER = re.compile(r"\d{1,18}", re.ASCII)
_DCP_METADATA = re.compile(r"(__\d{1,9})?\.metadata", re.ASCII)


@dataclass(frozen=True)
class CheckResult:
    path: str
    """The path as given."""
    format: str | None
    """One of FORMATS, or None when the layout is not a known checkpoint format."""
    verdict: str
    """``complete``, ``incomplete`` (a save that did not finish, or is still running), ``corrupt`` (finished, then
    damaged, or never valid), ``unsafe`` (a pickle in it names a global that runs code when loaded: never complete,
    whatever else holds) or ``unknown`` (not a checkpoint, or a check that stopped at a limit)."""
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
    notes: tuple[str, ...] = ()
    """Sentences about what the check met that is no damage: classes its pickles name that storwatch does not know
    (read as inert records), a torch.load that refused such a class, bytes after a legacy file's last storage."""
    unknown_globals: tuple[str, ...] = ()
    """Those unknown names, sorted (at most MAX_NOTED_GLOBALS; ``checkpoints.allowed_globals`` quiets them)."""
    unknown_global_count: int = 0
    """How many distinct unknown names the pickles hold (counted up to pickles.MAX_UNKNOWN_NAMES)."""

    @property
    def complete(self) -> bool:
        return self.verdict == "complete"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_Finding = tuple[str, str]
_OK: _Finding = ("complete", "")
# unsafe outranks damage: whatever else is wrong with a file, loading it would run what it names.
_RANK = {"complete": 0, "unknown": 1, "incomplete": 2, "corrupt": 3, "unsafe": 4}
MAX_NOTED_GLOBALS = 20


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
    identify: Callable[[str], str | None]
    """The registry's identification, for formats whose members are checkpoints of other formats."""
    checks: Mapping[str, Callable[[str, _Ctx], _Finding]]
    """The registry's check of each format, likewise."""
    unknown: dict[str, int] = field(default_factory=dict)
    """Globals the pickles read so far name that are neither allowed nor unsafe, with how often (pickles.Reader)."""
    notes: list[str] = field(default_factory=list)
    """Findings that are no damage, in words (CheckResult.notes)."""
    closed: bool = False
    """The caller saw that no process holds any of the checkpoint's files open for writing: what has no end marker
    is judged now, not once it has settled."""

    def note(self, text: str) -> None:
        if text not in self.notes and len(self.notes) < MAX_NOTED_GLOBALS:
            self.notes.append(text)


def _worst(a: _Finding, b: _Finding) -> _Finding:
    return b if _RANK[b[0]] > _RANK[a[0]] else a


def _inside(path: str, root: str) -> bool:
    return _below(os.path.realpath(path), os.path.realpath(root))


def _below(real: str, real_root: str) -> bool:
    return real == real_root or os.path.commonpath([real, real_root]) == real_root


def _opened_inside(fd: int, path: str, root: str) -> None:
    """The file the kernel opened is below ``root``. The check before the open resolves the links on the path, and a
    tenant can swap a link in after it: what the descriptor names (:func:`storwatch.paths.own_fd`) is the kernel's
    word on what was opened. Without a procfs, the check before the open stands alone."""
    try:
        opened = os.readlink(own_fd(fd))
    except OSError:
        return
    if opened.endswith(" (deleted)") and os.fstat(fd).st_nlink == 0:  # the kernel's mark, not a name that ends so
        raise FileNotFoundError(errno.ENOENT, "removed as it was opened", path)
    if not _below(opened, os.path.realpath(root)):
        raise _NotFollowed(f"{path} is a symbolic link leading out of {root}; it was not followed")


def _open_regular(path: str, root: str) -> tuple[BinaryIO, int]:
    """Open a regular file below ``root`` for reading, and its size; never a FIFO or device that could block."""
    if not _inside(path, root):
        raise _NotFollowed(f"{path} is a symbolic link leading out of {root}; it was not followed")
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError as err:
        # A socket (or a device without its driver) cannot be opened at all: say what it is, not that a read failed.
        if err.errno != errno.ENXIO:
            raise
        try:
            mode = os.stat(path).st_mode
        except OSError:
            raise err from None
        if stat.S_ISREG(mode):
            raise
        raise _NotRegular(f"{path} is not a regular file ({file_kind(mode)}); it was not read") from None
    try:
        _opened_inside(fd, path, root)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _NotRegular(f"{path} is not a regular file ({file_kind(st.st_mode)}); it was not read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


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


def _describe(err: BaseException) -> str:
    try:
        text = str(err)
    except Exception:  # a str() that fails is itself worth no more than its type
        text = ""
    return text[:300] or type(err).__name__


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

_JSON_STRING = re.compile(rb'"[^"]*"')  # once escapes are gone: one repeat of a class, no state per character
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_BRACKETS_AS_LISTS = bytes.maketrans(b"{}", b"[]")
_STRUCTURE_CHUNK = 64 * 1024
_JSON_BYTES_PER_VALUE = 128
"""What json.loads may build per value, at most (a one-key dict in a list is about 100 bytes; a short string in a
dict about 125, its characters counted apart)."""


def json_depth_exceeds(raw: bytes, max_depth: int) -> bool:
    """Whether a JSON document nests deeper than ``max_depth``, found before any parse (a parser that recurses would
    fail on 200,000 nested ``[`` only after allocating for them). Every step runs in C on at most two copies of the
    document, and only where it has backslashes: escaped backslashes and quotes are dropped, then all but quotes and
    brackets, then strings (a chunk at a time: re.sub keeps every piece of its output until it joins them), and each
    pass then removes the innermost pairs of brackets. Brackets left unmatched count as nesting, so a broken
    document may be called deep."""
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = raw.translate(None, _NOT_STRUCTURE)
    outside = bytearray()
    in_string = False
    for at in range(0, len(marks), _STRUCTURE_CHUNK):
        chunk = marks[at : at + _STRUCTURE_CHUNK]
        if in_string:
            close = chunk.find(b'"')
            if close < 0:
                continue
            chunk, in_string = chunk[close + 1 :], False
        if chunk.count(b'"') % 2:
            chunk, in_string = chunk[: chunk.rfind(b'"')], True
        outside += _JSON_STRING.sub(b"", chunk)
    del marks
    brackets = bytes(outside).translate(_BRACKETS_AS_LISTS)
    del outside
    for passes in range(max_depth + 1):
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):
            # Only unmatched brackets are left (closers first, then openers): each opener is one more level.
            return passes + inner.count(b"[") > max_depth
        brackets = inner
    return True  # max_depth + 1 passes each removed a level


def json_values_bound(raw: bytes) -> int:
    """At most how many values (keys included) json.loads builds from ``raw``: every value but the first of a
    container follows a comma or a colon, and every container opens with a bracket (those inside strings only make
    the bound higher)."""
    return raw.count(b",") + raw.count(b":") + raw.count(b"[") + raw.count(b"{") + 1


def json_parse_bytes(raw: bytes) -> int:
    """Memory json.loads may take for ``raw``, at most: the bytes, the text decoded from them (1, 2 or 4 bytes a
    character, as the widest character needs), the characters again in string objects, and each value."""
    if raw.isascii():
        width = 1
    elif re.search(rb"[\xf0-\xf4]", raw):
        width = 4
    else:
        width = 2
    return len(raw) * (2 + width) + json_values_bound(raw) * _JSON_BYTES_PER_VALUE


def _load_json(raw: bytes, what: str, ctx: _Ctx, budget: bool = True) -> Any:
    """Parse a JSON document within the limits; _Bad (corrupt) when it is not JSON or nests too deeply, LimitReached
    (unknown) when it holds more values than allowed or could not fit in the parse budget (limits.PARSE_BUDGET).
    ``budget=False``: the caller holds the document's share of the budget (json_parse_bytes) while it uses the
    result."""
    limits = ctx.limits
    if len(raw) > limits.max_json_bytes:
        raise LimitReached(
            "max_json_bytes",
            f"{what} is {len(raw):,} bytes of JSON, over the limit of {limits.max_json_bytes:,} "
            "(checkpoints.deep_max_json_bytes): it was not parsed",
        )
    values = json_values_bound(raw)
    if values > limits.max_json_values:
        raise LimitReached(
            "max_json_values",
            f"{what} holds up to {values:,} JSON values, over the limit of {limits.max_json_values:,}: it was not "
            "parsed, which says nothing against the checkpoint",
        )
    held = PARSE_BUDGET.hold(json_parse_bytes(raw), what, limits, ctx.deadline) if budget else nullcontext()
    with held:
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


@lru_cache(maxsize=8)
def _torch_resolver(extra: tuple[str, ...]) -> Callable[[str], pickles.Global | None]:
    base = {**pickles.TORCH_WEIGHTS_ONLY, **pickles.HARMLESS_DATA}
    for table in (pickles.DEEPSPEED, pickles.MEGATRON, pickles.HF_TRAINER):
        base.update(table)
    return pickles.with_extra(base, extra)


@lru_cache(maxsize=8)
def _dcp_resolver(extra: tuple[str, ...]) -> Callable[[str], pickles.Global | None]:
    return pickles.with_extra(pickles.DCP_METADATA, extra)


def _extra_torch_globals(limits: DeepLimits, unknown: Iterable[str] = ()) -> tuple[str, ...]:
    """Names beyond torch's own list, for the torch-load child (which stands an inert class in for each): the allowed
    ones, and the unknown ones this file's pickle was found to name (never unsafe ones: those stop the check
    before torch is tried)."""
    names = [*pickles.HARMLESS_DATA, *pickles.DEEPSPEED, *pickles.MEGATRON, *pickles.HF_TRAINER]
    names += [n for n in limits.allowed_globals if not n.endswith(".*")]
    names += [n for n in unknown if n not in names]
    return tuple(n for n in names if n not in pickles.TORCH_WEIGHTS_ONLY)


def _unsafe(what: str, err: pickles.UnsafeGlobal) -> _Finding:
    return (
        "unsafe",
        f"{what} {err}: nothing was run here, but loading this file with pickle or torch.load(weights_only=False) "
        "would run it; treat it as a code payload, not as a checkpoint (no configuration makes it complete)",
    )


def unknown_note(unknown: Mapping[str, int]) -> str:
    """The note on classes a pickle names that storwatch does not know."""
    names = sorted(unknown)
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    if len(names) >= pickles.MAX_UNKNOWN_NAMES:
        count = f"{len(names):,} or more names"
    else:
        count = f"{len(names)} name" + ("s" if len(names) != 1 else "")
    return (
        f"its pickles name {count} storwatch does not know ({shown}): read as inert records, never imported or "
        "called here (the standard unpickler would import them); that is no damage. List them in "
        "checkpoints.allowed_globals to quiet this note"
    )


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


def _safe_relative(name: str) -> bool:
    """A path from metadata that stays inside the checkpoint directory."""
    return bool(name) and "\0" not in name and not os.path.isabs(name) and ".." not in name.split("/")


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


def _read_marker(path: str, root: str) -> str | None:
    try:
        f, _ = _open_regular(path, root)
    except FileNotFoundError:
        return None
    with f:
        return f.read(_MAX_MARKER).decode("utf-8", "replace").strip()
