"""The access area: each GPU workload's storage profile (storwatch_workload_*), named by its pod, Slurm job or
process (analysis.pods.workload_name)."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.pods import workload_name
from storwatch.analysis.view import View
from storwatch.exporter.area import ExportState
from storwatch.exporter.text import Family
from storwatch.sources.access import ACCESS
from storwatch.sources.mounts import display_path


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    facts = view.snapshot.get(ACCESS) if view is not None else None
    if view is None or facts is None:
        return
    rate = {
        op: Family(
            f"storwatch_workload_{op}_bytes_per_second",
            f"Bytes a GPU workload (the GPU process and its workers) {op}s at the storage layer, per second over the "
            "last interval (read_bytes, write_bytes of /proc/<pid>/io).",
            labels=("workload", "pid"),
        )
        for op in ("read", "write")
    }
    size = Family(
        "storwatch_workload_io_size_bytes",
        "Average bytes per read or write call of a GPU workload over the last interval (rchar / syscr, wchar / syscw).",
        labels=("workload", "pid", "op"),
    )
    mounts = Family(
        "storwatch_workload_mount",
        "1 for each mount a GPU workload has files open on, by access mode (read or write).",
        labels=("workload", "pid", "mountpoint", "mode"),
    )
    scan = [
        Family(
            "storwatch_workload_scan_processes",
            "Processes (GPU processes and their descendants) whose counters and children the last access pass read.",
        ),
        Family("storwatch_workload_scan_fds", "Open files (fd links and fdinfo) the last access pass read."),
        Family("storwatch_workload_scan_cpu_seconds", "CPU time the last access pass took."),
    ]
    scan[0].add((), facts.processes_read)
    scan[1].add((), facts.fds_read)
    scan[2].add((), facts.cpu_seconds)
    reached = Family(
        "storwatch_workload_scan_budget_reached",
        "1 when the last access pass reached this budget of access.max_*_per_pass (processes, fds, cpu) and so read a "
        "sample: the rest is read on the next passes.",
        labels=("budget",),
    )
    for budget in ("processes", "fds", "cpu"):
        reached.add((budget,), 1 if budget in facts.sampled else 0)
    yield from (*scan, reached)
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
