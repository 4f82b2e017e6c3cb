"""The mounts area: each mount's durability class and why, its space and inodes, and whether it is stuck or read-only
(storwatch_mount_info, storwatch_mount_durability, storwatch_mount_*_bytes, storwatch_mount_stuck...)."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.view import View
from storwatch.exporter.area import ExportState
from storwatch.exporter.spec import DURABILITIES, MOUNTPOINT, Label, gauge
from storwatch.exporter.text import Family, label_value
from storwatch.printable import shown
from storwatch.vocabulary import Durability

# -- the metrics this area writes (storwatch/exporter/catalog.py assembles them)

DURABILITY = Label("durability", "the durability classes", DURABILITIES)

# -- mounts

MOUNT_INFO = gauge(
    "mounts",
    "storwatch_mount_info",
    "A mount on this node with its durability class and the reason for it.",
    MOUNTPOINT,
    Label("device", "one per mount: its source as the mount table names it"),
    Label("fstype", "one per mount: its filesystem type"),
    DURABILITY,
    Label("reason", "one per mount: the sentence of the evidence that decided its class"),
)
MOUNT_DURABILITY = gauge(
    "mounts",
    "storwatch_mount_durability",
    "1 for the durability class of each mount (volatile, node, cluster, region), 0 for the others.",
    MOUNTPOINT,
    DURABILITY,
)
MOUNT_SIZE_BYTES = gauge("mounts", "storwatch_mount_size_bytes", "Filesystem size in bytes.", MOUNTPOINT)
MOUNT_FREE_BYTES = gauge("mounts", "storwatch_mount_free_bytes", "Free bytes, root's reserve included.", MOUNTPOINT)
MOUNT_AVAIL_BYTES = gauge("mounts", "storwatch_mount_avail_bytes", "Bytes available to unprivileged users.", MOUNTPOINT)
MOUNT_FILES = gauge("mounts", "storwatch_mount_files", "Inodes in the filesystem.", MOUNTPOINT)
MOUNT_FILES_FREE = gauge("mounts", "storwatch_mount_files_free", "Free inodes.", MOUNTPOINT)
MOUNT_STUCK = gauge(
    "mounts", "storwatch_mount_stuck", "1 when a statvfs on the mount has not returned within its deadline.", MOUNTPOINT
)
MOUNT_STUCK_SECONDS = gauge(
    "mounts",
    "storwatch_mount_stuck_seconds",
    "How long the oldest call on a stuck mount has been in flight.",
    MOUNTPOINT,
)
MOUNT_READONLY = gauge("mounts", "storwatch_mount_readonly", "1 when the mount is read-only.", MOUNTPOINT)
MOUNT_SERIES_DROPPED = gauge(
    "mounts",
    "storwatch_mount_series_dropped",
    "Mounts of the node's mount table without series of their own, past mounts.max_series: read-only and idle ones "
    "first; they stay in /status, the policy and every sum.",
)


_DURABILITIES = tuple(Durability)


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    if view is None:
        return
    info = MOUNT_INFO.family()
    durability = MOUNT_DURABILITY.family()
    size = MOUNT_SIZE_BYTES.family()
    free = MOUNT_FREE_BYTES.family()
    avail = MOUNT_AVAIL_BYTES.family()
    files = MOUNT_FILES.family()
    files_free = MOUNT_FILES_FREE.family()
    stuck = MOUNT_STUCK.family()
    stuck_for = MOUNT_STUCK_SECONDS.family()
    readonly = MOUNT_READONLY.family()
    by_class = [(d, durability.labels_template({"durability": d.value})) for d in _DURABILITIES]
    left_out = state.unexported_mounts(view)
    dropped = MOUNT_SERIES_DROPPED.family()
    dropped.add((), len(left_out))
    for mv in view.mounts:
        m, verdict = mv.mount, mv.verdict
        if m.mountpoint in left_out:
            continue
        mp = shown(m.mountpoint)
        # One label set for the eight families labelled by mountpoint alone (MOUNTPOINT).
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
