"""The training side under the name the agent and earlier jobs import it by: everything here is
:mod:`storwatch_training` (``saves`` and ``requests``), which installs without the agent as the distribution
``storwatch-training``. The agent reads its constants and tests (the event log's and the request file's names, the
temporaries' names and locks) from here; a job imports :mod:`storwatch_training`.
"""

from __future__ import annotations

from storwatch_training.requests import (
    REQUEST_NAME,
    RUN_DIR_ENV,
    CheckpointRequests,
    acknowledge_request,
    checkpoint_requested,
)
from storwatch_training.saves import (
    EVENT_LOG_NAME,
    TEMP_GRACE_SECONDS,
    TEMP_MARKER,
    UNLOCKED_TEMP_SECONDS,
    OrphanedTemp,
    SaveEvent,
    _atomic_write,
    append_event,
    atomic_save,
    atomic_write_bytes,
    checkpoint_bytes,
    is_temp_name,
    last_save_start,
    orphaned_temp,
    record_save,
    remove_orphaned_temps,
    temp_name,
    temp_writer_pid,
)

__all__ = [
    "EVENT_LOG_NAME",
    "REQUEST_NAME",
    "RUN_DIR_ENV",
    "TEMP_GRACE_SECONDS",
    "TEMP_MARKER",
    "UNLOCKED_TEMP_SECONDS",
    "CheckpointRequests",
    "OrphanedTemp",
    "SaveEvent",
    "_atomic_write",
    "acknowledge_request",
    "append_event",
    "atomic_save",
    "atomic_write_bytes",
    "checkpoint_bytes",
    "checkpoint_requested",
    "is_temp_name",
    "last_save_start",
    "orphaned_temp",
    "record_save",
    "remove_orphaned_temps",
    "temp_name",
    "temp_writer_pid",
]
