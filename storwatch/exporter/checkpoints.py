"""The checkpoints area: each run's newest complete checkpoint with the durability of the mount it is on, its size,
write time and interval, what the run keeps, and the scan's stuck roots and check errors (storwatch_checkpoint_*);
its recovery point and recommended interval (storwatch_recovery_point_seconds, analysis/rpo.py). Runs past the bound
(analysis/checkpoints.py MAX_RUNS) have no series of their own: they are counted (storwatch_checkpoint_series_dropped)
and still in every sum (storwatch_ephemeral_important_bytes, storwatch_checkpoint_dropped_gpu_seconds_at_risk)."""

from __future__ import annotations

import typing
from collections.abc import Iterator

from storwatch.analysis.checkpoints import MAX_RUNS
from storwatch.analysis.view import View
from storwatch.exporter.area import ExportState
from storwatch.exporter.spec import DURABILITIES, Label, counter, gauge
from storwatch.exporter.text import Family
from storwatch.labels import CHECK_ERROR_REASONS, CLAIM_REJECT_REASONS, MAX_DATASET_DIRS
from storwatch.printable import shown
from storwatch.vocabulary import Severity

# -- the metrics this area writes (storwatch/exporter/catalog.py assembles them)

RUN = Label(
    "run",
    f"one per checkpoint run exported, at most {MAX_RUNS} (analysis/checkpoints.py MAX_RUNS: those with GPU-seconds "
    "at risk, then with findings, then the newest; the rest counted in storwatch_checkpoint_series_dropped), each "
    "named by its path below its root (at most 160 characters)",
)
ROOT = Label("root", "one per checkpoint root (checkpoints.roots, the kubelet's pod volumes) and mount below one")

# -- checkpoints: each run

CHECKPOINT_LAST_COMPLETE = gauge(
    "checkpoints",
    "storwatch_checkpoint_last_complete_timestamp_seconds",
    "Modification time of the run's newest complete checkpoint, with the durability of the mount it is on.",
    RUN,
    Label(
        "durability",
        "the durability classes, and unknown when the run's mount is not known",
        (*DURABILITIES, "unknown"),
    ),
    Label("mountpoint", "one per run: the mount it is on (empty when not known)"),
)
CHECKPOINT_SIZE = gauge(
    "checkpoints", "storwatch_checkpoint_size_bytes", "Size of the run's newest complete checkpoint.", RUN
)
CHECKPOINT_WRITE_DURATION = gauge(
    "checkpoints",
    "storwatch_checkpoint_write_duration_seconds",
    "How long the newest timed complete checkpoint took to write.",
    RUN,
)
CHECKPOINT_WRITE_RATE = gauge(
    "checkpoints", "storwatch_checkpoint_write_bytes_per_second", "Its size over its write duration.", RUN
)
CHECKPOINT_INTERVAL = gauge(
    "checkpoints",
    "storwatch_checkpoint_interval_seconds",
    "Time between the run's two newest complete checkpoints.",
    RUN,
)
CHECKPOINT_KEPT = gauge("checkpoints", "storwatch_checkpoint_kept", "Complete checkpoints the run keeps on disk.", RUN)
CHECKPOINT_INCOMPLETE = gauge(
    "checkpoints",
    "storwatch_checkpoint_incomplete",
    "The run's incomplete checkpoints (being written, or abandoned mid-write).",
    RUN,
)
CHECKPOINT_CORRUPT = gauge(
    "checkpoints",
    "storwatch_checkpoint_corrupt",
    "The run's corrupt checkpoints (finished, then damaged, or never valid).",
    RUN,
)
CHECKPOINT_UNSAFE = gauge(
    "checkpoints",
    "storwatch_checkpoint_unsafe",
    "The run's unsafe checkpoints: a pickle in them names a global that runs code when loaded (never complete).",
    RUN,
)
CHECKPOINT_WRITE_IN_PROGRESS = gauge(
    "checkpoints",
    "storwatch_checkpoint_write_in_progress",
    "1 while a save of the run is in progress: an atomic_save temporary being written, or a newest checkpoint "
    "incomplete and changed within checkpoints.settle_seconds (one unchanged for longer is abandoned, not written).",
    RUN,
)
CHECKPOINT_ORPHANED_TEMP_BYTES = gauge(
    "checkpoints",
    "storwatch_checkpoint_orphaned_temp_bytes",
    "Bytes of the run's atomic_save temporaries whose writer is gone (removed by the run's next atomic_save).",
    RUN,
)


# -- checkpoints: each run's recovery point and what it costs (analysis/rpo.py)

