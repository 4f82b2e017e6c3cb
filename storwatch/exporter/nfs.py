"""The NFS area: per-mount, per-procedure RPC counters, per-transport counters and the ``bytes:`` counters of every NFS
mount (storwatch_nfs_*). Most of a large node's series: each mount's lines are kept from one render to the next
while its counters stand still, and each procedure's while its own do."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.view import View
from storwatch.config import DEFAULT_NFS_OPERATIONS
from storwatch.exporter.area import ExportState
from storwatch.exporter.spec import Label, counter
from storwatch.exporter.text import Family, label_value, labels_template, value_text
from storwatch.printable import shown
from storwatch.procfs.mountstats import NFSMount, NFSOperation

# -- the metrics this area writes (storwatch/exporter/catalog.py assembles them)

NFS_MOUNTPOINT = Label("mountpoint", "one per NFS mount of the node with series (mounts.max_series)")
NFS_OPERATION = Label(
    "operation",
    f"the procedures in nfs.operations that the mount has called ({len(DEFAULT_NFS_OPERATIONS)} by default; "
    'with ["*"] every procedure the kernel counts, about 70 on NFSv4.2)',
)
NFS_TRANSPORT = Label("transport", "one per RPC transport of the mount (its index; more than one with nconnect)")
NFS_PROTOCOL = Label("protocol", "one per transport: its protocol as mountstats names it (tcp, udp, rdma)")

# -- nfs: per procedure, per transport, and the bytes: line

NFS_OPERATIONS = counter(
    "nfs", "storwatch_nfs_operations_total", "RPC requests made, per NFS operation.", NFS_MOUNTPOINT, NFS_OPERATION
)
NFS_TRANSMISSIONS = counter(
    "nfs",
    "storwatch_nfs_transmissions_total",
    "RPC transmissions, retransmissions included.",
    NFS_MOUNTPOINT,
    NFS_OPERATION,
)
NFS_MAJOR_TIMEOUTS = counter(
    "nfs",
    "storwatch_nfs_major_timeouts_total",
    "Requests that hit a major timeout (server not responding).",
    NFS_MOUNTPOINT,
    NFS_OPERATION,
)
NFS_SENT_BYTES = counter(
    "nfs",
    "storwatch_nfs_sent_bytes_total",
    "Bytes sent for these requests, headers included.",
    NFS_MOUNTPOINT,
    NFS_OPERATION,
)
NFS_RECEIVED_BYTES = counter(
    "nfs",
    "storwatch_nfs_received_bytes_total",
    "Bytes received in replies, headers included.",
    NFS_MOUNTPOINT,
    NFS_OPERATION,
)
NFS_QUEUE_SECONDS = counter(
    "nfs",
    "storwatch_nfs_queue_seconds_total",
    "Time requests waited before transmission.",
    NFS_MOUNTPOINT,
    NFS_OPERATION,
)
NFS_RTT_SECONDS = counter(
    "nfs", "storwatch_nfs_rtt_seconds_total", "Time from transmission to reply.", NFS_MOUNTPOINT, NFS_OPERATION
)
NFS_EXECUTE_SECONDS = counter(
    "nfs",
    "storwatch_nfs_execute_seconds_total",
    "Time from creation to completion (queue + RTT + client processing).",
    NFS_MOUNTPOINT,
    NFS_OPERATION,
)
NFS_ERRORS = counter(
    "nfs",
    "storwatch_nfs_errors_total",
    "Requests that completed with an error status.",
    NFS_MOUNTPOINT,
    NFS_OPERATION,
)
NFS_TRANSPORT_SENDS = counter(
    "nfs",
    "storwatch_nfs_transport_sends_total",
    "RPC requests sent on the transport.",
    NFS_MOUNTPOINT,
    NFS_TRANSPORT,
    NFS_PROTOCOL,
)
NFS_TRANSPORT_RECEIVES = counter(
    "nfs",
    "storwatch_nfs_transport_receives_total",
    "RPC replies received on the transport.",
    NFS_MOUNTPOINT,
    NFS_TRANSPORT,
    NFS_PROTOCOL,
)
NFS_TRANSPORT_BAD_XIDS = counter(
    "nfs",
    "storwatch_nfs_transport_bad_xids_total",
    "Replies that matched no outstanding request.",
    NFS_MOUNTPOINT,
    NFS_TRANSPORT,
    NFS_PROTOCOL,
)
NFS_TRANSPORT_CONNECTS = counter(
    "nfs",
    "storwatch_nfs_transport_connects_total",
    "Connections made (a rise means reconnects).",
    NFS_MOUNTPOINT,
    NFS_TRANSPORT,
    NFS_PROTOCOL,
)
NFS_TRANSPORT_REQUESTS_IN_FLIGHT_SUM = counter(
    "nfs",
    "storwatch_nfs_transport_requests_in_flight_sum_total",
    "Sum over sends of requests in flight; / sends = average.",
    NFS_MOUNTPOINT,
    NFS_TRANSPORT,
    NFS_PROTOCOL,
)
NFS_TRANSPORT_BACKLOG_SUM = counter(
    "nfs",
    "storwatch_nfs_transport_backlog_sum_total",
    "Sum over sends of the backlog queue length; / sends = average.",
    NFS_MOUNTPOINT,
    NFS_TRANSPORT,
    NFS_PROTOCOL,
)
NFS_BYTES = counter(
    "nfs",
    "storwatch_nfs_bytes_total",
    "Bytes through the NFS client by kind (bytes: line).",
    NFS_MOUNTPOINT,
    Label(
        "kind",
        "the counters of mountstats' bytes: line, in its order",
        ("normal_read", "normal_write", "direct_read", "direct_write", "server_read", "server_write"),
    ),
)


_MS = 0.001

# Per procedure, in the order of _op_lines.
_NFS_OP_COUNTERS = (
    NFS_OPERATIONS,
    NFS_TRANSMISSIONS,
    NFS_MAJOR_TIMEOUTS,
    NFS_SENT_BYTES,
    NFS_RECEIVED_BYTES,
    NFS_QUEUE_SECONDS,
    NFS_RTT_SECONDS,
    NFS_EXECUTE_SECONDS,
    NFS_ERRORS,
)
# Per transport, in the order of the values _mount_text takes from it.
_XPRT_COUNTERS = (
    NFS_TRANSPORT_SENDS,
    NFS_TRANSPORT_RECEIVES,
    NFS_TRANSPORT_BAD_XIDS,
    NFS_TRANSPORT_CONNECTS,
    NFS_TRANSPORT_REQUESTS_IN_FLIGHT_SUM,
    NFS_TRANSPORT_BACKLOG_SUM,
)
_NFS_BYTES_KINDS = NFS_BYTES.values("kind")
"""In the order of mountstats' bytes: line, as _mount_text reads it."""

