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
from storwatch.exporter.area import ExportState
from storwatch.exporter.spec import Label, MetricSpec, counter, gauge
from storwatch.exporter.text import Family
from storwatch.printable import shown
from storwatch.procfs.pidio import ProcessIO, field_max, summed

# -- the metrics this area writes (storwatch/exporter/catalog.py assembles them)

WORKLOAD = Label(
    "workload",
    "one per GPU workload on the node, at most access.max_workloads (the rest counted in "
    "storwatch_workload_series_dropped): its pod (namespace/name, or pod:<uid>), Slurm job (job:<id>), or "
    "process:<comm> for a process in neither (bare processes of one name share it), or other",
)

# -- access: each GPU workload's storage profile

_SUMMED = "summed over the workload's GPU processes and the processes below them (its data loader workers)"
WORKLOAD_READ_BYTES = counter(
    "access",
    "storwatch_workload_read_bytes_total",
    f"Bytes a GPU workload had read from the storage layer (read_bytes of /proc/<pid>/io, {_SUMMED}); reads served "
    "from the page cache are not in it.",
    WORKLOAD,
)
WORKLOAD_WRITTEN_BYTES = counter(
    "access",
    "storwatch_workload_written_bytes_total",
    f"Bytes a GPU workload sent toward the storage layer (write_bytes of /proc/<pid>/io, {_SUMMED}): counted as "
    "pages are dirtied, before writeback.",
    WORKLOAD,
)
WORKLOAD_READ_CALLS = counter(
    "access",
    "storwatch_workload_read_calls_total",
    f"Read calls of a GPU workload, on files, pipes and sockets alike (syscr of /proc/<pid>/io, {_SUMMED}).",
    WORKLOAD,
)
WORKLOAD_WRITE_CALLS = counter(
    "access",
    "storwatch_workload_write_calls_total",
    f"Write calls of a GPU workload, on files, pipes and sockets alike (syscw of /proc/<pid>/io, {_SUMMED}).",
    WORKLOAD,
)
WORKLOAD_READ_CALL_BYTES = counter(
    "access",
    "storwatch_workload_read_call_bytes_total",
    f"Bytes a GPU workload's read calls returned, page cache hits included (rchar of /proc/<pid>/io, {_SUMMED}); "
    "its rate over that of read_calls_total is the average read size.",
    WORKLOAD,
)
WORKLOAD_WRITE_CALL_BYTES = counter(
    "access",
    "storwatch_workload_write_call_bytes_total",
    f"Bytes a GPU workload passed to write calls (wchar of /proc/<pid>/io, {_SUMMED}); its rate over that of "
    "write_calls_total is the average write size.",
    WORKLOAD,
)
WORKLOAD_MOUNT = gauge(
    "access",
    "storwatch_workload_mount",
    "1 for each mount a GPU workload has files open on, by access mode (read or write); at most "
    "access.max_mounts_per_workload mounts per workload.",
    WORKLOAD,
    Label("mountpoint", "the mounts the workload has files open on, at most access.max_mounts_per_workload"),
    Label("mode", "the access modes of its open files", ("read", "write")),
)
WORKLOAD_SERIES_DROPPED = gauge(
    "access",
    "storwatch_workload_series_dropped",
    'Label values the last render left out: label="workload", GPU workloads past access.max_workloads (none of '
    'their storwatch_workload_* series is written); label="mountpoint", mounts past '
    "access.max_mounts_per_workload, summed over the workloads written.",
    Label("label", "the capped labels", ("workload", "mountpoint")),
)
WORKLOAD_SCAN_PROCESSES = gauge(
    "access",
    "storwatch_workload_scan_processes",
    "Processes (GPU processes and their descendants) whose counters and children the last access pass read.",
)
WORKLOAD_SCAN_FDS = gauge(
    "access", "storwatch_workload_scan_fds", "Open files (fd links and fdinfo) the last access pass read."
)
WORKLOAD_SCAN_CPU = gauge("access", "storwatch_workload_scan_cpu_seconds", "CPU time the last access pass took.")
WORKLOAD_SCAN_BUDGET_REACHED = gauge(
    "access",
    "storwatch_workload_scan_budget_reached",
    "1 when the last access pass reached this budget of access.max_*_per_pass (processes, fds, cpu) and so read a "
    "sample: the rest is read on the next passes.",
    Label("budget", "the budgets of a pass", ("processes", "fds", "cpu")),
)


COUNTERS: tuple[tuple[MetricSpec, str], ...] = (
    (WORKLOAD_READ_BYTES, "read_bytes"),
    (WORKLOAD_WRITTEN_BYTES, "write_bytes"),
    (WORKLOAD_READ_CALLS, "syscr"),
    (WORKLOAD_WRITE_CALLS, "syscw"),
    (WORKLOAD_READ_CALL_BYTES, "rchar"),
    (WORKLOAD_WRITE_CALL_BYTES, "wchar"),
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
            WORKLOAD_SCAN_PROCESSES,
            WORKLOAD_SCAN_FDS,
            WORKLOAD_SCAN_CPU,
            WORKLOAD_SCAN_BUDGET_REACHED,
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
    mounts, dropped = WORKLOAD_MOUNT.family(), WORKLOAD_SERIES_DROPPED.family()
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
