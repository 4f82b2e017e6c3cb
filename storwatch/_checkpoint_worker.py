"""The helper process behind the checkpoint source: walks the checkpoint roots, checks what it finds, reads the
training side's event logs and tests temporaries for an orphan, so a mount whose readdir or stat hangs strands a
thread here and never one of the agent's. Its operations include ``_blocking_worker``'s, and the agent sends the mount
table's statvfs calls here too (``registry.shared_helper``): one interpreter for both.

Started by :func:`command` (``python -I``, this tree first on ``sys.path``); it imports only storwatch's
standard-library modules (``checkpoints.scan``, ``checkpoints.formats``, ``training``) and answers requests as
``_blocking_worker`` does, one thread per request. It keeps, per unit (a scan root, or a mount below one), the
incremental scanner and the cheap check of every candidate that did not change, so a rescan costs here what it cost
in the agent. The threads share one parse budget (``checkpoints.limits.PARSE_BUDGET``): the metadata parsed at once,
across every root, holds at most ``parse_budget_bytes``; a check that waited too long for room is ``unknown`` for
this scan only and is made again at the next.

Operations (the path hex-encoded, the parameters a hex-encoded JSON object; each answers one JSON text, a record of
``checkpoints/record.py``):

``ckpt_scan UNIT PARAMS``
    Walk UNIT (``skip``: directories not to enter), cheap-check new and changed candidates, read each run's event
    log, find the temporaries whose writer is gone, and answer the unit's runs (``UnitAnswer``): all of them, or,
    when ``have`` names the last answer sent for the unit, those that changed since and the paths of those gone (an
    unchanged run is neither written nor read again). A check that raises
    makes only its candidate ``corrupt`` (``unknown`` when it is no known format), with the exception in the reason,
    and is counted by kind.
``ckpt_deep PATH PARAMS``
    The deep check of one checkpoint, isolated the same way (``DeepAnswer``); its verdict stands in the unit's cache.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from storwatch.calls._blocking_worker import serve
from storwatch.checkpoints.birth import StatxTimes, statx_times
from storwatch.checkpoints.events import MAX_SAVE_SECONDS, FileTimes, SaveRecord, parse_lines
from storwatch.checkpoints.formats import CheckResult, check, identify
from storwatch.checkpoints.limits import TRANSIENT_LIMITS, DeepLimits
from storwatch.checkpoints.record import Checkpoint, DeepAnswer, Run, Temp, UnitAnswer, to_wire
from storwatch.checkpoints.scan import CheckpointCandidate, CheckpointScanner, ScanResult
from storwatch.paths import HostPaths
from storwatch.training import EVENT_LOG_NAME, TEMP_GRACE_SECONDS, orphaned_temp

EVENT_LOG_TAIL = 64 * 1024
"""Bytes read from the end of a run's event log."""
MAX_REJECTED_LINES = 10_000
"""Event lines remembered as counted, per unit (past it the memory starts again: a line is then counted twice)."""
FORGET_ROUNDS = 3
"""A unit not asked for in this many rounds is forgotten (a pod volume that went away)."""
OOM_SCORE_ADJ = 500
"""This helper's oom_score_adj: under memory pressure (the DaemonSet's limit) the kernel kills it before the agent
(whose BlockingCalls start a new one); a deep check's torch-load child has 1000."""


def error_reason(err: BaseException) -> str:
    if isinstance(err, RecursionError):
        return "recursion_error"
    if isinstance(err, MemoryError):
        return "memory_error"
    if isinstance(err, OSError):
        return "os_error"
    if isinstance(err, ValueError):
        return "value_error"
    return "other"


def limits_from(params: dict[str, Any]) -> DeepLimits | None:
    """The checks' limits as the agent sent them (``DeepLimits`` as a dict), or None for the defaults."""
    given = params.get("limits")
    if not given:
        return None
    return DeepLimits(**{**given, "allowed_globals": tuple(given.get("allowed_globals", ()))})


