"""Which GPU work writes each checkpoint run, and when each of its checkpoints was written, for the jobs that never
import storwatch (plain ``torch.save``, the Hugging Face Trainer, ``dcp.save``): from the files the access source saw
a GPU process, or one below it, hold open for writing (sources/access.py), the kernel's word for who writes what.

- **Who writes a run**: the GPU processes seen holding a checkpoint's file open for writing under the run's
  directory (a log or an event file written beside the checkpoints is not a checkpoint's file). Off Kubernetes, this
  ties a run to the GPUs it holds up and to its GPU-seconds at risk; on Kubernetes the pod whose volume holds the run
  does already.
- **A save in progress**: such a file open now. The run is ``writing`` while it is, and its GPUs' time waits for the
  save's end before it is attributed (analysis/stall_feed.py).
- **The span of a save**: from the kernel's file events where they are (``event_saves``, ``timed_by_file_events``:
  its creation to its close or its move into place, and to the close of a second descriptor its writer opened to
  sync it, ``synced_saves``); else its files' birth (the checkpoint source's statx: the start only) or, where the
  filesystem keeps no birth time, when they were first seen open, to when they were seen closed (the access source
  looks again every WATCH_SECONDS while they are open, so past the last write: an fsync, a flush, the close).
  atomic_save's event log stays the exact source where present. A span whose ends are known only to within more than
  SPAN_TOLERANCE of its length is no duration: ``write_seconds`` None, with the reason.
- **Who writes a run, where no save is seen open**: the workload that held a checkpoint open again just after
  writing it to sync it (``synced_saves``), the one whose temporary under another name was renamed into the run
  (``run_writes``), or the one whose write bursts match its saves (``burst_writers``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from storwatch.checkpoints.record import Checkpoint, RunId
from storwatch.checkpoints.scan import checkpoint_member
from storwatch.paths import HostPaths
from storwatch.sources.access import AccessFacts, WrittenFile

if TYPE_CHECKING:
    from storwatch.sources.checkpoints import RunState
    from storwatch.sources.fileevents import FileSpan

SPAN_TOLERANCE = 0.25
"""The most a write span's two ends together may be uncertain by, as a share of its length, to be a duration."""
MAX_DEPTH = 64
"""Directories looked up from a written file for the run holding it."""


@dataclass(frozen=True)
class RunWrites:
    """What the open files say of one run."""

    writers: tuple[int, ...] = ()
    """The GPU processes (as NVML names them) whose work was seen writing a checkpoint of the run."""
    open_since: float | None = None
    """When the first of the checkpoint files open for writing now was first seen open; None when none is open."""
    files: tuple[WrittenFile, ...] = ()
    """The checkpoint files seen written under the run (paths as this process reaches them)."""
    writers_seen: tuple[tuple[int, float], ...] = ()
    """Each writer, and the newest look that found its work holding one of those files open."""


def run_writes(
    access: AccessFacts | None, runs: Iterable[RunId], paths: HostPaths, spans: Iterable[FileSpan] = ()
) -> dict[RunId, RunWrites]:
    """The writes the open files show, by run (runs with none are left out). A file written under another name and
    then renamed into a run as a checkpoint (``spans``: the file events' renames; Lightning's temporary in a TMPDIR on
    the same filesystem) is that checkpoint's, where the writer was seen holding it open under its old name after it
    was made there and before the rename: a name is one file at a time, so the kernel's link then named the very file
    moved in."""
    if access is None or not (access.workloads or access.ended):
        return {}
    by_path = {rid.path.rstrip("/") or "/": rid for rid in runs}
    renamed = {
        s.moved_from: s
        for s in spans
        if s.kind == "file" and s.moved_from is not None and s.start is not None and s.end is not None
    }
    found: dict[RunId, tuple[dict[int, float], list[WrittenFile]]] = {}
    written = [(w.within if w.within is not None else w.pid, f) for w in access.workloads.values() for f in w.written]
    for writer, f in [*written, *((None, f) for f in access.ended)]:
        local = paths.root(f.path)
        rid, below = _run_of(local, by_path)
        if rid is None or not checkpoint_member(below):
            moved = renamed.get(local)
            if moved is None or not _held_before_the_rename(f, moved):
                continue
            local = moved.path
            rid, below = _run_of(local, by_path)
            if rid is None or not checkpoint_member(below):
                continue
        writers, files = found.setdefault(rid, ({}, []))
        if writer is not None:  # a workload that has ended holds up no GPU
            writers[writer] = max(writers.get(writer, f.last_open), f.last_open)
        files.append(dataclasses.replace(f, path=local))
    out = {}
    for rid, (writers, files) in found.items():
        opened = [f.first_seen for f in files if f.open]
        out[rid] = RunWrites(
            tuple(sorted(writers)), min(opened) if opened else None, tuple(files), tuple(sorted(writers.items()))
        )
    return out