RECOVERY_POINT = gauge(
    "checkpoints",
    "storwatch_recovery_point_seconds",
    "Age of the run's newest complete checkpoint on storage that survives losing this node (cluster or region): its "
    "own, or the save its newest durable copy protects; +Inf when it has neither.",
    RUN,
    allow_inf=True,
)
DURABLE_COPY = gauge(
    "checkpoints",
    "storwatch_checkpoint_durable_copy_timestamp_seconds",
    "When the save the run's newest durable copy protects was made (a verified copy storwatch made, or a checkpoint "
    "at the same path below a durable root); no series while the run has none.",
    RUN,
)
CHECKPOINT_OVERHEAD = gauge(
    "checkpoints",
    "storwatch_checkpoint_overhead_ratio",
    "The run's checkpoint write time over its current checkpoint interval.",
    RUN,
)
CHECKPOINT_RECOMMENDED_INTERVAL = gauge(
    "checkpoints",
    "storwatch_checkpoint_recommended_interval_seconds",
    "Checkpoint interval for the run's measured write time and checkpoints.mtbf_seconds (Young/Daly).",
    RUN,
)
GPU_SECONDS_AT_RISK = gauge(
    "checkpoints",
    "storwatch_gpu_seconds_at_risk",
    "GPU time the run would lose if this node died now: its recovery point times the GPUs its pod holds here.",
    RUN,
    allow_inf=True,
)
CHECKPOINT_DROPPED_GPU_SECONDS_AT_RISK = gauge(
    "checkpoints",
    "storwatch_checkpoint_dropped_gpu_seconds_at_risk",
    "GPU-seconds at risk of the runs past the bound on runs (no series of their own): with the sum of "
    "storwatch_gpu_seconds_at_risk, the node's whole.",
    allow_inf=True,
)
CHECKPOINT_HEADROOM = gauge(
    "checkpoints",
    "storwatch_checkpoint_headroom_bytes",
    "Space left on the run's mount once its next checkpoint (the last one's size, plus a quarter) is written; "
    "below 0 it will not fit.",
    RUN,
)
CHECKPOINT_TIER_WRITE = gauge(
    "checkpoints",
    "storwatch_checkpoint_tier_write_seconds",
    "How long the run's newest checkpoint would take to write on each durability tier of this node, at the median "
    "rate checkpoints timed there were written.",
    RUN,
    Label("durability", "the durability classes of this node's mounts", DURABILITIES),
)


# -- checkpoints: findings (analysis/findings.py)

EPHEMERAL_IMPORTANT = gauge(
    "checkpoints",
    "storwatch_ephemeral_important_bytes",
    "Bytes of important data (checkpoints, model weights) on storage that does not survive losing this node, "
    "by mount and kind, over every run (those without series of their own included).",
    Label("mountpoint", "one per volatile or node mount holding important data"),
    Label("kind", "what the data is (analysis/findings.py)", ("checkpoint", "model", "dataset")),
)
FINDING = gauge(
    "checkpoints",
    "storwatch_finding",
    "1 for each open finding (its sentence is on /api/status and in scan --json under findings); its severity is "
    "its run's, which the alerts about the run carry.",
    Label(
        "id",
        f"one per open finding: a run exported (at most {MAX_RUNS}) or a dataset directory (at most "
        f"{MAX_DATASET_DIRS}) on ephemeral storage; 16 hex digits",
    ),
    Label("severity", "how urgent", typing.get_args(Severity)),
    Label("kind", "what the data is (analysis/findings.py)", ("checkpoint", "model", "dataset")),
    Label("mountpoint", "one per volatile or node mount holding important data"),
    Label("run", "the run's label, or the dataset directory's path; one per open finding"),
)
CHECKPOINT_SERIES_DROPPED = gauge(
    "checkpoints",
    "storwatch_checkpoint_series_dropped",
    f'Label values the bound on runs left out: label="run", runs past the {MAX_RUNS} with series of their own; '
    'label="finding", their findings (no storwatch_finding series). Their bytes stay in '
    "storwatch_ephemeral_important_bytes.",
    Label("label", "the capped labels", ("run", "finding")),
)


# -- checkpoints: the scan itself