def guarded_check(
    path: str,
    deep: bool,
    now: float,
    settle: float,
    errors: dict[str, int],
    size: int = 0,
    mtime: float = 0.0,
    limits: DeepLimits | None = None,
) -> CheckResult:
    """``check()``, and whatever it raises makes this checkpoint's verdict, never the scan's (check() is built never
    to raise; this holds if it ever does)."""
    try:
        return check(path, deep=deep, now=now, settle_seconds=settle, limits=limits)
    except Exception as err:  # one bad file must not end the scan of the others
        reason = error_reason(err)
        errors[reason] = errors.get(reason, 0) + 1
        try:
            fmt = identify(path)
        except Exception:
            fmt = None
        text = str(err).replace("\n", " ")[:300]
        return CheckResult(
            path=path,
            format=fmt,
            verdict="corrupt" if fmt is not None else "unknown",
            reason=f"checking it raised {type(err).__name__}: {text}"
            + ("" if fmt is not None else "; it is no checkpoint format storwatch knows"),
            size_bytes=size,
            mtime=mtime,
            deep=deep,
            error=type(err).__name__,
        )


@dataclass
class _Unit:
    scanner: CheckpointScanner
    verdicts: dict[str, tuple[tuple[int, float], CheckResult]] = field(default_factory=dict)
    """Candidate path -> (size and newest mtime, its check) as last checked: the cheap check, or the deep one once it
    was made of the same footprint. The one verdict cache: the agent keeps none."""
    events: dict[str, tuple[tuple[int, int], list[bytes]]] = field(default_factory=dict)
    """Run directory -> (its event log's mtime and size, the lines at its end)."""
    births: dict[str, tuple[tuple[int, float], StatxTimes | None]] = field(default_factory=dict)
    """Checkpoint path -> (its size and mtime, its birth and change times) for the files event lines name."""
    rejected_lines: set[int] = field(default_factory=set)
    """Event lines already dropped and counted (hashes), so a log read again counts each once."""
    sent_seq: int = 0
    sent_runs: dict[str, Run] = field(default_factory=dict)
    """The runs of the last answer, numbered ``sent_seq``: the next answer sends only what changed from it when the
    agent says it holds that one."""
    round: int = 0
    checked_so_far: dict[str, tuple[tuple[int, float], CheckResult]] = field(default_factory=dict)
    """The checks made by calls that ran past their check budget (``check_seconds``) and answered ``more``: reused
    whatever their verdict until a call gets through every candidate, so each call goes further than the last."""
    lock: threading.Lock = field(default_factory=threading.Lock)


_units: dict[str, _Unit] = {}
_units_lock = threading.Lock()
_answer_numbers = itertools.count(random.SystemRandom().getrandbits(48) + 1)
"""Answer numbers from a random start: one this process gives is never one an earlier helper gave the agent."""


def _unit(path: str, params: dict[str, Any]) -> _Unit:
    round_ = int(params.get("round", 0))
    with _units_lock:
        unit = _units.get(path)
    if unit is None:
        # Outside the lock: the scanner resolves its root, which hangs on a hung mount (that unit's thread only).
        made = _Unit(CheckpointScanner([path]))
        with _units_lock:
            unit = _units.setdefault(path, made)
    with _units_lock:
        unit.round = round_
        for name in [n for n, u in _units.items() if u.round < round_ - FORGET_ROUNDS]:
            del _units[name]
    scanner = unit.scanner
    scanner.max_entries = int(params["max_entries"])
    scanner.max_depth = int(params["max_depth"])
    scanner.max_seconds = float(params["max_seconds"])
    scanner.settle_seconds = float(params["settle"])
    scanner.skip = frozenset(params.get("skip", ()))
    return unit


def _event_lines(unit: _Unit, run: str) -> list[bytes]:
    """The lines at the end of the run's event log (read again only when it changes)."""
    path = os.path.join(run, EVENT_LOG_NAME)
    try:
        st = os.lstat(path)
    except OSError:
        unit.events.pop(run, None)
        return []
    cached = unit.events.get(run)
    if cached is not None and cached[0] == (st.st_mtime_ns, st.st_size):
        return cached[1]
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                return []  # not a regular file: never read a FIFO or device
            size = opened.st_size
            os.lseek(fd, max(0, size - EVENT_LOG_TAIL), os.SEEK_SET)
            data = os.read(fd, EVENT_LOG_TAIL)
        finally:
            os.close(fd)
    except OSError:
        return []
    lines = data.splitlines()[1 if size > EVENT_LOG_TAIL else 0 :]  # the first may be cut
    unit.events[run] = ((st.st_mtime_ns, st.st_size), lines)
    return lines