# Every NFS family, in the order they are exported.
_NFS_COUNTERS = (*_NFS_OP_COUNTERS, *_XPRT_COUNTERS, NFS_BYTES)

# Every per-procedure family has the labels of NFS_OPERATIONS, every per-transport one those of
# NFS_TRANSPORT_SENDS: each mount writes their label sets from one template of each (_mount_text).
_OP_LABEL_NAMES = NFS_OPERATIONS.label_names
_XPRT_LABELS = labels_template(NFS_TRANSPORT_SENDS.label_names)
_BYTES_LABELS = labels_template(NFS_BYTES.label_names)
(_OPERATIONS, _TRANSMISSIONS, _MAJOR_TIMEOUTS, _SENT, _RECEIVED, _QUEUE, _RTT, _EXECUTE, _ERRORS) = (
    spec.name for spec in _NFS_OP_COUNTERS
)


_OpLines = tuple[str, ...]
"""One procedure's sample lines, one per per-op metric (the errors line empty on kernels without that counter)."""
_MOVED = ("",)
"""What a procedure absent from the last render is looked up as (None there means present, its lines not kept)."""


def _op_lines(template: str, op: NFSOperation) -> _OpLines:
    """``template``: the mount's label set of a procedure, with a space after it, to be filled with its name."""
    labels = template.format(label_value(op.name))
    return (
        f"{_OPERATIONS}{labels}{value_text(op.requests)}\n",
        f"{_TRANSMISSIONS}{labels}{value_text(op.transmissions)}\n",
        f"{_MAJOR_TIMEOUTS}{labels}{value_text(op.major_timeouts)}\n",
        f"{_SENT}{labels}{value_text(op.bytes_sent)}\n",
        f"{_RECEIVED}{labels}{value_text(op.bytes_received)}\n",
        f"{_QUEUE}{labels}{value_text(op.queue_time_ms * _MS)}\n",
        f"{_RTT}{labels}{value_text(op.rtt_ms * _MS)}\n",
        f"{_EXECUTE}{labels}{value_text(op.execute_time_ms * _MS)}\n",
        "" if op.errors is None else f"{_ERRORS}{labels}{value_text(op.errors)}\n",
    )


