"""The mounts area: each mount's durability class and why, its space and inodes, and whether it is stuck or read-only
(storwatch_mount_info, storwatch_mount_durability, storwatch_mount_*_bytes, storwatch_mount_stuck...)."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.view import View
from storwatch.exporter import catalog
from storwatch.exporter.area import ExportState
from storwatch.exporter.text import Family, label_value
from storwatch.printable import shown
from storwatch.vocabulary import Durability

_DURABILITIES = tuple(Durability)


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    if view is None:
        return
    info = catalog.MOUNT_INFO.family()
    durability = catalog.MOUNT_DURABILITY.family()
    size = catalog.MOUNT_SIZE_BYTES.family()
    free = catalog.MOUNT_FREE_BYTES.family()
    avail = catalog.MOUNT_AVAIL_BYTES.family()
    files = catalog.MOUNT_FILES.family()
    files_free = catalog.MOUNT_FILES_FREE.family()
    stuck = catalog.MOUNT_STUCK.family()
    stuck_for = catalog.MOUNT_STUCK_SECONDS.family()
    readonly = catalog.MOUNT_READONLY.family()
    by_class = [(d, durability.labels_template({"durability": d.value})) for d in _DURABILITIES]
    left_out = state.unexported_mounts(view)
    dropped = catalog.MOUNT_SERIES_DROPPED.family()
    dropped.add((), len(left_out))
    for mv in view.mounts:
        m, verdict = mv.mount, mv.verdict
        if m.mountpoint in left_out:
            continue
        mp = shown(m.mountpoint)
        # One label set for the eight families labelled by mountpoint alone (catalog.MOUNTPOINT).
        labels = size.labels_for((mp,))
        info.add((mp, shown(m.device), m.fstype, verdict.durability.value, verdict.reason), 1)
        quoted = label_value(mp)
        for d, template in by_class:
            durability.add_text(template.format(quoted), 1 if d is verdict.durability else 0)
        if m.usage is not None:
            size.add_text(labels, m.usage.size_bytes)
            free.add_text(labels, m.usage.free_bytes)
            avail.add_text(labels, m.usage.avail_bytes)
            files.add_text(labels, m.usage.files)
            files_free.add_text(labels, m.usage.files_free)
        stuck.add_text(labels, 1 if mv.stuck else 0)
        stuck_for.add_text(labels, m.stuck_seconds)
        readonly.add_text(labels, 1 if m.readonly else 0)
    yield from (info, durability, size, free, avail, files, files_free, stuck, stuck_for, readonly, dropped)
