"""Join checkpoint runs with the mounts they are on (a run's durability is its mount's), and decide which runs get
series and rows of their own when the node holds more than MAX_RUNS; what the rest add to the sums is kept."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from storwatch.analysis.copies import copy_dests, join_copies, without_copies
from storwatch.analysis.recovery import RunRecovery
from storwatch.analysis.view import LeftOut, MountView, RunView
from storwatch.analysis.writes import (
    EventSave,
    burst_writers,
    event_saves,
    run_writes,
    synced_saves,
    timed_by_file_events,
    timed_by_open_files,
)
from storwatch.checkpoints.record import Checkpoint, RunId
from storwatch.paths import HostPaths
from storwatch.vocabulary import Finding

if TYPE_CHECKING:
    from storwatch.sources.access import AccessFacts
    from storwatch.sources.checkpoints import CheckpointFacts, RunState
    from storwatch.sources.copies import CopiesFacts
    from storwatch.sources.fileevents import FileEventFacts

MAX_RUNS = 100
"""Runs with series and rows of their own (keep_runs): the run label stays bounded whatever the node holds. The sums
(important bytes, GPU-seconds at risk, counts) are over every run all the same."""


def _text(name: str) -> str:
    """A path as text fit for a label: bytes that are not UTF-8 escaped, at most its last 160 characters."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")[-160:]


def run_labels(runs: Iterable[RunState]) -> dict[RunId, str]:
    """A label for each run, unique on the node: its path below its root, or, where runs below different roots
    share that path, its whole path."""
    runs = list(runs)
    short = {r.id: _text(r.id.below_root) for r in runs}
    taken = Counter(short.values())
    return {rid: label if taken[label] == 1 else _text(rid.path) for rid, label in short.items()}


def host_path(paths: HostPaths, local: str) -> str:
    """A path as this process reaches it (under ``--path.rootfs``) as the host names it."""
    rootfs = paths.rootfs.rstrip("/")
    if rootfs and (local == rootfs or local.startswith(rootfs + "/")):
        return local[len(rootfs) :] or "/"
    return local


def mount_locator(mounts: tuple[MountView, ...], paths: HostPaths) -> Callable[[str], MountView | None]:
    """The mount a path (as this process reaches it, under the host root) is on: the longest mountpoint that is a
    prefix of it (a path's own directories looked up from the deepest, not every mount tried: a View asks this of
    each of hundreds of runs)."""
    local: dict[str, MountView] = {}
    for mv in mounts:
        local.setdefault(paths.root(mv.mount.mountpoint).rstrip("/"), mv)

    def mount_of(path: str) -> MountView | None:
        prefix = path
        while True:
            mv = local.get(prefix)
            if mv is not None:
                return mv
            cut = prefix.rfind("/")
            if cut < 0:
                return local.get("")
            prefix = prefix[:cut]

    return mount_of


def run_views(
    facts: CheckpointFacts | None,
    mounts: tuple[MountView, ...],
    paths: HostPaths,
    access: AccessFacts | None = None,
    copies: CopiesFacts | None = None,
    events: FileEventFacts | None = None,
) -> tuple[RunView, ...]:
    """Every run the scan holds with its mount, newest first (unbounded: keep_runs bounds what gets series), with
    each save's span from the kernel's file events, else from what the GPU processes' open files say
    (analysis/writes.py), and its durable copies (analysis/copies.py); a run made only of verified copies of ours is
    no run of its own. A checkpoint a file of which is still open for writing is not yet one to restore from."""
    if facts is None or not facts.runs:
        return ()
    mount_of = mount_locator(mounts, paths)

    runs = sorted(facts.runs, key=lambda r: max((c.mtime for c in r.checkpoints), default=0.0), reverse=True)
    labels = run_labels(facts.runs)
    spans = events.spans if events is not None else ()
    writes = run_writes(access, (r.id for r in runs), paths, spans)
    out = []
    for r in runs:
        saves = event_saves(r.path, spans) if spans else ()
        saves, syncers = synced_saves(r, saves, access, paths) if saves else ((), ())
        checkpoints = tuple(_judged(c, saves) for c in r.checkpoints) if saves else r.checkpoints
        w = writes.get(r.id)
        if w is not None:
            checkpoints = tuple(timed_by_open_files(c, w.files) for c in checkpoints)
        open_since = min((s.start for s in saves if s.end is None and s.start is not None), default=None)
        if w is not None and w.open_since is not None:
            open_since = w.open_since if open_since is None else min(open_since, w.open_since)
        run = dataclasses.replace(r, checkpoints=checkpoints) if checkpoints is not r.checkpoints else r
        writers = tuple(sorted(set(w.writers if w is not None else ()) | set(syncers)))
        if not writers and saves:  # each save too quick to be seen open: the write counters' bursts say who
            writers = burst_writers(run, saves, access)
        out.append(
            RunView(
                run,
                labels[r.id],
                mount_of(r.path),
                host_path(paths, r.path),
                writers,
                open_since,
                writers_seen=w.writers_seen if w is not None else (),
                saves=saves,
            )
        )
    found = copies.copies if copies is not None else ()
    if found:
        out = without_copies(out, copy_dests(found, paths))
    return tuple(join_copies(out, found, paths))


