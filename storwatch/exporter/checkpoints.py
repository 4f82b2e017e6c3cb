"""The checkpoints area: each run's newest complete checkpoint with the durability of the mount it is on, its size,
write time and interval, what the run keeps, and the scan's stuck roots and check errors (storwatch_checkpoint_*);
its recovery point and recommended interval (storwatch_recovery_point_seconds, analysis/rpo.py). Runs past the bound
(analysis/checkpoints.py MAX_RUNS) have no series of their own: they are counted (storwatch_checkpoint_series_dropped)
and still in every sum (storwatch_ephemeral_important_bytes, storwatch_checkpoint_dropped_gpu_seconds_at_risk)."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.view import View
from storwatch.exporter import catalog
from storwatch.exporter.area import ExportState
from storwatch.exporter.text import Family
from storwatch.sources.mounts import display_path


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    if view is None:
        return
    last = catalog.CHECKPOINT_LAST_COMPLETE.family()
    size = catalog.CHECKPOINT_SIZE.family()
    write_duration = catalog.CHECKPOINT_WRITE_DURATION.family()
    write_rate = catalog.CHECKPOINT_WRITE_RATE.family()
    interval = catalog.CHECKPOINT_INTERVAL.family()
    kept = catalog.CHECKPOINT_KEPT.family()
    incomplete = catalog.CHECKPOINT_INCOMPLETE.family()
    corrupt = catalog.CHECKPOINT_CORRUPT.family()
    unsafe = catalog.CHECKPOINT_UNSAFE.family()
    in_progress = catalog.CHECKPOINT_WRITE_IN_PROGRESS.family()
    orphaned = catalog.CHECKPOINT_ORPHANED_TEMP_BYTES.family()
    for rv in view.checkpoints:
        run = rv.run
        label = (rv.label,)
        newest = run.newest_complete
        if newest is not None:
            durability = rv.mount.verdict.durability.value if rv.mount else "unknown"
            mountpoint = display_path(rv.mount.mount.mountpoint) if rv.mount else ""
            last.add((rv.label, durability, mountpoint), newest.mtime)
            size.add(label, newest.size_bytes)
            timed = next((c for c in reversed(run.complete) if c.write_seconds is not None), None)
            if timed is not None and timed.write_seconds is not None:
                write_duration.add(label, timed.write_seconds)
                write_rate.add(label, timed.write_bytes_per_second)
        interval.add(label, run.interval_seconds)
        kept.add(label, len(run.complete))
        incomplete.add(label, run.incomplete)
        corrupt.add(label, run.corrupt)
        unsafe.add(label, run.unsafe)
        in_progress.add(label, 1 if rv.writing else 0)
        orphaned.add(label, run.orphaned_temp_bytes)
    yield from (last, size, write_duration, write_rate, interval, kept, incomplete, corrupt, unsafe, in_progress)
    yield orphaned
    yield from _recovery(view)
    yield from _findings(view)
    facts = view.checkpoint_scan
    if facts is None:
        return
    stuck = catalog.CHECKPOINT_ROOT_STUCK.family()
    stuck_roots = {s.path for s in facts.stuck_roots}
    for root in sorted({*facts.roots, *stuck_roots}):
        stuck.add((display_path(root),), 1 if root in stuck_roots else 0)
    errors = catalog.CHECKPOINT_CHECK_ERRORS.family()
    for reason, count in sorted(facts.check_errors.items()):
        errors.add((reason,), count)
    claims = catalog.CHECKPOINT_CLAIMS_REJECTED.family()
    for reason, count in sorted(facts.claims_rejected.items()):
        claims.add((reason,), count)
    unreadable = catalog.CHECKPOINT_UNREADABLE.family()
    refused = {u.path: u.entries for u in facts.unreadable}
    for root in sorted({*facts.roots, *refused}):
        unreadable.add((display_path(root),), refused.get(root, 0))
    yield from (stuck, errors, claims, unreadable)


def _recovery(view: View) -> Iterator[Family]:
    point = catalog.RECOVERY_POINT.family()
    overhead = catalog.CHECKPOINT_OVERHEAD.family()
    recommended = catalog.CHECKPOINT_RECOMMENDED_INTERVAL.family()
    at_risk = catalog.GPU_SECONDS_AT_RISK.family()
    headroom = catalog.CHECKPOINT_HEADROOM.family()
    by_tier = catalog.CHECKPOINT_TIER_WRITE.family()
    copied = catalog.DURABLE_COPY.family()
    for rv in view.checkpoints:
        if rv.newest_copy is not None:
            copied.add((rv.label,), rv.newest_copy.covers)
    for r in view.recovery:
        label = (r.label,)
        for tier, seconds in sorted(r.tier_write_seconds.items()):
            by_tier.add((r.label, tier), seconds)
        if r.headroom_bytes is not None:
            headroom.add(label, r.headroom_bytes)
        risk = r.gpu_seconds_at_risk
        if risk is not None:
            at_risk.add(label, risk)
        point.add(label, r.recovery_point_seconds)
        if r.overhead_ratio is not None:
            overhead.add(label, r.overhead_ratio)
        if r.recommended_interval_seconds is not None:
            recommended.add(label, r.recommended_interval_seconds)
    dropped_risk = catalog.CHECKPOINT_DROPPED_GPU_SECONDS_AT_RISK.family()
    dropped_risk.add((), view.left_out.gpu_seconds_at_risk)
    yield from (point, overhead, recommended, at_risk, headroom, by_tier, dropped_risk, copied)


def _findings(view: View) -> Iterator[Family]:
    important = catalog.EPHEMERAL_IMPORTANT.family()
    finding = catalog.FINDING.family()
    dropped = catalog.CHECKPOINT_SERIES_DROPPED.family()
    for f in view.findings:
        finding.add((f.id, f.severity, f.kind, display_path(f.mountpoint), f.run), 1)
    by_mount: dict[tuple[str, str], int] = {}
    for (mountpoint, kind), size in view.important_bytes().items():  # over every run, those left out included
        key = (display_path(mountpoint), kind)
        by_mount[key] = by_mount.get(key, 0) + size
    for key, size in sorted(by_mount.items()):
        important.add(key, size)
    dropped.add(("run",), view.left_out.runs)
    dropped.add(("finding",), view.left_out.findings)
    yield from (important, finding, dropped)
