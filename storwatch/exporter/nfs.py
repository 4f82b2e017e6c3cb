"""The NFS area: per-mount, per-procedure RPC counters, per-transport counters and the ``bytes:`` counters of every NFS
mount (storwatch_nfs_*). Most of a large node's series: each mount's lines are kept from one render to the next
while its counters stand still, and each procedure's while its own do."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.view import View
from storwatch.exporter.area import ExportState
from storwatch.exporter.text import Family, label_value, value_text
from storwatch.procfs.mountstats import NFSMount, NFSOperation
from storwatch.sources.mounts import display_path

_MS = 0.001

_NFS_OP_COUNTERS = (
    ("storwatch_nfs_operations_total", "RPC requests made, per NFS operation."),
    ("storwatch_nfs_transmissions_total", "RPC transmissions, retransmissions included."),
    ("storwatch_nfs_major_timeouts_total", "Requests that hit a major timeout (server not responding)."),
    ("storwatch_nfs_sent_bytes_total", "Bytes sent for these requests, headers included."),
    ("storwatch_nfs_received_bytes_total", "Bytes received in replies, headers included."),
    ("storwatch_nfs_queue_seconds_total", "Time requests waited before transmission."),
    ("storwatch_nfs_rtt_seconds_total", "Time from transmission to reply."),
    ("storwatch_nfs_execute_seconds_total", "Time from creation to completion (queue + RTT + client processing)."),
    ("storwatch_nfs_errors_total", "Requests that completed with an error status."),
)

_XPRT_COUNTERS = (
    ("storwatch_nfs_transport_sends_total", "RPC requests sent on the transport."),
    ("storwatch_nfs_transport_receives_total", "RPC replies received on the transport."),
    ("storwatch_nfs_transport_bad_xids_total", "Replies that matched no outstanding request."),
    ("storwatch_nfs_transport_connects_total", "Connections made (a rise means reconnects)."),
    (
        "storwatch_nfs_transport_requests_in_flight_sum_total",
        "Sum over sends of requests in flight; / sends = average.",
    ),
    ("storwatch_nfs_transport_backlog_sum_total", "Sum over sends of the backlog queue length; / sends = average."),
)

_NFS_BYTES = ("storwatch_nfs_bytes_total", "Bytes through the NFS client by kind (bytes: line).")
_NFS_BYTES_KINDS = ("normal_read", "normal_write", "direct_read", "direct_write", "server_read", "server_write")

# Every NFS family, in the order they are exported.
_NFS_COUNTERS = (*_NFS_OP_COUNTERS, *_XPRT_COUNTERS, _NFS_BYTES)


_OpLines = tuple[str, ...]
"""One procedure's sample lines, one per per-op metric (the errors line empty on kernels without that counter)."""


def _op_lines(mp: str, op: NFSOperation) -> _OpLines:
    labels = f'{{mountpoint="{mp}",operation="{label_value(op.name)}"}} '
    return (
        f"storwatch_nfs_operations_total{labels}{value_text(op.requests)}\n",
        f"storwatch_nfs_transmissions_total{labels}{value_text(op.transmissions)}\n",
        f"storwatch_nfs_major_timeouts_total{labels}{value_text(op.major_timeouts)}\n",
        f"storwatch_nfs_sent_bytes_total{labels}{value_text(op.bytes_sent)}\n",
        f"storwatch_nfs_received_bytes_total{labels}{value_text(op.bytes_received)}\n",
        f"storwatch_nfs_queue_seconds_total{labels}{value_text(op.queue_time_ms * _MS)}\n",
        f"storwatch_nfs_rtt_seconds_total{labels}{value_text(op.rtt_ms * _MS)}\n",
        f"storwatch_nfs_execute_seconds_total{labels}{value_text(op.execute_time_ms * _MS)}\n",
        "" if op.errors is None else f"storwatch_nfs_errors_total{labels}{value_text(op.errors)}\n",
    )


class _MountText:
    """One NFS mount's sample lines as last written, with what they were written from."""

    __slots__ = ("by_metric", "mount", "ops")

    def __init__(self, mount: NFSMount, by_metric: dict[str, str], ops: dict[NFSOperation, _OpLines]) -> None:
        self.mount = mount
        self.by_metric = by_metric
        """Lines by metric, each ready to go into its family."""
        self.ops = ops
        """Each procedure's lines by its counters: a procedure whose counters stand still keeps its lines."""


class WrittenLines:
    """The NFS area's memory: each mount's lines as last written, by mountpoint (ExportState.kept)."""

    def __init__(self) -> None:
        self.mounts: dict[str, _MountText] = {}


def _mount_text(
    mountpoint: str, nfs: NFSMount, before: _MountText | None, operations: tuple[str, ...] | None
) -> _MountText:
    """One NFS mount's sample lines, by metric, as render_text would write them (labels sorted by name), for the
    procedures in ``operations`` (None: all, in the kernel's order) that have been called."""
    mp = label_value(mountpoint)
    kept = before.ops if before is not None else {}
    ops: dict[NFSOperation, _OpLines] = {}
    chosen = nfs.operations if operations is None else (nfs.operation(name) for name in operations)
    for op in chosen:
        if op is not None and op.requests:
            lines = kept.get(op)
            ops[op] = lines if lines is not None else _op_lines(mp, op)
    by_metric: dict[str, str] = {}
    if ops:
        for (name, _), column in zip(_NFS_OP_COUNTERS, zip(*ops.values(), strict=True), strict=True):
            by_metric[name] = "".join(column)
    for i, t in enumerate(nfs.transports):
        labels = f'{{mountpoint="{mp}",protocol="{label_value(t.protocol)}",transport="{i}"}} '
        for (name, _), value in zip(
            _XPRT_COUNTERS, (t.sends, t.recvs, t.bad_xids, t.connect_count, t.req_u, t.backlog_u), strict=True
        ):
            if value is not None:
                by_metric[name] = by_metric.get(name, "") + f"{name}{labels}{value_text(value)}\n"
    b = nfs.bytes
    if b is not None:
        values = (b.normal_read, b.normal_write, b.direct_read, b.direct_write, b.server_read, b.server_write)
        by_metric[_NFS_BYTES[0]] = "".join(
            f'{_NFS_BYTES[0]}{{kind="{kind}",mountpoint="{mp}"}} {value_text(value)}\n'
            for kind, value in zip(_NFS_BYTES_KINDS, values, strict=True)
        )
    return _MountText(nfs, by_metric, ops)


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    if view is None or view.nfs is None:
        return
    # A mount whose counters are those of the last render (equal records) keeps its lines; in a changed one, only
    # the procedures whose counters moved are written again.
    memory = state.kept(WrittenLines)
    out = {name: Family(name, help_, "counter") for name, help_ in _NFS_COUNTERS}
    written: dict[str, _MountText] = {}
    for mountpoint, nfs in sorted(view.nfs.mounts.items()):
        text = memory.mounts.get(mountpoint)
        if text is None or text.mount != nfs:
            text = _mount_text(display_path(mountpoint), nfs, text, state.nfs_operations)
        written[mountpoint] = text
        for name, lines in text.by_metric.items():
            out[name].add_lines(lines)
    memory.mounts = written
    yield from out.values()