RENAME_SLACK_SECONDS = 0.5
"""How far before the file events' stamp of a temporary's making a look may have found it open: the helper stamps
each event when it reads it, moments after it happened."""


def _held_before_the_rename(f: WrittenFile, moved: FileSpan) -> bool:
    """Whether a look found ``f`` open under the temporary's name between its making and its rename."""
    assert moved.start is not None and moved.end is not None
    return f.last_open >= moved.start - RENAME_SLACK_SECONDS and f.first_seen <= moved.end


def _run_of(path: str, runs: Mapping[str, RunId]) -> tuple[RunId | None, str]:
    """The deepest run directory holding ``path``, and the path below it."""
    directory = path
    for _ in range(MAX_DEPTH):
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
        rid = runs.get(directory)
        if rid is not None:
            return rid, path[len(directory.rstrip("/")) + 1 :]
    return None, ""


def _members(c: Checkpoint, files: Iterable[WrittenFile]) -> list[WrittenFile]:
    """The written files of this checkpoint's write: its file, or files in its directory, open while it was written
    (a later write to the same name, seen open after the checkpoint's last change, is another save)."""
    prefix = c.path.rstrip("/") + "/"
    start = c.write_start if c.write_start is not None else -math.inf
    return [
        f
        for f in files
        if (f.path == c.path or f.path.startswith(prefix))
        and (f.looked_before if f.looked_before is not None else -math.inf) <= c.mtime
        and (f.closed_by is None or f.closed_by >= start)
    ]


def timed_by_open_files(c: Checkpoint, files: Iterable[WrittenFile]) -> Checkpoint:
    """The checkpoint with its write span from its open files where they were seen: from its birth (or, without
    one, from its files first seen open) to when the last of them was seen closed. An event log's span is kept; a
    checkpoint with a file still open is left as it is (its save goes on)."""
    if c.write_timed_by in ("event_log", "file_events"):
        return c
    mine = _members(c, files)
    if not mine or any(f.open for f in mine):
        return c
    assert all(f.closed_by is not None for f in mine)
    last = max(mine, key=lambda f: (f.last_open + (f.closed_by or 0.0)) / 2)
    born_end = None
    if c.write_timed_by is None and c.write_start is not None:
        # Its birth (the scan's statx) starts it; it ended no earlier than its last change.
        start, start_doubt, born_end = c.write_start, 0.0, max(c.mtime, c.write_start)
    else:
        first = min(mine, key=lambda f: f.first_seen)
        start = first.first_seen
        start_doubt = first.first_seen - first.looked_before if first.looked_before is not None else math.inf
    # The save ended after the last look that found its file open (and after its last change, where the birth time
    # spans it) and before the first look that found it closed: the middle of that.
    low = last.last_open if born_end is None else max(last.last_open, born_end)
    high = max(last.closed_by or low, low)
    end, end_doubt = (low + high) / 2, (high - low) / 2
    seconds = end - start
    doubt = start_doubt + end_doubt
    if not seconds > 0 or doubt > SPAN_TOLERANCE * seconds:
        if born_end is not None and last.last_open <= born_end:
            reason = (
                f"its birth time starts it, but it was seen closed only {high - low:.2f} s after its last change: its "
                "end (an fsync, the close) is not known closer than that (looks at the writer's open files came too "
                "far apart)"
            )
        elif born_end is not None:
            # Seen open past its last change (an fsync): the birth time's span leaves that out, so it is no duration.
            reason = (
                f"seen open for writing {last.last_open - start:.2f} s after its birth, past its last change, but "
                f"its end is known only to within {doubt:.2f} s (looks at the writer's open files came too far apart)"
            )
        elif math.isfinite(doubt):
            reason = (
                f"seen open for writing, but its start and end are known only to within {doubt:.2f} s "
                f"of a {max(seconds, 0.0):.2f} s write (no birth time on this filesystem; looks "
                f"at the writer's open files came too far apart)"
            )
        else:
            reason = "seen open for writing only once the write had begun, and this filesystem keeps no birth time"
        return dataclasses.replace(
            c, write_seconds=None, write_bytes_per_second=None, write_timed_by=None, write_untimed_reason=reason
        )
    return dataclasses.replace(
        c,
        write_start=start,
        write_seconds=seconds,
        write_bytes_per_second=c.size_bytes / seconds,
        write_timed_by="open_files",
        write_untimed_reason=None,
    )