def _birth(unit: _Unit, c: CheckpointCandidate) -> float | None:
    """The candidate's birth time (a file's, or a checkpoint directory's), asked once per footprint."""
    footprint = (c.size_bytes, c.newest_mtime)
    known = unit.births.get(c.path)
    if known is None or known[0] != footprint:
        known = unit.births[c.path] = (footprint, statx_times(c.path))
    return None if known[1] is None else known[1].birth


def _event_log(
    unit: _Unit, run: str, files: dict[str, CheckpointCandidate], now: float, rejected: dict[str, int]
) -> dict[str, SaveRecord]:
    """The last good write record of each checkpoint of the run in its event log, each line checked against the
    file it names (checkpoints/events.py); lines dropped are added to ``rejected`` by reason, each line once."""

    def target(named: str) -> str | None:
        return os.path.join(run, os.path.basename(named))  # a run's log speaks of its own directory only

    def file_times(path: str) -> FileTimes | None:
        c = files.get(path)
        if c is None:
            return None
        footprint = (c.size_bytes, c.newest_mtime)
        known = unit.births.get(path)
        if known is None or known[0] != footprint:
            known = unit.births[path] = (footprint, statx_times(path))
        times = known[1]
        if times is None:
            return FileTimes(c.size_bytes, c.newest_mtime, None)
        return FileTimes(c.size_bytes, c.newest_mtime, times.birth, times.ctime)

    records, dropped = parse_lines(_event_lines(unit, run), target, file_times, now)
    for line, reason in dropped:
        key = hash((run, line))
        if key not in unit.rejected_lines:
            if len(unit.rejected_lines) >= MAX_REJECTED_LINES:
                unit.rejected_lines.clear()
            unit.rejected_lines.add(key)
            rejected[reason] = rejected.get(reason, 0) + 1
    return records


def _checkpoint(
    c: CheckpointCandidate, result: CheckResult, event: SaveRecord | None, birth: float | None
) -> Checkpoint:
    """The record of one candidate: what the walk found, what the check said, and its write's span: its event line;
    else, for a complete checkpoint, only its start, its birth (the file's, or the directory's: a save makes it
    first), where the filesystem keeps a birth time. Its newest mtime is no end: a save's fsync and close come after
    its last write, and one large write sets the mtime at its start; the file events or the writer's open files
    (analysis/writes.py) time the rest, or it stays untimed."""
    start: float | None = None
    seconds: float | None = None
    timed_by: str | None = None
    untimed: str | None = None
    if event is not None:
        start, seconds, timed_by = event.start, event.end - event.start, "event_log"
    elif result.verdict != "complete":
        untimed = "not complete: its write has not ended"
    elif birth is None:
        untimed = "no event line, and this filesystem keeps no birth time: the write is not timed"
    elif 0.0 <= c.newest_mtime - birth <= MAX_SAVE_SECONDS:
        start = birth
        untimed = (
            "only its birth time is known: when the save began, not when it ended (its newest mtime misses an fsync "
            "or a close after the last write)"
        )
    else:
        untimed = "its birth and newest mtime do not bound a save (changed long after it was made)"
    size = event.bytes if event is not None else result.size_bytes
    return Checkpoint(
        path=c.path,
        format=result.format,
        verdict=result.verdict,
        reason=result.reason,
        size_bytes=result.size_bytes,
        mtime=result.mtime,
        deep_checked=result.deep,
        write_seconds=seconds,
        write_bytes_per_second=size / seconds if seconds else None,
        write_start=start,
        allocated_bytes=c.allocated_bytes,
        kind=c.kind,
        files=c.files,
        notes=result.notes,
        claimed_pid=None if event is None else event.pid,
        write_timed_by=timed_by,
        write_untimed_reason=untimed,
    )


