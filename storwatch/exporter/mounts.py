"""The mounts area: each mount's durability class and why, its space and inodes, and whether it is stuck or read-only
(storwatch_mount_info, storwatch_mount_durability, storwatch_mount_*_bytes, storwatch_mount_stuck...)."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.view import View
from storwatch.exporter.area import ExportState
from storwatch.exporter.text import Family, labels_text
from storwatch.sources.mounts import display_path
from storwatch.vocabulary import Durability

_DURABILITIES = tuple(Durability)


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    if view is None:
        return
    info = Family("storwatch_mount_info", "A mount on this node with its durability class and the reason for it.")
    durability = Family(
        "storwatch_mount_durability",
        "1 for the durability class of each mount (volatile, node, cluster, region), 0 for the others.",
    )
    size = Family("storwatch_mount_size_bytes", "Filesystem size in bytes.")
    free = Family("storwatch_mount_free_bytes", "Free bytes, root's reserve included.")
    avail = Family("storwatch_mount_avail_bytes", "Bytes available to unprivileged users.")
    files = Family("storwatch_mount_files", "Inodes in the filesystem.")
    files_free = Family("storwatch_mount_files_free", "Free inodes.")
    stuck = Family("storwatch_mount_stuck", "1 when a statvfs on the mount has not returned within its deadline.")
    stuck_for = Family("storwatch_mount_stuck_seconds", "How long the oldest call on a stuck mount has been in flight.")
    readonly = Family("storwatch_mount_readonly", "1 when the mount is read-only.")
    for mv in view.mounts:
        m, verdict = mv.mount, mv.verdict
        mp = display_path(m.mountpoint)
        labels = labels_text(("mountpoint", mp))
        info.add_text(
            labels_text(
                ("device", display_path(m.device)),
                ("durability", verdict.durability.value),
                ("fstype", m.fstype),
                ("mountpoint", mp),
                ("reason", verdict.reason),
            ),
            1,
        )
        for d in _DURABILITIES:
            durability.add_text(
                labels_text(("durability", d.value), ("mountpoint", mp)), 1 if d is verdict.durability else 0
            )
        if m.usage is not None:
            size.add_text(labels, m.usage.size_bytes)
            free.add_text(labels, m.usage.free_bytes)
            avail.add_text(labels, m.usage.avail_bytes)
            files.add_text(labels, m.usage.files)
            files_free.add_text(labels, m.usage.files_free)
        stuck.add_text(labels, 1 if mv.stuck else 0)
        stuck_for.add_text(labels, m.stuck_seconds)
        readonly.add_text(labels, 1 if m.readonly else 0)
    yield from (info, durability, size, free, avail, files, files_free, stuck, stuck_for, readonly)