SAVE_GAP_SECONDS = 30.0
"""Two writes to one checkpoint directory further apart than this are two saves (a directory saved over again)."""


@dataclass(frozen=True)
class EventSave:
    """One save of one checkpoint, from the kernel's file events (sources/fileevents.py)."""

    checkpoint: str
    """The checkpoint it writes (a file, or the top directory below the run), as this process reaches it."""
    start: float | None
    """Its first file's creation (or first write), or its directory's making; None when it began out of sight."""
    end: float | None
    """Its last file's close, or its move into place; None while a file of it is still open for writing (or, once
    ``synced_saves`` has shown it its writer's, while the writer still holds a file of it open again to sync it)."""
    reopened: float | None = None
    """A file of it opened again just after its close after writing (FileSpan.reopened): when; None if none was."""
    reclosed: float | None = None
    """When the last such second descriptor closed; None while one is open (or none was opened)."""


def event_saves(run_path: str, spans: Iterable[FileSpan]) -> tuple[EventSave, ...]:
    """The saves below a run's directory that the file events show, oldest first: a checkpoint file's each write,
    and a checkpoint directory's writes, one save per burst (directory made or moved in, files written in it)."""
    prefix = run_path.rstrip("/") + "/"
    renamed = {(s.moved_from, s.start) for s in spans if s.moved_from is not None}
    by_top: dict[str, list[FileSpan]] = {}
    for s in spans:
        if not s.path.startswith(prefix) or (s.path, s.start) in renamed:
            continue  # a temporary renamed into place: its save is its final name's
        below = s.path[len(prefix) :]
        top = below.split("/", 1)[0]
        if "/" not in below and s.kind == "file" and not checkpoint_member(below):
            continue
        by_top.setdefault(prefix + top, []).append(s)
    out: list[EventSave] = []
    for top, members in by_top.items():
        if all(s.path == top and s.kind == "file" for s in members):  # a checkpoint file: each span one save
            out.extend(EventSave(top, s.start, s.end, s.reopened, s.reclosed) for s in members)
            continue
        # A directory: its spans in time, a save per burst.
        members.sort(key=lambda s: s.start if s.start is not None else (s.end or math.inf))
        burst: list[FileSpan] = []
        for s in members:
            at = s.start if s.start is not None else s.end
            last = max((x.end or x.start or -math.inf for x in burst), default=None)
            if burst and at is not None and last is not None and at - last > SAVE_GAP_SECONDS:
                out.append(_burst(top, burst))
                burst = []
            burst.append(s)
        if burst:
            out.append(_burst(top, burst))
    out.sort(key=lambda e: e.end if e.end is not None else math.inf)
    return tuple(out)


