"""The Lustre area: each client mount's bytes, operation counts and operation times from its llite stats
(storwatch_lustre_*), labelled with the mountpoint the source joined it to ("" when it could not tell)."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.view import View
from storwatch.exporter.area import ExportState
from storwatch.exporter.spec import Label, counter, gauge
from storwatch.exporter.text import Family
from storwatch.printable import shown
from storwatch.procfs.lustre import LliteStats

# -- the metrics this area writes (storwatch/exporter/catalog.py assembles them)

LUSTRE_FSNAME = Label("fsname", "one per Lustre filesystem the node mounts")
LUSTRE_MOUNTPOINT = Label("mountpoint", "one per Lustre client mount; empty when it could not be joined to a mount")

# -- lustre

LUSTRE_CLIENT_INFO = gauge(
    "lustre",
    "storwatch_lustre_client_info",
    "A Lustre client mount: its llite instance and the mount it was joined to (empty: not known).",
    LUSTRE_FSNAME,
    LUSTRE_MOUNTPOINT,
    Label("instance", "one per Lustre client mount: its llite instance"),
)
LUSTRE_READ_BYTES = counter(
    "lustre",
    "storwatch_lustre_read_bytes_total",
    "Bytes read through the client mount.",
    LUSTRE_FSNAME,
    LUSTRE_MOUNTPOINT,
)
LUSTRE_WRITTEN_BYTES = counter(
    "lustre",
    "storwatch_lustre_written_bytes_total",
    "Bytes written through the client mount.",
    LUSTRE_FSNAME,
    LUSTRE_MOUNTPOINT,
)
LUSTRE_OPERATION = Label(
    "operation",
    "the data path and the metadata calls a training job's reads and checkpoint writes wait on, of the 60 or so a "
    "client counts",
    (
        *("read", "write", "open", "close", "fsync", "getattr", "setattr", "create", "unlink", "mkdir", "rmdir"),
        *("rename", "readdir", "statfs", "truncate", "mmap", "flock", "ioctl", "seek"),
    ),
)
LUSTRE_OPERATIONS = counter(
    "lustre",
    "storwatch_lustre_operations_total",
    "Operations the client mount served, by operation.",
    LUSTRE_FSNAME,
    LUSTRE_MOUNTPOINT,
    LUSTRE_OPERATION,
)
LUSTRE_OPERATION_SECONDS = counter(
    "lustre",
    "storwatch_lustre_operation_seconds_total",
    "Time the client mount's operations took, by operation (clients that time them: Lustre 2.14 and later for "
    "reads and writes).",
    LUSTRE_FSNAME,
    LUSTRE_MOUNTPOINT,
    LUSTRE_OPERATION,
)


OPERATIONS = LUSTRE_OPERATIONS.values("operation")
"""The operations exported, of the 60 or so a client counts (the catalog lists them)."""

_BYTES_OF = {"read": "read_bytes", "write": "write_bytes"}
_TIMED_UNITS = frozenset({"usecs", "usec"})


def _calls(stats: LliteStats, operation: str) -> int | None:
    counter = stats.counters.get(operation)
    if counter is not None:
        return counter.samples
    # Before Lustre 2.14 reads and writes are not timed: their calls are the samples of the byte counters.
    bytes_counter = _BYTES_OF.get(operation)
    if bytes_counter is not None and bytes_counter in stats.counters:
        return stats.counters[bytes_counter].samples
    return None


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    facts = view.lustre if view is not None else None
    if facts is None:
        return
    info = LUSTRE_CLIENT_INFO.family()
    read = LUSTRE_READ_BYTES.family()
    written = LUSTRE_WRITTEN_BYTES.family()
    ops = LUSTRE_OPERATIONS.family()
    seconds = LUSTRE_OPERATION_SECONDS.family()
    for client in facts.clients:
        stats = client.stats
        where = (client.fsname, shown(client.mountpoint) if client.mountpoint is not None else "")
        info.add((*where, client.instance), 1)
        read.add(where, stats.total("read_bytes"))
        written.add(where, stats.total("write_bytes"))
        for op in OPERATIONS:
            calls = _calls(stats, op)
            if calls is not None:
                ops.add((*where, op), calls)
            counter = stats.counters.get(op)
            if counter is not None and counter.unit in _TIMED_UNITS and counter.total is not None:
                seconds.add((*where, op), counter.total / 1e6)
    yield from (info, read, written, ops, seconds)