CHECKPOINT_ROOT_STUCK = gauge(
    "checkpoints",
    "storwatch_checkpoint_root_stuck",
    "1 while the walk or a check of a checkpoint root (or of a mount below one) is past its deadline.",
    ROOT,
)
CHECKPOINT_CHECK_ERRORS = counter(
    "checkpoints",
    "storwatch_checkpoint_check_errors_total",
    "Checks of one checkpoint that raised (its verdict says so; the others go on), by kind.",
    Label("reason", "the kinds of error a check can raise (_checkpoint_worker.py)", CHECK_ERROR_REASONS),
)
CHECKPOINT_CLAIMS_REJECTED = counter(
    "checkpoints",
    "storwatch_checkpoint_claims_rejected_total",
    "What tenants' files claimed and was refused: event-log lines whose numbers fail a check against the file "
    "they name (dropped), and writer PIDs the kernel does not back (the write is timed, no GPU is charged).",
    Label("reason", "why a claim was refused (sources/checkpoints.py)", CLAIM_REJECT_REASONS),
)
CHECKPOINT_UNREADABLE = gauge(
    "checkpoints",
    "storwatch_checkpoint_unreadable_entries",
    "Entries under a checkpoint root (or a mount below one) that the last walk was refused (permission): "
    "checkpoints below them are not seen.",
    ROOT,
)


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    if view is None:
        return
    last = CHECKPOINT_LAST_COMPLETE.family()
    size = CHECKPOINT_SIZE.family()
    write_duration = CHECKPOINT_WRITE_DURATION.family()
    write_rate = CHECKPOINT_WRITE_RATE.family()
    interval = CHECKPOINT_INTERVAL.family()
    kept = CHECKPOINT_KEPT.family()
    incomplete = CHECKPOINT_INCOMPLETE.family()
    corrupt = CHECKPOINT_CORRUPT.family()
    unsafe = CHECKPOINT_UNSAFE.family()
    in_progress = CHECKPOINT_WRITE_IN_PROGRESS.family()
    orphaned = CHECKPOINT_ORPHANED_TEMP_BYTES.family()
    for rv in view.checkpoints:
        run = rv.run
        label = (rv.label,)
        newest = run.newest_complete
        if newest is not None:
            durability = rv.mount.verdict.durability.value if rv.mount else "unknown"
            mountpoint = shown(rv.mount.mount.mountpoint) if rv.mount else ""
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
    stuck = CHECKPOINT_ROOT_STUCK.family()
    stuck_roots = {s.path for s in facts.stuck_roots}
    for root in sorted({*facts.roots, *stuck_roots}):
        stuck.add((shown(root),), 1 if root in stuck_roots else 0)
    errors = CHECKPOINT_CHECK_ERRORS.family()
    for reason, count in sorted(facts.check_errors.items()):
        errors.add((reason,), count)
    claims = CHECKPOINT_CLAIMS_REJECTED.family()
    for reason, count in sorted(facts.claims_rejected.items()):
        claims.add((reason,), count)
    unreadable = CHECKPOINT_UNREADABLE.family()
    refused = {u.path: u.entries for u in facts.unreadable}
    for root in sorted({*facts.roots, *refused}):
        unreadable.add((shown(root),), refused.get(root, 0))
    yield from (stuck, errors, claims, unreadable)


def _recovery(view: View) -> Iterator[Family]:
    point = RECOVERY_POINT.family()
    overhead = CHECKPOINT_OVERHEAD.family()
    recommended = CHECKPOINT_RECOMMENDED_INTERVAL.family()
    at_risk = GPU_SECONDS_AT_RISK.family()
    headroom = CHECKPOINT_HEADROOM.family()
    by_tier = CHECKPOINT_TIER_WRITE.family()
    copied = DURABLE_COPY.family()
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
    dropped_risk = CHECKPOINT_DROPPED_GPU_SECONDS_AT_RISK.family()
    dropped_risk.add((), view.left_out.gpu_seconds_at_risk)
    yield from (point, overhead, recommended, at_risk, headroom, by_tier, dropped_risk, copied)


def _findings(view: View) -> Iterator[Family]:
    important = EPHEMERAL_IMPORTANT.family()
    finding = FINDING.family()
    dropped = CHECKPOINT_SERIES_DROPPED.family()
    for f in view.findings:
        finding.add((f.id, f.severity, f.kind, shown(f.mountpoint), f.run), 1)
    by_mount: dict[tuple[str, str], int] = {}
    for (mountpoint, kind), size in view.important_bytes().items():  # over every run, those left out included
        key = (shown(mountpoint), kind)
        by_mount[key] = by_mount.get(key, 0) + size
    for key, size in sorted(by_mount.items()):
        important.add(key, size)
    dropped.add(("run",), view.left_out.runs)
    dropped.add(("finding",), view.left_out.findings)
    yield from (important, finding, dropped)
