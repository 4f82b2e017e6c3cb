"""The access area: each GPU workload's I/O as ``_total`` counters and the mounts it has files open on
(storwatch_workload_*), labelled by the workload, never by a PID: its pod, its Slurm job, or ``process:<comm>`` for
a process in neither. Rates are PromQL's (``rate()``). At most ``access.max_workloads`` workloads and
``access.max_mounts_per_workload`` mounts each are written; what is left out is counted
(storwatch_workload_series_dropped).

A workload's counters are its GPU processes' summed counters (sources/access.py), kept from going down while the
workload goes on (:class:`_Written`): a sum drops when a process's counters leave it, and Prometheus would read any
drop as a reset to zero and count the whole remaining total again as new I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from storwatch.analysis.pods import workload_name
from storwatch.analysis.view import AccessFacts, View
from storwatch.exporter import catalog
from storwatch.exporter.area import ExportState
from storwatch.exporter.text import Family
from storwatch.printable import shown
from storwatch.procfs.pidio import ProcessIO, field_max, summed

COUNTERS: tuple[tuple[catalog.MetricSpec, str], ...] = (
    (catalog.WORKLOAD_READ_BYTES, "read_bytes"),
    (catalog.WORKLOAD_WRITTEN_BYTES, "write_bytes"),
    (catalog.WORKLOAD_READ_CALLS, "syscr"),
    (catalog.WORKLOAD_WRITE_CALLS, "syscw"),
    (catalog.WORKLOAD_READ_CALL_BYTES, "rchar"),
    (catalog.WORKLOAD_WRITE_CALL_BYTES, "wchar"),
)
"""Each counter with the ``<pid>/io`` field it sums."""
OTHER = "other"
"""The workload of a process in no pod or job whose command name cannot be read."""
_BUDGETS = ("processes", "fds", "cpu")


def workload_label(pid: int, comm: str | None, view: View) -> str:
    """The ``workload`` label of a GPU process: its pod or Slurm job (analysis.pods.workload_name), else
    ``process:<comm>``, else ``other``. Never the PID, whose values have no bound (the name stands in for it: bare
    processes of one name share a series)."""
    name = workload_name(pid, view.pods, view.jobs)
    if not name.startswith("pid:"):
        return name
    return f"process:{comm}" if comm else OTHER


@dataclass
class _Workload:
    roots: set[int] = field(default_factory=set)
    """Its GPU processes."""
    io: list[ProcessIO] = field(default_factory=list)
    """Their trees' counters (a tree inside another GPU process's is counted there)."""
    reads: set[str] = field(default_factory=set)
    writes: set[str] = field(default_factory=set)


@dataclass
class _Written:
    """Per workload written at the last render: its GPU processes and the counters written.

    While a workload goes on (one of those GPU processes is still there), no counter is written below what was:
    a drop of the sum is counters that left the workload (a worker no one in the tree reaped, a GPU process of a
    many-process pod that ended, an exited worker its parent's counters do not hold yet), and Prometheus would read
    it as a reset and count the whole remaining total again. The counter stays flat instead until the sum passes it
    again: the I/O that left is not counted twice, the I/O after it is undercounted by as much. A workload whose
    GPU processes are all new (the pod's container restarted) starts again from its own sum: a real reset, which
    Prometheus takes as one. Only the workloads written are remembered, at most access.max_workloads."""

    by_workload: dict[str, tuple[frozenset[int], ProcessIO]] = field(default_factory=dict)


def _guarded(io: ProcessIO, roots: frozenset[int], last: tuple[frozenset[int], ProcessIO] | None) -> ProcessIO:
    """``io``, or what was written last where more, while the workload goes on (:class:`_Written`)."""
    return io if last is None or not roots & last[0] else field_max(io, last[1])


def _scan(facts: AccessFacts) -> Iterator[Family]:
    processes, fds, cpu, reached = (
        d.family()
        for d in (
            catalog.WORKLOAD_SCAN_PROCESSES,
            catalog.WORKLOAD_SCAN_FDS,
            catalog.WORKLOAD_SCAN_CPU,
            catalog.WORKLOAD_SCAN_BUDGET_REACHED,
        )
    )
    processes.add((), facts.processes_read)
    fds.add((), facts.fds_read)
    cpu.add((), facts.cpu_seconds)
    for budget in _BUDGETS:
        reached.add((budget,), 1 if budget in facts.sampled else 0)
    yield from (processes, fds, cpu, reached)


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    facts = view.access if view is not None else None
    if view is None or facts is None:
        return
    yield from _scan(facts)
    workloads: dict[str, _Workload] = {}
    for pid, w in sorted(facts.workloads.items()):
        work = workloads.setdefault(workload_label(pid, w.comm, view), _Workload())
        work.roots.add(pid)
        if w.within is None:
            work.io.append(w.io)
        work.reads.update(w.mounts_read)
        work.writes.update(w.mounts_written)
    # Pods and jobs before the stand-ins, then by name: which workloads are written does not depend on the order
    # NVML lists processes in.
    order = sorted(workloads, key=lambda name: (name == OTHER or name.startswith("process:"), name))
    kept = order[: facts.max_workloads]
    counters = [(d.family(), io_field) for d, io_field in COUNTERS]
    mounts, dropped = catalog.WORKLOAD_MOUNT.family(), catalog.WORKLOAD_SERIES_DROPPED.family()
    memory = state.kept(_Written)
    written: dict[str, tuple[frozenset[int], ProcessIO]] = {}
    mounts_dropped = 0
    for name in kept:
        work = workloads[name]
        roots = frozenset(work.roots)
        io = _guarded(summed(work.io), roots, memory.by_workload.get(name))
        written[name] = (roots, io)
        for family, io_field in counters:
            family.add((name,), getattr(io, io_field))
        opened = sorted(work.reads | work.writes)
        mounts_dropped += max(0, len(opened) - facts.max_mounts_per_workload)
        for mp in opened[: facts.max_mounts_per_workload]:
            for mode, where in (("read", work.reads), ("write", work.writes)):
                if mp in where:
                    mounts.add((name, shown(mp), mode), 1)
    memory.by_workload = written
    dropped.add(("workload",), len(order) - len(kept))
    dropped.add(("mountpoint",), mounts_dropped)
    yield from (family for family, _ in counters)
    yield from (mounts, dropped)