def _judged(c: Checkpoint, saves: tuple[EventSave, ...]) -> Checkpoint:
    """A checkpoint timed by its file events; one the scan judged complete while a file of it is still open for
    writing (written out, but not yet flushed and closed) is still being written."""
    timed, writing = timed_by_file_events(c, saves)
    if writing and timed.verdict == "complete":
        return dataclasses.replace(
            timed,
            verdict="incomplete",
            reason="being written: a file of it is still open for writing (its writer has not closed it yet)",
        )
    return timed


@dataclass(frozen=True)
class KeptRuns:
    """The runs that get series and rows of their own, their recovery figures and findings, and what the rest add."""

    runs: tuple[RunView, ...]
    recovery: tuple[RunRecovery, ...]
    findings: tuple[Finding, ...]
    left_out: LeftOut


def keep_runs(
    runs: tuple[RunView, ...],
    recovery: tuple[RunRecovery, ...],
    findings: tuple[Finding, ...],
    limit: int = MAX_RUNS,
) -> KeptRuns:
    """At most ``limit`` of ``runs`` (newest first, as run_views gives them), with their recovery figures and
    findings (``recovery`` and ``findings`` computed over every run). The runs an operator most needs to see come
    first: those with GPU-seconds at risk, then those with a critical finding, then any finding, then the newest.
    Dataset findings are kept (the scan bounds them). What the runs left out carry goes to ``left_out``, so each sum
    stays whole."""
    risk = {r.run: r.gpu_seconds_at_risk for r in recovery}
    run_findings: dict[str, list[Finding]] = {}
    for f in findings:
        if f.kind != "dataset":
            run_findings.setdefault(f.run, []).append(f)

    def rank(item: tuple[int, RunView]) -> tuple[bool, bool, bool, int]:
        i, rv = item
        mine = run_findings.get(rv.label, ())
        return (risk.get(rv.id) is None, not any(f.severity == "critical" for f in mine), not mine, i)

    chosen = {i for i, _ in sorted(enumerate(runs), key=rank)[: max(0, limit)]}
    kept = tuple(rv for i, rv in enumerate(runs) if i in chosen)
    if len(kept) == len(runs):
        return KeptRuns(runs, recovery, findings, LeftOut())
    kept_ids = {rv.id for rv in kept}
    kept_labels = {rv.label for rv in kept}
    dropped_labels = {rv.label for rv in runs} - kept_labels
    dropped_findings = [f for f in findings if f.kind != "dataset" and f.run in dropped_labels]
    important: dict[tuple[str, str], int] = {}
    for f in dropped_findings:
        important[(f.mountpoint, f.kind)] = important.get((f.mountpoint, f.kind), 0) + f.bytes
    at_risk = sum(r.gpu_seconds_at_risk or 0.0 for r in recovery if r.run is not None and r.run not in kept_ids)
    return KeptRuns(
        kept,
        tuple(r for r in recovery if r.run is None or r.run in kept_ids),
        tuple(f for f in findings if f.kind == "dataset" or f.run not in dropped_labels),
        LeftOut(len(runs) - len(kept), len(dropped_findings), important, at_risk),
    )