def _burst(top: str, spans: list[FileSpan]) -> EventSave:
    starts = [s.start for s in spans if s.start is not None]
    files = [s for s in spans if s.kind == "file"]
    if any(s.end is None for s in files):
        return EventSave(top, min(starts, default=None), None)
    ends = [s.end for s in spans if s.end is not None]
    reopened = [s for s in files if s.reopened is not None]
    recloses = [s.reclosed for s in reopened]
    return EventSave(
        top,
        min(starts, default=None),
        max(ends, default=None),
        min((s.reopened for s in reopened if s.reopened is not None), default=None),
        None if not recloses or None in recloses else max(r for r in recloses if r is not None),
    )


def timed_by_file_events(c: Checkpoint, saves: Iterable[EventSave]) -> tuple[Checkpoint, bool]:
    """The checkpoint with its write span from the file events (its save whose end is at or after its last change),
    and whether a save of it is being written now (a file of it still open: not yet a checkpoint to restore from).
    An event log's span is kept. A save that began out of sight (moved in from a directory not watched) starts at the
    file's birth where the filesystem keeps one, else it is not timed."""
    mine = [s for s in saves if s.checkpoint == c.path]
    writing = any(s.end is None for s in mine)
    if c.write_timed_by == "event_log":
        return c, writing
    ended = [s for s in mine if s.end is not None and s.end >= c.mtime - EVENT_SLACK_SECONDS]
    if not ended:
        return c, writing
    save = min(ended, key=lambda s: s.end or math.inf)  # the save that wrote what the scan saw
    assert save.end is not None
    start = save.start
    if start is None and c.write_start is not None:
        start = c.write_start  # a temporary written elsewhere and renamed in keeps its inode, and its birth
    if start is None or not save.end > start:
        reason = "its file was moved in from a directory not watched, and this filesystem keeps no birth time"
        return dataclasses.replace(
            c, write_seconds=None, write_bytes_per_second=None, write_timed_by=None, write_untimed_reason=reason
        ), writing
    seconds = save.end - start
    return dataclasses.replace(
        c,
        write_start=start,
        write_seconds=seconds,
        write_bytes_per_second=c.size_bytes / seconds,
        write_timed_by="file_events",
        write_untimed_reason=None,
    ), writing


EVENT_SLACK_SECONDS = 0.01
"""A file's mtime is set by its last write, before the close (or the rename) that ends its save: the save that wrote
what the scan saw ends at or after it, give or take the clock's coarse ticks."""


BURST_SLACK_SECONDS = 0.5
"""How far outside a save's span a write burst may begin or end and still be its writer's: the burst is known only
between two looks at the write counters."""
MATCHED_SAVES = 8
"""The newest saves matched with the write bursts (those of the last minutes)."""


def burst_writers(run: RunState, saves: Sequence[EventSave], access: AccessFacts | None) -> tuple[int, ...]:
    """The GPU workloads whose write bursts match the run's newest saves (analysis/writes.py ``event_saves``): a
    workload whose processes passed about a checkpoint's bytes to write calls while it was written (at least half of
    them, at most twice them: a job writing a checkpoint three times the size is writing another one), of the run's
    owner (or root). A save that one workload alone matches ties it; where several jobs save at once, the one
    workload that matched every one of the run's saves it could have written does. What ties a run to its GPUs
    where each save is too quick to be seen open: the kernel's write counters and the kernel's file events, never a
    name. Two jobs that save the same bytes at the same moments stay untied: their GPUs are unknown. A save is judged
    once the counters were read after its window ended (``access.timestamp``): before that its writer's burst may be
    counted only in part while another job's, saving at the same time elsewhere, is whole, and would tie the run to
    that job. Likewise a save is judged only once the scan found its checkpoint complete: the size of one seen in the
    middle of its save is a part, which another job's smaller save could match."""
    if access is None or not access.workloads:
        return ()
    sizes = _whole_sizes(run)
    found: set[int] = set()
    candidates: list[set[int]] = []
    for save in list(saves)[-MATCHED_SAVES:]:
        size = sizes.get(save.checkpoint)
        if save.start is None or save.end is None or not size:
            continue
        low, high = save.start - BURST_SLACK_SECONDS, save.end + BURST_SLACK_SECONDS
        if access.timestamp < high:
            continue  # the counters not yet read after it: judged at a later View
        matched: set[int] = set()
        for pid, w in access.workloads.items():
            if run.uid is not None and w.uid is not None and w.uid not in (run.uid, 0):
                continue
            wrote = sum(n for begun, seen, n in w.write_bursts if seen >= low and begun <= high)
            if size / 2 <= wrote <= 2 * size + BURST_SIZE_SLACK_BYTES:
                matched.add(w.within if w.within is not None else pid)
        if len(matched) == 1:
            found |= matched
        elif matched:
            candidates.append(matched)
    if not found and len(candidates) > 1:
        common = set.intersection(*candidates)
        if len(common) == 1:
            found = common
    return tuple(sorted(found))


