"""Which GPU work writes each checkpoint run, and when each of its checkpoints was written, for the jobs that never
import storwatch (plain ``torch.save``, the Hugging Face Trainer, ``dcp.save``): from the files the access source saw
a GPU process, or one below it, hold open for writing (sources/access.py), the kernel's word for who writes what.

- **Who writes a run**: the GPU processes seen holding a checkpoint's file open for writing under the run's
  directory (a log or an event file written beside the checkpoints is not a checkpoint's file). Off Kubernetes, this
  ties a run to the GPUs it holds up and to its GPU-seconds at risk; on Kubernetes the pod whose volume holds the run
  does already.
- **A save in progress**: such a file open now. The run is ``writing`` while it is, and its GPUs' time waits for the
  save's end before it is attributed (analysis/stall_feed.py).
- **The span of a save**: its files' birth (the checkpoint source's ``birth_mtime``, exact) or, where the filesystem
  keeps no birth time, when they were first seen open, to when they were seen closed (the access source looks again
  every WATCH_SECONDS while they are open, so past the last write: an fsync, a flush, the close). atomic_save's event
  log stays the exact source where present. A span whose ends are known only to within more than SPAN_TOLERANCE of
  its length is no duration: ``write_seconds`` None, with the reason.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from storwatch.checkpoints.record import Checkpoint, RunId
from storwatch.checkpoints.scan import checkpoint_member
from storwatch.paths import HostPaths
from storwatch.sources.access import AccessFacts, WrittenFile

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


def run_writes(access: AccessFacts | None, runs: Iterable[RunId], paths: HostPaths) -> dict[RunId, RunWrites]:
    """The writes the open files show, by run (runs with none are left out)."""
    if access is None or not (access.workloads or access.ended):
        return {}
    by_path = {rid.path.rstrip("/") or "/": rid for rid in runs}
    found: dict[RunId, tuple[dict[int, float], list[WrittenFile]]] = {}
    written = [(w.within if w.within is not None else w.pid, f) for w in access.workloads.values() for f in w.written]
    for writer, f in [*written, *((None, f) for f in access.ended)]:
        local = paths.root(f.path)
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
    if c.write_timed_by == "event_log":
        return c
    mine = _members(c, files)
    if not mine or any(f.open for f in mine):
        return c
    assert all(f.closed_by is not None for f in mine)
    last = max(mine, key=lambda f: (f.last_open + (f.closed_by or 0.0)) / 2)
    born_end = None
    if c.write_timed_by == "birth_mtime" and c.write_start is not None and c.write_seconds is not None:
        start, start_doubt, born_end = c.write_start, 0.0, c.write_start + c.write_seconds
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
            return c  # nothing seen open after its last change: the birth time's span stands
        if born_end is not None:
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
