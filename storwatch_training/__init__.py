"""storwatch's training side: what a training job imports to save checkpoints the agent can time exactly and to
answer the agent's checkpoint requests. Standard library only (torch is imported by ``atomic_save`` when called);
it installs without the agent as the distribution ``storwatch-training`` (``training/`` in the repository).

One line joins a framework: ``storwatch_training.transformers.StorwatchCallback`` (the Hugging Face Trainer),
``storwatch_training.lightning.StorwatchCallback`` (Lightning), ``storwatch_training.accelerate.StorwatchCheckpoints``
(Accelerate). Each answers the agent's request at the next step boundary, saving into the framework's own output
directory, acknowledges it, and records each save's span in the run's event log.
"""

from __future__ import annotations

from storwatch_training.requests import (
    DEFAULT_SIGNALS,
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

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SIGNALS",
    "EVENT_LOG_NAME",
    "REQUEST_NAME",
    "RUN_DIR_ENV",
    "TEMP_GRACE_SECONDS",
    "TEMP_MARKER",
    "UNLOCKED_TEMP_SECONDS",
    "CheckpointRequests",
    "OrphanedTemp",
    "SaveEvent",
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
