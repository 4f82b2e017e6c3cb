"""The sync area: the verified checkpoint copies the sync action made (storwatch_sync_*): bytes copied, the copies
that ended by result, copies in progress, each run's last success and how long the copies took.

It renders a :class:`SyncMetrics`, plain figures the sync action's job list (``storwatch.actions.sync_jobs``) makes:
the exporter sits below the actions and imports none of them.
"""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.exporter import catalog
from storwatch.exporter.area import SYNC_COPY_RESULTS, SyncMetrics
from storwatch.exporter.text import Family, value_text


def families(metrics: SyncMetrics) -> Iterator[Family]:
    copied = catalog.SYNC_BYTES.family()
    copied.add((), metrics.bytes_total)
    ended = catalog.SYNC_COPIES.family()
    for result in SYNC_COPY_RESULTS:  # every result from the start, so a first failure is a rise a rate sees
        ended.add((result,), metrics.copies.get(result, 0))
    running = catalog.SYNC_IN_PROGRESS.family()
    running.add((), metrics.in_progress)
    last = catalog.SYNC_LAST_SUCCESS.family()
    for run, at in sorted(metrics.last_success.items()):
        last.add((run,), at)
    duration = catalog.SYNC_DURATION.family()
    buckets = metrics.duration_buckets or ((float("inf"), 0),)
    duration.add_histogram((), [(value_text(bound), count) for bound, count in buckets], metrics.duration_sum)
    yield from (copied, ended, running, last, duration)


__all__ = ["SyncMetrics", "families"]