def _changed_lately(dir_fd: int, name: str, now: float) -> bool:
    """A temporary written to within TEMP_GRACE_SECONDS: a save in progress (one whose writer lost its lock or never
    had one, on a filesystem without flock, is not called in progress once it stops changing)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and now - st.st_mtime < TEMP_GRACE_SECONDS


def _temps(result: ScanResult, now: float) -> dict[str, list[Temp]]:
    """Temporaries found by the walk, by the run they belong to: those whose writer is gone (with the space they take
    and why), and those written to lately (a save in progress)."""
    if not result.temps:
        return {}
    run_of: dict[str, str] = {}
    dir_candidates: list[tuple[str, str]] = []
    for c in result.candidates:
        if c.kind == "dir":
            dir_candidates.append((c.path, c.run))
        else:
            run_of.setdefault(os.path.dirname(c.path), c.run)
    by_dir: dict[str, list[str]] = {}
    for temp in result.temps:
        directory, name = os.path.split(temp)
        by_dir.setdefault(directory, []).append(name)
    found: dict[str, list[Temp]] = {}
    for directory, names in by_dir.items():
        run = run_of.get(directory) or next(
            (r for p, r in dir_candidates if directory == p or directory.startswith(p + "/")), directory
        )
        try:
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            for name in names:
                orphan = orphaned_temp(dir_fd, name, now)
                path = os.path.join(directory, name)
                if orphan is not None:
                    found.setdefault(run, []).append(Temp(path, False, orphan.allocated_bytes, orphan.why))
                elif _changed_lately(dir_fd, name, now):
                    found.setdefault(run, []).append(Temp(path, True))
        finally:
            os.close(dir_fd)
    return found


def _owner(directory: str) -> int | None:
    """The uid that owns the run directory, as the kernel reports it (a directory only, never through a link)."""
    try:
        st = os.lstat(directory)
    except OSError:
        return None
    return st.st_uid if stat.S_ISDIR(st.st_mode) else None


def scan_unit(path_bytes: bytes, params_hex: str) -> str:
    cpu_started = time.thread_time()
    params = json.loads(bytes.fromhex(params_hex))
    path = os.fsdecode(path_bytes)
    unit = _unit(path, params)
    now, settle = float(params["now"]), float(params["settle"])
    limits = limits_from(params)
    budget = params.get("check_seconds")
    check_until = None if budget is None else time.monotonic() + float(budget)
    with unit.lock:
        result = unit.scanner.scan()
        errors: dict[str, int] = {}
        rejected: dict[str, int] = {}
        verdicts: dict[str, tuple[tuple[int, float], CheckResult]] = {}
        runs: dict[str, list[Checkpoint]] = {}
        fresh = 0
        for run in result.runs:
            events = _event_log(unit, run.path, {c.path: c for c in run.candidates}, now, rejected)
            made = runs[run.path] = []
            for c in run.candidates:
                footprint = (c.size_bytes, c.newest_mtime)
                cached = unit.verdicts.get(c.path)
                so_far = unit.checked_so_far.get(c.path)
                if (
                    cached is not None
                    and cached[0] == footprint
                    and cached[1].verdict != "incomplete"
                    and cached[1].limit not in TRANSIENT_LIMITS
                ):
                    checked = cached[1]  # unchanged and settled: the earlier verdict (cheap or deep) stands
                elif so_far is not None and so_far[0] == footprint:
                    checked = so_far[1]  # checked by a call of this pass that ran out of budget
                elif fresh and check_until is not None and time.monotonic() > check_until:
                    return _more(unit, verdicts, errors, rejected, cpu_started, result)
                else:
                    checked = guarded_check(c.path, False, now, settle, errors, c.size_bytes, c.newest_mtime, limits)
                    fresh += 1
                verdicts[c.path] = (footprint, checked)
                event = events.get(c.path)
                birth = None if event is not None or checked.verdict != "complete" else _birth(unit, c)
                made.append(_checkpoint(c, checked, event, birth))
        unit.checked_so_far = {}
        if result.truncated:
            # What lay beyond the bound was not seen this time: keep its verdicts, bounded by the scan's own bound.
            for p, v in unit.verdicts.items():
                if len(verdicts) >= 2 * unit.scanner.max_entries:
                    break
                verdicts.setdefault(p, v)
        unit.verdicts = verdicts
        unit.events = {r: e for r, e in unit.events.items() if r in runs}
        unit.births = {p: b for p, b in unit.births.items() if p in verdicts}
        temps = _temps(result, now)
        whole = tuple(
            Run(run, tuple(runs.get(run, ())), tuple(sorted(temps.get(run, ()), key=lambda t: t.path)), _owner(run))
            for run in sorted(runs.keys() | temps.keys())
        )
        seq, base, sent = next(_answer_numbers), 0, whole
        gone: tuple[str, ...] = ()
        if unit.sent_seq and params.get("have") == unit.sent_seq:
            base, before = unit.sent_seq, unit.sent_runs
            sent = tuple(r for r in whole if before.get(r.path) != r)
            gone = tuple(sorted(before.keys() - {r.path for r in whole}))
        unit.sent_seq, unit.sent_runs = seq, {r.path: r for r in whole}
        answer = UnitAnswer(
            root=unit.scanner.roots[0],
            runs=sent,
            seq=seq,
            base=base,
            gone=gone,
            cpu_seconds=time.thread_time() - cpu_started,
            truncated=result.truncated,
            truncated_reason=result.truncated_reason,
            truncated_detail=result.truncated_detail,
            seconds=result.stats.seconds,
            check_errors=errors,
            claims_rejected=rejected,
            datasets=result.datasets,
            unreadable=result.unreadable,
            unreadable_paths=result.unreadable_paths,
        )
    return json.dumps(to_wire(answer), separators=(",", ":"), allow_nan=False)


def _more(
    unit: _Unit,
    verdicts: dict[str, tuple[tuple[int, float], CheckResult]],
    errors: dict[str, int],
    rejected: dict[str, int],
    cpu_started: float,
    result: ScanResult,
) -> str:
    """The answer of a call that ran past its check budget: no runs (nothing partial is shown), ``more`` set; the
    checks it made are kept for the next call, which goes on from them."""
    unit.checked_so_far.update(verdicts)
    answer = UnitAnswer(
        root=unit.scanner.roots[0],
        runs=(),
        truncated=False,
        truncated_reason=None,
        truncated_detail=None,
        seconds=result.stats.seconds,
        check_errors=errors,
        claims_rejected=rejected,
        cpu_seconds=time.thread_time() - cpu_started,
        more=True,
    )
    return json.dumps(to_wire(answer), separators=(",", ":"), allow_nan=False)


def deep_check(path_bytes: bytes, params_hex: str) -> str:
    """The deep check of one checkpoint; its verdict goes into its unit's verdict cache (``unit`` in the
    parameters) when the checkpoint has not changed meanwhile, so the next scan reports it."""
    params = json.loads(bytes.fromhex(params_hex))
    errors: dict[str, int] = {}
    path = os.fsdecode(path_bytes)
    with _units_lock:
        unit = _units.get(str(params.get("unit", "")))
    before = None
    if unit is not None:
        with unit.lock:
            cached = unit.verdicts.get(path)
            before = cached[0] if cached is not None else None
    checked = guarded_check(
        path, True, float(params["now"]), float(params["settle"]), errors, 0, 0.0, limits_from(params)
    )
    if unit is not None and before is not None:
        with unit.lock:
            cached = unit.verdicts.get(path)
            if cached is not None and cached[0] == before:
                unit.verdicts[path] = (before, checked)
    record = Checkpoint(
        path,
        checked.format,
        checked.verdict,
        checked.reason,
        checked.size_bytes,
        checked.mtime,
        True,
        notes=checked.notes,
    )
    return json.dumps(to_wire(DeepAnswer(record, errors)), separators=(",", ":"), allow_nan=False)


OPS = {"ckpt_scan": scan_unit, "ckpt_deep": deep_check}


def command() -> list[str]:
    """How the agent starts this helper: isolated (``-I``: no environment, no user site, no current directory), with
    the tree this module comes from first on ``sys.path``."""
    tree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = f"import sys; sys.path.insert(0, {tree!r}); from storwatch._checkpoint_worker import main; main()"
    return [sys.executable, "-I", "-c", code]


def main() -> None:
    try:
        with open(HostPaths().proc("self", "oom_score_adj"), "w") as f:
            f.write(str(OOM_SCORE_ADJ))
    except OSError:
        pass  # not permitted here: the agent's own score then applies
    serve(OPS)
