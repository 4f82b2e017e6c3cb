"""The checkpoints area: each run's newest complete checkpoint with the durability of the mount it is on, its size,
write time and interval, what the run keeps, and the scan's stuck roots and check errors (storwatch_checkpoint_*);
its recovery point and recommended interval (storwatch_recovery_point_seconds, analysis/rpo.py)."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.view import View
from storwatch.exporter.area import ExportState
from storwatch.exporter.text import Family
from storwatch.sources.mounts import display_path

_CHECKPOINT_GAUGES = (
    ("storwatch_checkpoint_size_bytes", "Size of the run's newest complete checkpoint."),
    ("storwatch_checkpoint_write_duration_seconds", "How long the newest timed complete checkpoint took to write."),
    ("storwatch_checkpoint_write_bytes_per_second", "Its size over its write duration."),
    ("storwatch_checkpoint_interval_seconds", "Time between the run's two newest complete checkpoints."),
    ("storwatch_checkpoint_kept", "Complete checkpoints the run keeps on disk."),
    ("storwatch_checkpoint_incomplete", "The run's incomplete checkpoints (being written, or abandoned mid-write)."),
    ("storwatch_checkpoint_corrupt", "The run's corrupt checkpoints (finished, then damaged, or never valid)."),
    (
        "storwatch_checkpoint_unsafe",
        "The run's unsafe checkpoints: a pickle in them names a global that runs code when loaded (never complete).",
    ),
    ("storwatch_checkpoint_write_in_progress", "1 while the run's newest checkpoint is incomplete."),
    (
        "storwatch_checkpoint_orphaned_temp_bytes",
        "Bytes of the run's atomic_save temporaries whose writer is gone (removed by the run's next atomic_save).",
    ),
)


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    if view is None:
        return
    last = Family(
        "storwatch_checkpoint_last_complete_timestamp_seconds",
        "Modification time of the run's newest complete checkpoint, with the durability of the mount it is on.",
        labels=("run", "durability", "mountpoint"),
    )
    gauges = {name: Family(name, help_, labels=("run",)) for name, help_ in _CHECKPOINT_GAUGES}
    for rv in view.checkpoints:
        run = rv.run
        label = (rv.label,)
        newest = run.newest_complete
        if newest is not None:
            durability = rv.mount.verdict.durability.value if rv.mount else "unknown"
            mountpoint = display_path(rv.mount.mount.mountpoint) if rv.mount else ""
            last.add((rv.label, durability, mountpoint), newest.mtime)
            gauges["storwatch_checkpoint_size_bytes"].add(label, newest.size_bytes)
            timed = next((c for c in reversed(run.complete) if c.write_seconds is not None), None)
            if timed is not None and timed.write_seconds is not None:
                gauges["storwatch_checkpoint_write_duration_seconds"].add(label, timed.write_seconds)
                gauges["storwatch_checkpoint_write_bytes_per_second"].add(label, timed.write_bytes_per_second)
        gauges["storwatch_checkpoint_interval_seconds"].add(label, run.interval_seconds)
        gauges["storwatch_checkpoint_kept"].add(label, len(run.complete))
        gauges["storwatch_checkpoint_incomplete"].add(label, run.incomplete)
        gauges["storwatch_checkpoint_corrupt"].add(label, run.corrupt)
        gauges["storwatch_checkpoint_unsafe"].add(label, run.unsafe)
        gauges["storwatch_checkpoint_write_in_progress"].add(label, 1 if run.write_in_progress else 0)
        gauges["storwatch_checkpoint_orphaned_temp_bytes"].add(label, run.orphaned_temp_bytes)
    yield last
    yield from gauges.values()
    yield from _recovery(view)
    yield from _findings(view)
    facts = view.checkpoint_scan
    if facts is None:
        return
    stuck = Family(
        "storwatch_checkpoint_root_stuck",
        "1 while the walk or a check of a checkpoint root (or of a mount below one) is past its deadline.",
        labels=("root",),
    )
    stuck_roots = {s.path for s in facts.stuck_roots}
    for root in sorted({*facts.roots, *stuck_roots}):
        stuck.add((display_path(root),), 1 if root in stuck_roots else 0)
    errors = Family(
        "storwatch_checkpoint_check_errors_total",
        "Checks of one checkpoint that raised (its verdict says so; the others go on), by kind.",
        "counter",
        labels=("reason",),
    )
    for reason, count in sorted(facts.check_errors.items()):
        errors.add((reason,), count)
    claims = Family(
        "storwatch_checkpoint_claims_rejected_total",
        "What tenants' files claimed and was refused: event-log lines whose numbers fail a check against the file "
        "they name (dropped), and writer PIDs the kernel does not back (the write is timed, no GPU is charged).",
        "counter",
        labels=("reason",),
    )
    for reason, count in sorted(facts.claims_rejected.items()):
        claims.add((reason,), count)
    unreadable = Family(
        "storwatch_checkpoint_unreadable_entries",
        "Entries under a checkpoint root (or a mount below one) that the last walk was refused (permission): "
        "checkpoints below them are not seen.",
        labels=("root",),
    )
    refused = {u.path: u.entries for u in facts.unreadable}
    for root in sorted({*facts.roots, *refused}):
        unreadable.add((display_path(root),), refused.get(root, 0))
    yield from (stuck, errors, claims, unreadable)


def _recovery(view: View) -> Iterator[Family]:
    point = Family(
        "storwatch_recovery_point_seconds",
        "Age of the run's newest complete checkpoint on storage that survives losing this node (cluster or region); "
        "+Inf when it has none there.",
        labels=("run",),
        allow_inf=True,
    )
    overhead = Family(
        "storwatch_checkpoint_overhead_ratio",
        "The run's checkpoint write time over its current checkpoint interval.",
        labels=("run",),
    )
    recommended = Family(
        "storwatch_checkpoint_recommended_interval_seconds",
        "Checkpoint interval for the run's measured write time and checkpoints.mtbf_seconds (Young/Daly).",
        labels=("run",),
    )
    at_risk = Family(
        "storwatch_gpu_seconds_at_risk",
        "GPU time the run would lose if this node died now: its recovery point times the GPUs its pod holds here.",
        labels=("run",),
        allow_inf=True,
    )
    headroom = Family(
        "storwatch_checkpoint_headroom_bytes",
        "Space left on the run's mount once its next checkpoint (the last one's size, plus a quarter) is written; "
        "below 0 it will not fit.",
        labels=("run",),
    )
    by_tier = Family(
        "storwatch_checkpoint_tier_write_seconds",
        "How long the run's newest checkpoint would take to write on each durability tier of this node, at the median "
        "rate checkpoints timed there were written.",
        labels=("run", "durability"),
    )
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
    yield from (point, overhead, recommended, at_risk, headroom, by_tier)


def _findings(view: View) -> Iterator[Family]:
    important = Family(
        "storwatch_ephemeral_important_bytes",
        "Bytes of important data (checkpoints, model weights) on storage that does not survive losing this node, "
        "by mount and kind.",
        labels=("mountpoint", "kind"),
    )
    finding = Family(
        "storwatch_finding",
        "1 for each open finding (its sentence is on /api/status and in scan --json under findings).",
        labels=("id", "severity"),
    )
    by_mount: dict[tuple[str, str], int] = {}
    for f in view.findings:
        key = (display_path(f.mountpoint), f.kind)
        by_mount[key] = by_mount.get(key, 0) + f.bytes
        finding.add((f.id, f.severity), 1)
    for key, size in sorted(by_mount.items()):
        important.add(key, size)
    yield from (important, finding)
