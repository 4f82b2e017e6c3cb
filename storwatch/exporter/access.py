"""The access area: each GPU workload's storage profile (storwatch_workload_*), named by its pod, Slurm job or
process (analysis.pods.workload_name)."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.pods import workload_name
from storwatch.analysis.view import View
from storwatch.exporter import catalog
from storwatch.exporter.area import ExportState
from storwatch.exporter.text import Family
from storwatch.sources.access import ACCESS
from storwatch.sources.mounts import display_path


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    facts = view.snapshot.get(ACCESS) if view is not None else None
    if view is None or facts is None:
        return
    scan = [
        catalog.WORKLOAD_SCAN_PROCESSES.family(),
        catalog.WORKLOAD_SCAN_FDS.family(),
        catalog.WORKLOAD_SCAN_CPU.family(),
    ]
    scan[0].add((), facts.processes_read)
    scan[1].add((), facts.fds_read)
    scan[2].add((), facts.cpu_seconds)
    reached = catalog.WORKLOAD_SCAN_BUDGET_REACHED.family()
    for budget in ("processes", "fds", "cpu"):
        reached.add((budget,), 1 if budget in facts.sampled else 0)
    yield from (*scan, reached)
    rate = {"read": catalog.WORKLOAD_READ_RATE.family(), "write": catalog.WORKLOAD_WRITE_RATE.family()}
    size = catalog.WORKLOAD_IO_SIZE.family()
    mounts = catalog.WORKLOAD_MOUNT.family()
    for pid, w in sorted(facts.workloads.items()):
        labels = (workload_name(pid, view.pods, view.jobs), str(pid))
        if w.read_bytes_per_second is not None:
            rate["read"].add(labels, w.read_bytes_per_second)
        if w.write_bytes_per_second is not None:
            rate["write"].add(labels, w.write_bytes_per_second)
        if w.read_size_bytes is not None:
            size.add((*labels, "read"), w.read_size_bytes)
        if w.write_size_bytes is not None:
            size.add((*labels, "write"), w.write_size_bytes)
        for mp in w.mounts_read:
            mounts.add((*labels, display_path(mp), "read"), 1)
        for mp in w.mounts_written:
            mounts.add((*labels, display_path(mp), "write"), 1)
    yield from (rate["read"], rate["write"], size, mounts)
