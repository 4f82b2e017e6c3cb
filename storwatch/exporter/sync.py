"""The sync area: the verified checkpoint copies the sync action made (storwatch_sync_*): bytes copied, the copies
that ended by result, copies in progress, each run's last success and how long the copies took.

It renders a :class:`SyncMetrics`, plain figures the sync action's job list (``storwatch.actions.sync_jobs``) makes:
the exporter sits below the actions and imports none of them.
"""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.checkpoints import MAX_RUNS
from storwatch.exporter.area import SYNC_COPY_RESULTS, SyncMetrics
from storwatch.exporter.spec import Label, counter, gauge, metric
from storwatch.exporter.text import Family, value_text

# -- the metrics this area writes (storwatch/exporter/catalog.py assembles them)

# -- sync: the verified copies the sync action made (storwatch/actions/sync_jobs.py)

SYNC_RUN = Label(
    "run",
    f"one per checkpoint run copied since the agent started, at most {MAX_RUNS} (the runs copied longest ago "
    "forgotten first), each named by its path below its root",
)
SYNC_BYTES = counter(
    "sync",
    "storwatch_sync_bytes_total",
    "Bytes of the checkpoint copies that completed, verified, since the agent started.",
)
SYNC_COPIES = counter(
    "sync",
    "storwatch_sync_copies_total",
    "Checkpoint copies that ended since the agent started, by result: verified (copied, read back and checked), "
    "failed (refused, an error, a source that changed, or past its deadline: sync.deadline_seconds or its pod's time "
    "left), superseded (stopped for a newer checkpoint of the same run). Each result is written from the start, at 0.",
    Label("result", "how a copy ends (exporter/area.py SYNC_COPY_RESULTS)", SYNC_COPY_RESULTS),
)
SYNC_IN_PROGRESS = gauge(
    "sync", "storwatch_sync_in_progress", "Checkpoint copies queued or running in the copy worker now."
)
SYNC_LAST_SUCCESS = gauge(
    "sync",
    "storwatch_sync_last_success_timestamp_seconds",
    "Unix time the run's last checkpoint copy completed, verified.",
    SYNC_RUN,
)
SYNC_DURATION = metric(
    "histogram",
    "sync",
    "storwatch_sync_duration_seconds",
    "How long each completed checkpoint copy took, from its start in the copy worker to its verified end.",
)


def families(metrics: SyncMetrics) -> Iterator[Family]:
    copied = SYNC_BYTES.family()
    copied.add((), metrics.bytes_total)
    ended = SYNC_COPIES.family()
    for result in SYNC_COPY_RESULTS:  # every result from the start, so a first failure is a rise a rate sees
        ended.add((result,), metrics.copies.get(result, 0))
    running = SYNC_IN_PROGRESS.family()
    running.add((), metrics.in_progress)
    last = SYNC_LAST_SUCCESS.family()
    for run, at in sorted(metrics.last_success.items()):
        last.add((run,), at)
    duration = SYNC_DURATION.family()
    buckets = metrics.duration_buckets or ((float("inf"), 0),)
    duration.add_histogram((), [(value_text(bound), count) for bound, count in buckets], metrics.duration_sum)
    yield from (copied, ended, running, last, duration)


__all__ = ["SyncMetrics", "families"]
