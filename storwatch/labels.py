"""The label values the sources write into their facts, declared below them so that the metric catalog
(storwatch/exporter/catalog.py) bounds each label without importing a source: the checkpoint scan's reasons, the
probe's steps and buckets. Each source imports its own from here."""

from __future__ import annotations

CHECK_ERROR_REASONS = ("os_error", "value_error", "recursion_error", "memory_error", "other")
"""What a checkpoint check that raised is counted as (storwatch_checkpoint_check_errors_total{reason})."""

EVENT_REJECT_REASONS = ("malformed", "not_finite", "span", "future", "file_life", "bytes")
"""Why an event-log line was dropped (storwatch_checkpoint_claims_rejected_total{reason}):
malformed: not a JSON object with the fields; not_finite: a time or byte count that is NaN, infinite or not a number;
span: start after end, or before the epoch, or longer than a day where the file's birth is unknown; future: ending
after now; file_life: the file was not written within the span (mtime outside it, or born well before or after its
start); bytes: negative, or far from the file's size. A line naming a file that is no checkpoint of the run now (one
removed since) is skipped without counting: it is history, not a claim about anything present."""

WRITER_REJECT_REASONS = ("not_writer", "not_visible")
"""Why a PID claim was refused and counted: the process lives and was never seen writing under the run
(``not_writer``), or the kernel would not show the agent its open files (``not_visible``: another user's process, or
one holding capabilities the agent lacks, needs CAP_SYS_PTRACE, which the DaemonSet does not grant), so the claim
could be neither backed nor refuted. (A claim naming no live process ties nothing to any GPU and is not counted: a
finished job's event lines name exited writers.)"""

CLAIM_REJECT_REASONS = EVENT_REJECT_REASONS + WRITER_REJECT_REASONS
"""Why a tenant's claim was refused (storwatch_checkpoint_claims_rejected_total{reason}): an event line's numbers, or
a writer PID the kernel does not back."""

MAX_DATASET_DIRS = 1000
"""Directories of dataset shards reported per scan, the largest first."""

PROBE_OPS = ("write", "fsync", "read")
"""The active probe's steps, in order."""
PROBE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""The probe's latency buckets, from a local NVMe fsync (~100 us) to a struggling network filesystem (seconds)."""
