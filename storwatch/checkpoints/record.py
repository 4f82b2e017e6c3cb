"""The checkpoint records that travel from the helper process's walk to the View, and the one join key, ``RunId``.

One record per checkpoint (``Checkpoint``): the helper fills in what the walk and the check found, and the event
log's timing when a line passed its checks; the checkpoint source adds what only it can know (when it first saw the
checkpoint, how long its write took when watched, whether the kernel backs the writer PID a line names); analysis
and every consumer read the same record. Runs travel as ``Run`` records, grouped once, by the helper.

Across the helper's pipe the records go as JSON, written and read by ``to_wire`` and ``from_wire``: every field is
checked against its declared type on the way in (an answer crossed a process boundary; a wrong type is an error that
names the field, never a value taken on trust). Standard library only: the helper imports this.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

from storwatch.checkpoints.scan import DatasetDir

T = TypeVar("T")


@dataclass(frozen=True, order=True)
class RunId:
    """A checkpoint run, unique on the node: the scan root it was found under and its directory (every later join,
    from the View's runs to their recovery figures and findings, goes by this, never by a label)."""

    root: str
    """The scan root (as the walk resolved it)."""
    path: str
    """The run's directory: the root itself, or a directory below it."""

    @functools.cached_property
    def below_root(self) -> str:
        """The run's directory as a path below its root (the root's own name for the root itself); worked out once
        per RunId (every View labels and joins each run by it)."""
        if self.path == self.root:
            return os.path.basename(self.root.rstrip("/")) or "/"
        return os.path.relpath(self.path, self.root)

    def __str__(self) -> str:
        return self.path


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint, from the walk to the View."""

    path: str
    format: str | None
    verdict: str
    """complete, incomplete, corrupt, unsafe or unknown."""
    reason: str
    size_bytes: int
    mtime: float
    """Newest modification time of anything in it: when it was last written."""
    deep_checked: bool = False
    first_seen: float = 0.0
    """When the checkpoint source first saw it (its clock); 0 until the source has."""
    write_seconds: float | None = None
    """How long the write took (``write_timed_by`` says how it was measured); None when it is not known."""
    write_bytes_per_second: float | None = None
    write_start: float | None = None
    """When the write began: with ``write_seconds`` the span the writer was busy saving. Set alone (``write_seconds``
    None) where only the checkpoint's birth time is known: the start of a save whose end is not."""
    allocated_bytes: int = 0
    """The space it takes on disk (``st_blocks * 512``): what its next one will need, whatever size a sparse file
    claims."""
    writer_pid: int | None = None
    """The process that wrote it, as the event log names it, once the kernel backs the claim (it was seen with a file
    open for writing under the run: sources/writers.py); None otherwise. Only off Kubernetes, where PIDs are the
    host's."""
    kind: str = "file"
    """``file``: a single-file checkpoint; ``dir``: a checkpoint directory."""
    files: int = 1
    notes: tuple[str, ...] = ()
    """What the check met that is no damage (unknown classes read as inert records, a torch.load refusal)."""
    claimed_pid: int | None = None
    """The PID the event log's line names, before the kernel is asked (the helper fills it; the source decides
    ``writer_pid``)."""
    write_timed_by: str | None = None
    """How ``write_start`` and ``write_seconds`` were measured: ``event_log`` (atomic_save's line, checked against
    the file), ``file_events`` (the kernel's file events, from its creation, or its birth, to its close or its move
    into place: analysis/writes.py), ``open_files`` (its files seen open for writing by a GPU process, from their
    birth, or first seen open, to seen closed); None when the write is not timed (a birth time alone gives only its
    start: its newest mtime misses an fsync after the last write)."""
    write_untimed_reason: str | None = None
    """Why the write is not timed (no event line, and no birth time on this filesystem): a duration known only to
    within a scan interval is no duration, so none is made up."""


@dataclass(frozen=True)
class Temp:
    """An atomic_save temporary found by the walk: a save in progress, or litter whose writer is gone."""

    path: str
    writing: bool
    """Written to lately: a save in progress (not an orphan)."""
    allocated_bytes: int = 0
    """The space it takes (an orphan's: what removing it frees)."""
    why: str | None = None
    """How its writer was found gone (an orphan)."""


@dataclass(frozen=True)
class Run:
    """A run as the helper grouped it: its directory, its checkpoints (oldest first) and its temporaries."""

    path: str
    checkpoints: tuple[Checkpoint, ...]
    temps: tuple[Temp, ...] = ()
    uid: int | None = None
    """The run directory's owner as the kernel reports it (``lstat``): whose run it is. None when it could not be
    had."""


@dataclass(frozen=True)
class UnitAnswer:
    """The helper's answer for one unit (a scan root, or a mount below one)."""

    root: str
    """The unit's path as the walk resolved it."""
    runs: tuple[Run, ...]
    truncated: bool
    truncated_reason: str | None
    truncated_detail: str | None
    seconds: float
    check_errors: dict[str, int] = field(default_factory=dict)
    claims_rejected: dict[str, int] = field(default_factory=dict)
    datasets: tuple[DatasetDir, ...] = ()
    unreadable: int = 0
    unreadable_paths: tuple[str, ...] = ()
    seq: int = 0
    """This answer's number: the agent sends back the one it holds (``have``), and the next answer may then be a
    change from it."""
    base: int = 0
    """0: ``runs`` are all the unit's runs. Else the answer numbered ``base`` with ``runs`` in place of those of the
    same path, and ``gone`` removed: a run unchanged since the answer the agent holds is not sent again (2,500
    checkpoints of a node at scale were written, sent and read every scan)."""
    gone: tuple[str, ...] = ()
    """With ``base``: the runs of that answer that are no longer there."""
    cpu_seconds: float = 0.0
    """The helper's CPU time for this scan (its thread's), for the scans' budget (``checkpoints.scan_cpu_share``)."""
    more: bool = False
    """The checks ran past the call's budget (a unit's first walk of thousands of files): nothing else in this answer
    is the unit's; the helper keeps what it checked, and the next call goes on from there."""


def applied(held: UnitAnswer | None, answer: UnitAnswer) -> UnitAnswer:
    """The unit's whole answer: ``answer`` itself when it is whole, else ``held`` (the answer numbered
    ``answer.base``) with its changes. A run that did not change keeps its record (the same object). WireError when
    the change is from an answer other than ``held``."""
    if not answer.base:
        return answer
    if held is None or held.seq != answer.base:
        raise WireError(f"the answer changes answer {answer.base}, and {held.seq if held else 'none'} is held")
    runs = {r.path: r for r in held.runs}
    for path in answer.gone:
        runs.pop(path, None)
    for run in answer.runs:
        runs[run.path] = run
    return dataclasses.replace(answer, runs=tuple(runs[p] for p in sorted(runs)), base=0, gone=())


@dataclass(frozen=True)
class DeepAnswer:
    """The helper's answer to a deep check."""

    checkpoint: Checkpoint
    check_errors: dict[str, int] = field(default_factory=dict)


class WireError(ValueError):
    """An answer from the helper that does not have the declared shape (names the field)."""


def to_wire(record: Any) -> dict[str, Any]:
    """A record as plain data for JSON (what ``dataclasses.asdict`` gives, without its deep copies: a unit's answer
    holds thousands of records, sent every scan)."""
    return typing.cast(dict[str, Any], _plain(record))


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _plain(value: Any) -> Any:
    kind = type(value)
    names = _FIELD_NAMES.get(kind)
    if names is None and dataclasses.is_dataclass(kind):
        names = _FIELD_NAMES[kind] = tuple(f.name for f in dataclasses.fields(kind))
    if names is not None:
        return {name: _plain(getattr(value, name)) for name in names}
    if kind is tuple or kind is list:
        return [_plain(v) for v in value]
    if kind is dict:
        return {k: _plain(v) for k, v in value.items()}
    return value


def from_wire(cls: type[T], data: Any, where: str = "") -> T:
    """``cls`` (a dataclass of this module) from plain data, every field checked against its declared type. Read by
    a decoder made once per type; where it finds a mismatch, the answer is read again field by field for the error,
    which names the field."""
    try:
        return typing.cast(T, _decoder(cls)(data))
    except _Mismatch:
        pass
    _decode(cls, data, where or cls.__name__)  # raises the WireError that names the field
    raise WireError(f"{where or cls.__name__}: does not have the declared shape")


class _Mismatch(Exception):
    """A value without its declared type, found by a made decoder (from_wire then finds which one)."""


_DECODERS: dict[Any, Callable[[Any], Any]] = {}
_SCALARS: dict[Any, Callable[[Any], bool]] = {
    bool: lambda v: isinstance(v, bool),
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    str: lambda v: isinstance(v, str),
}
"""What a value read as each scalar type must be (as _decode checks it); a float is also converted."""


def _decoder(kind: Any) -> Callable[[Any], Any]:
    """A function that reads plain data as ``kind``, checking as ``_decode`` does, and raises _Mismatch."""
    made = _DECODERS.get(kind)
    if made is None:
        made = _DECODERS[kind] = _make_decoder(kind)
    return made


def _make_decoder(kind: Any) -> Callable[[Any], Any]:
    origin = get_origin(kind)
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        hints = get_type_hints(kind)
        cls = kind
        spec = [
            (
                f.name,
                _decoder(hints[f.name]),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(kind)
        ]

        def record(value: Any) -> Any:
            if not isinstance(value, dict):
                raise _Mismatch
            args = {}
            for name, read, required in spec:
                if name in value:
                    args[name] = read(value[name])
                elif required:
                    raise _Mismatch
            return cls(**args)

        return record
    if origin in (typing.Union, types.UnionType):
        options = get_args(kind)
        nullable = type(None) in options
        readers = [_decoder(o) for o in options if o is not type(None)]

        def union(value: Any) -> Any:
            if value is None and nullable:
                return None
            for read in readers:
                try:
                    return read(value)
                except _Mismatch:
                    continue
            raise _Mismatch

        return union
    if origin is tuple:
        read_item = _decoder(get_args(kind)[0])

        def sequence(value: Any) -> Any:
            if not isinstance(value, list | tuple):
                raise _Mismatch
            return tuple(read_item(v) for v in value)

        return sequence
    if origin is dict:
        read_key, read_value = (_decoder(a) for a in get_args(kind))

        def mapping(value: Any) -> Any:
            if not isinstance(value, dict):
                raise _Mismatch
            return {read_key(k): read_value(v) for k, v in value.items()}

        return mapping
    if kind is float:

        def number(value: Any) -> Any:
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise _Mismatch
            return float(value)

        return number
    ok = _SCALARS.get(kind)
    if ok is not None:

        def scalar(value: Any) -> Any:
            if not ok(value):
                raise _Mismatch
            return value

        return scalar

    def unknown(value: Any) -> Any:
        raise _Mismatch

    return unknown


_HINTS: dict[type, dict[str, Any]] = {}


def _decode(kind: Any, value: Any, where: str) -> Any:
    origin = get_origin(kind)
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        if not isinstance(value, dict):
            raise WireError(f"{where}: an object expected, got {type(value).__name__}")
        hints = _HINTS.get(kind)
        if hints is None:
            hints = _HINTS[kind] = get_type_hints(kind)
        args = {}
        for f in dataclasses.fields(kind):
            if f.name in value:
                args[f.name] = _decode(hints[f.name], value[f.name], f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise WireError(f"{where}.{f.name}: missing")
        return kind(**args)
    if origin in (typing.Union, types.UnionType):
        options = get_args(kind)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _decode(option, value, where)
            except WireError:
                continue
        raise WireError(f"{where}: {value!r:.60} is none of {kind}")
    if origin is tuple:
        item = get_args(kind)[0]
        if not isinstance(value, list | tuple):
            raise WireError(f"{where}: a list expected, got {type(value).__name__}")
        return tuple(_decode(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        key_type, value_type = get_args(kind)
        if not isinstance(value, dict):
            raise WireError(f"{where}: an object expected, got {type(value).__name__}")
        return {_decode(key_type, k, where): _decode(value_type, v, f"{where}[{k!r:.40}]") for k, v in value.items()}
    if kind is bool:
        if not isinstance(value, bool):
            raise WireError(f"{where}: true or false expected, got {value!r:.60}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise WireError(f"{where}: a whole number expected, got {value!r:.60}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise WireError(f"{where}: a finite number expected, got {value!r:.60}")
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            raise WireError(f"{where}: a string expected, got {value!r:.60}")
        return value
    raise WireError(f"{where}: no rule to read a {kind}")
