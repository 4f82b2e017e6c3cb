"""The Lustre area: each client mount's bytes, operation counts and operation times from its llite stats
(storwatch_lustre_*), labelled with the mountpoint the source joined it to ("" when it could not tell)."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.view import View
from storwatch.exporter import catalog
from storwatch.exporter.area import ExportState
from storwatch.exporter.text import Family
from storwatch.printable import shown
from storwatch.procfs.lustre import LliteStats

OPERATIONS = catalog.LUSTRE_OPERATIONS.values("operation")
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
    info = catalog.LUSTRE_CLIENT_INFO.family()
    read = catalog.LUSTRE_READ_BYTES.family()
    written = catalog.LUSTRE_WRITTEN_BYTES.family()
    ops = catalog.LUSTRE_OPERATIONS.family()
    seconds = catalog.LUSTRE_OPERATION_SECONDS.family()
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