def _whole_sizes(run: RunState) -> dict[str, int]:
    """Each checkpoint's bytes, where the scan found it complete: an incomplete one's size may be what a scan saw in
    the middle of its save, a part that another job's smaller save, made at the same moment, would match."""
    return {c.path: c.size_bytes for c in run.checkpoints if c.verdict == "complete"}


BURST_SIZE_SLACK_BYTES = 1 << 20
"""What a save's burst may carry beyond twice the checkpoint's bytes (a log line, a small file beside it)."""


HOLD_SLACK_SECONDS = 0.5
"""How far before the file events' stamp of a close after writing a look may have found the writer's second
descriptor open: the helper stamps each event when it reads it, moments after it happened."""


def synced_saves(
    run: RunState, saves: Sequence[EventSave], access: AccessFacts | None, paths: HostPaths
) -> tuple[tuple[EventSave, ...], tuple[int, ...]]:
    """The run's saves, each whose file was opened again just after its close after writing (``torch.save``, then
    the file opened and fsynced) counted to that second descriptor's close where the kernel shows it was the writer's:
    one GPU workload, and only one, had a process seen holding that file open then, and either was seen writing it or
    passed at least half the checkpoint's bytes to write calls while it was written (its write bursts). Such a save
    is still being written (``end`` None) while that descriptor is open. Also the workloads so shown to write the
    run. A reopen no workload so accounts for (a reader's, this agent's own check of the file) leaves its save ending
    at its close after writing."""
    if access is None or not access.workloads or not any(s.reopened is not None for s in saves):
        return tuple(saves), ()
    sizes = _whole_sizes(run)
    out: list[EventSave] = []
    writers: set[int] = set()
    for s in saves:
        found = _syncers(s, sizes.get(s.checkpoint), access, paths) if s.reopened is not None else set()
        if len(found) != 1:
            out.append(s)
            continue
        writers |= found
        out.append(dataclasses.replace(s, end=s.reclosed))
    out.sort(key=lambda e: e.end if e.end is not None else math.inf)
    return tuple(out), tuple(sorted(writers))


def _syncers(save: EventSave, size: int | None, access: AccessFacts, paths: HostPaths) -> set[int]:
    """The workloads that held a file of ``save`` open again after its close after writing, and wrote it."""
    assert save.end is not None
    prefix = save.checkpoint.rstrip("/") + "/"

    def mine(path: str) -> bool:
        local = paths.root(path)
        return local == save.checkpoint or local.startswith(prefix)

    closed = save.reclosed if save.reclosed is not None else math.inf
    low = (save.start if save.start is not None else save.end) - BURST_SLACK_SECONDS
    high = save.end + BURST_SLACK_SECONDS
    found: set[int] = set()
    for pid, w in access.workloads.items():
        if not any(
            mine(h.path) and h.last_seen >= save.end - HOLD_SLACK_SECONDS and h.first_seen <= closed for h in w.held
        ):
            continue
        seen_writing = any(
            mine(f.path) and f.first_seen <= high and (f.closed_by if f.closed_by is not None else math.inf) >= low
            for f in w.written
        )
        wrote = sum(n for begun, seen, n in w.write_bursts if seen >= low and begun <= high)
        if seen_writing or (size and wrote >= size / 2):
            found.add(w.within if w.within is not None else pid)
    return found
