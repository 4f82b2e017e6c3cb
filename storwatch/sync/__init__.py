"""Verified copies of a checkpoint (a file or a directory) to durable storage, made safely as root.

The parts, in the order a copy passes them:

- :mod:`.destinations`: where copies may go (the allowlisted roots), and a copy's path from template fields that
  can never lead out of a root. Nothing there touches a file.
- :mod:`.tree`: the source as listed, and what a checkpoint may hold (files, directories, symlinks that resolve
  inside it as the kernel would resolve them).
- :mod:`.access`: who may read the copy: never anyone the source's own path kept out.
- :mod:`.pipeline`: each file's bytes read, hashed, written through the page cache, read back from the device and
  compared.
- :mod:`.copy`: one copy from the listing to the commit (:func:`copy_verified`).
- :mod:`.commit`: the copy and its manifest put in place, and the crash table: every point a copy can die, what the
  next copy into that directory finds and what it does.
- :mod:`.worker`: copies run in helper processes, each with a deadline, so a destination that hangs never blocks
  the caller (:class:`SyncWorker`).
- :mod:`.result`: how a copy ended, in the one vocabulary every part uses.
"""

from __future__ import annotations

from storwatch.checkpoints.manifest import MANIFEST_SUFFIX, TEMP_NAME, TEMP_TAG
from storwatch.sync.commit import CRASH_TABLE
from storwatch.sync.copy import MARKERS, copy_verified
from storwatch.sync.destinations import Destinations, safe_field
from storwatch.sync.pipeline import CHUNK, LAG, READ_BACK
from storwatch.sync.result import HASH_NAME, OK_OUTCOMES, OUTCOMES, SyncRefused, SyncResult
from storwatch.sync.worker import STATES, SyncJob, SyncWorker, helper_command, helper_main

__all__ = [
    "CHUNK",
    "CRASH_TABLE",
    "HASH_NAME",
    "LAG",
    "MANIFEST_SUFFIX",
    "MARKERS",
    "OK_OUTCOMES",
    "OUTCOMES",
    "READ_BACK",
    "STATES",
    "TEMP_NAME",
    "TEMP_TAG",
    "Destinations",
    "SyncJob",
    "SyncRefused",
    "SyncResult",
    "SyncWorker",
    "copy_verified",
    "helper_command",
    "helper_main",
    "safe_field",
]