class _MountText:
    """One NFS mount's sample lines as last written, with what they were written from."""

    __slots__ = ("mount", "ops", "others", "template")

    def __init__(
        self, mount: NFSMount, ops: dict[NFSOperation, _OpLines | None], others: dict[str, str], template: str
    ) -> None:
        self.mount = mount
        self.ops = ops
        """Each procedure by its counters, with its lines where they are kept: only once its counters stood still
        from one render to the next. One that moved (None) is likely to move again by the next render, so its lines
        would be written again anyway: on a busy node's NFS mounts, keeping them held 1.6 MB that no render read."""
        self.others = others
        """The per-transport and bytes lines, by metric, each ready to go into its family."""
        self.template = template
        """The mount's label set of a procedure (_op_lines)."""

    def unchanged(self) -> list[_OpLines]:
        """Each procedure's lines, in order, for a mount whose counters all stood still since the last render: those
        not kept are written now, and kept from now on."""
        written = []
        for op, lines in self.ops.items():
            if lines is None:
                lines = self.ops[op] = _op_lines(self.template, op)
            written.append(lines)
        return written


class WrittenLines:
    """The NFS area's memory: each mount's lines as last written, by mountpoint (ExportState.kept)."""

    def __init__(self) -> None:
        self.mounts: dict[str, _MountText] = {}


def _mount_text(
    mountpoint: str, nfs: NFSMount, before: _MountText | None, operations: tuple[str, ...] | None
) -> tuple[_MountText, list[_OpLines]]:
    """One NFS mount's sample lines as render_text would write them (labels sorted by name), and what is kept of
    them: the lines of each procedure in ``operations`` (None: all, in the kernel's order) that has been called, and
    its transports' and bytes' by metric."""
    mp = label_value(mountpoint)
    template = labels_template(_OP_LABEL_NAMES, {"mountpoint": mountpoint}) + " "
    kept = before.ops if before is not None else {}
    ops: dict[NFSOperation, _OpLines | None] = {}
    written: list[_OpLines] = []
    chosen = nfs.operations if operations is None else (nfs.operation(name) for name in operations)
    for op in chosen:
        if op is not None and op.requests:
            prior = kept.get(op, _MOVED)
            if prior is _MOVED:
                lines = _op_lines(template, op)
                ops[op] = None
            else:  # its counters stood still since the last render: its lines are kept
                lines = ops[op] = prior or _op_lines(template, op)
            written.append(lines)
    others: dict[str, str] = {}
    for i, t in enumerate(nfs.transports):
        labels = _XPRT_LABELS.format(mp, i, label_value(t.protocol)) + " "
        for spec, value in zip(
            _XPRT_COUNTERS, (t.sends, t.recvs, t.bad_xids, t.connect_count, t.req_u, t.backlog_u), strict=True
        ):
            if value is not None:
                name = spec.name
                others[name] = others.get(name, "") + f"{name}{labels}{value_text(value)}\n"
    b = nfs.bytes
    if b is not None:
        values = (b.normal_read, b.normal_write, b.direct_read, b.direct_write, b.server_read, b.server_write)
        name = NFS_BYTES.name
        others[name] = "".join(
            f"{name}{_BYTES_LABELS.format(mp, kind)} {value_text(value)}\n"
            for kind, value in zip(_NFS_BYTES_KINDS, values, strict=True)
        )
    return _MountText(nfs, ops, others, template), written


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    if view is None or view.nfs is None:
        return
    # A mount whose counters are those of the last render (equal records) keeps its lines; in a changed one, only
    # the procedures whose counters moved are written again. A procedure's lines are kept once its counters stood
    # still from one render to the next (_MountText.ops).
    memory = state.kept(WrittenLines)
    out = {spec.name: spec.family() for spec in _NFS_COUNTERS}
    op_families = [out[spec.name].lines for spec in _NFS_OP_COUNTERS]  # in the order of _OpLines
    written: dict[str, _MountText] = {}
    left_out = state.unexported_mounts(view)
    for mountpoint, nfs in sorted(view.nfs.mounts.items()):
        if mountpoint in left_out:
            continue
        text = memory.mounts.get(mountpoint)
        if text is None or text.mount != nfs:
            text, op_written = _mount_text(shown(mountpoint), nfs, text, state.nfs_operations)
        else:
            op_written = text.unchanged()
        written[mountpoint] = text
        for op_lines in op_written:
            for family_lines, line in zip(op_families, op_lines, strict=True):
                if line:  # the errors line of a kernel without that counter is empty
                    family_lines.append(line)
        for name, lines in text.others.items():
            out[name].add_lines(lines)
    memory.mounts = written
    yield from out.values()
