"""Parse /proc/<pid>/mountstats for NFS client statistics (fs/proc_namespace.c show_vfsstat, fs/nfs/super.c
nfs_show_stats, net/sunrpc/stats.c rpc_clnt_show_stats and each transport's print_stats).

Every mount starts with ``device SOURCE mounted on MOUNTPOINT with fstype TYPE`` (``no device ...`` when the mount
has no source); NFS appends `` statvers=1.1`` and a block of tab-indented lines::

    device 10.0.0.5:/export mounted on /mnt/data with fstype nfs statvers=1.1
    \\topts:\\trw,vers=3,rsize=1048576,...
    \\tage:\\t86400
    \\tcaps:\\t... / \\tnfsv4:\\t... / \\tsec:\\t...          (skipped)
    \\tevents:\\t25 or 27 counters
    \\tbytes:\\t8 counters
    \\tRPC iostats version: 1.1  p/v: 100003/3 (nfs)
    \\txprt:\\ttcp PORT ...                                 (one per connection: several with nconnect)
    \\tper-op statistics
    \\t        READ: ops trans timeouts sent recv queue rtt execute [errors]

SOURCE and MOUNTPOINT are octal-escaped as in mountinfo. Bad lines are returned as errors with their line numbers
and skip only themselves; a bad ``device`` line skips its mount's block. The kernel ends every line with a newline,
so a last line without one was cut short by the reader; it is reported as truncated rather than trusted, because a
number cut in half still looks like a number.

Why one file: the block parser and the per-operation line parsers share one reading of the
kernel's layout and must change together when a kernel adds a field. The incremental readers and their caches are
the NFS source's (``sources/mountstats_reader.py``); an NFSMount made by one parses its own tables on first use and
asks that reader (through ``OperationMemory``) for per-op lines parsed by earlier reads, so a busy mount's tables
cost nothing until a scrape looks at them.
"""

from __future__ import annotations

import builtins
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from storwatch.procfs import LineError
from storwatch.procfs.mountinfo import unescape

NFS_FSTYPES = frozenset({"nfs", "nfs4"})

# enum nfs_stat_eventcounters (include/linux/nfs_iostat.h), in the order nfs_show_stats prints them. The last two
# (pNFS) arrived after NFS_IOSTAT_VERS became 1.1, so a 1.1 line holds 25 or 27 counters.
EVENT_NAMES: tuple[str, ...] = (
    "inoderevalidate",
    "dentryrevalidate",
    "datainvalidate",
    "attrinvalidate",
    "vfsopen",
    "vfslookup",
    "vfsaccess",
    "vfsupdatepage",
    "vfsreadpage",
    "vfsreadpages",
    "vfswritepage",
    "vfswritepages",
    "vfsgetdents",
    "vfssetattr",
    "vfsflush",
    "vfsfsync",
    "vfslock",
    "vfsrelease",
    "congestionwait",
    "setattrtrunc",
    "extendwrite",
    "sillyrename",
    "shortread",
    "shortwrite",
    "delay",
    "pnfs_read",
    "pnfs_write",
)
_MIN_EVENTS = 25

# struct rpcrdma_stats as xprt_rdma_print_stats prints it after the 10 generic counters. Kernels before 4.3 stop
# after bad_reply_count (20 numbers in all); later ones append the rest a few at a time (up to 27 numbers).
RDMA_COUNTER_NAMES: tuple[str, ...] = (
    "read_chunk_count",
    "write_chunk_count",
    "reply_chunk_count",
    "total_rdma_request",
    "total_rdma_reply",
    "pullup_copy_count",
    "fixup_copy_count",
    "hardway_register_count",
    "failed_marshal_count",
    "bad_reply_count",
    "nomsg_call_count",
    "mrs_recycled",
    "mrs_orphaned",
    "mrs_allocated",
    "local_inv_needed",
    "empty_sendctx_q",
    "reply_waits_for_send",
)
_RDMA_GENERIC = 10
_RDMA_MIN = _RDMA_GENERIC + 10


@dataclass(frozen=True, slots=True)
class NFSBytes:
    """The ``bytes:`` line: enum nfs_stat_bytecounters, totals since the mount."""

    normal_read: int
    """NFSIOS_NORMALREADBYTES: bytes read by applications through read() without O_DIRECT (served from the page
    cache or the server)."""
    normal_write: int
    """NFSIOS_NORMALWRITTENBYTES: bytes written by applications through write() without O_DIRECT."""
    direct_read: int
    """NFSIOS_DIRECTREADBYTES: bytes read by applications with O_DIRECT."""
    direct_write: int
    """NFSIOS_DIRECTWRITTENBYTES: bytes written by applications with O_DIRECT."""
    server_read: int
    """NFSIOS_SERVERREADBYTES: bytes read from the server by READ requests (what crossed the wire)."""
    server_write: int
    """NFSIOS_SERVERWRITTENBYTES: bytes written to the server by WRITE requests (what crossed the wire)."""
    read_pages: int
    """NFSIOS_READPAGES: pages read through the page cache's readpage/readpages paths."""
    write_pages: int
    """NFSIOS_WRITEPAGES: pages written through the writepage/writepages paths."""


@dataclass(frozen=True)
class NFSTransport:
    """One ``xprt:`` line: an RPC transport (one TCP connection with nconnect>1 gives several). Counters since the
    transport was created; fields a protocol or kernel does not print are None."""

    protocol: str
    """``tcp``, ``udp``, ``rdma`` or ``local`` (AF_LOCAL)."""
    port: int | None
    """Local source port (transport->srcport); always 0 for rdma ("need a local port?"), None for local."""
    bind_count: int
    """xprt->stat.bind_count: times the client asked rpcbind for the server's port."""
    connect_count: int | None
    """xprt->stat.connect_count: connections made (a rise means reconnects). None for udp."""
    connect_idle_time: int | None
    """xprt->stat.connect_time: total time spent waiting for connections to complete, in seconds (jiffies before
    kernels printed it divided by HZ). prometheus/procfs calls it ConnectIdleTime. None for udp."""
    idle_time: int | None
    """Seconds since the transport was last used, or 0 when it is not connected. None for udp."""
    sends: int
    """xprt->stat.sends: RPC requests sent."""
    recvs: int
    """xprt->stat.recvs: RPC replies received."""
    bad_xids: int
    """xprt->stat.bad_xids: replies whose XID matched no outstanding request (typically a reply to a request that
    had already timed out and been retransmitted)."""
    req_u: int
    """xprt->stat.req_u: sum over sends of the requests outstanding at send time; req_u / sends is the average
    number of requests in flight on this transport."""
    backlog_u: int
    """xprt->stat.bklog_u: sum over sends of the backlog queue length (requests waiting for a slot); backlog_u /
    sends is the average backlog."""
    max_slots: int | None
    """xprt->stat.max_slots: the most request slots ever in use at once. None for rdma and statvers=1.0 kernels."""
    sending_u: int | None
    """xprt->stat.sending_u: sum over sends of the sending queue length. None for rdma and statvers=1.0 kernels."""
    pending_u: int | None
    """xprt->stat.pending_u: sum over sends of the pending (awaiting reply) queue length. None for rdma and statvers=1.0
    kernels."""
    rdma: Mapping[str, int] = field(default_factory=dict, hash=False)
    """rdma only: struct rpcrdma_stats counters by name (``read_chunk_count``, ``mrs_allocated``...), as many as the
    kernel prints; empty for other protocols."""


class NFSOperation(NamedTuple):
    """One line of ``per-op statistics``: struct rpc_iostats for one RPC procedure, totals since the mount.

    A NamedTuple, not a frozen dataclass: a node with many busy NFS mounts parses thousands of these lines a second,
    and a frozen dataclass of 10 fields costs about 2 us to build, a NamedTuple a fifth of that."""

    name: str
    """Procedure name (``READ``, ``GETATTR``, ``LAYOUTGET``...), or its number when the kernel has no name for it."""
    requests: int
    """om_ops: RPC requests of this kind made (each counted once, however often it was sent)."""
    transmissions: int
    """om_ntrans: times requests of this kind were sent, retransmissions included; above ``requests`` means
    retransmits."""
    major_timeouts: int
    """om_timeouts: major timeouts (a request that went unanswered for timeo * retrans; "server not responding")."""
    bytes_sent: int
    """om_bytes_sent: bytes sent for these requests, RPC and transport headers included."""
    bytes_received: int
    """om_bytes_recv: bytes received in replies, RPC and transport headers included."""
    queue_time_ms: int
    """om_queue: milliseconds from the request's creation until it was transmitted, summed over requests."""
    rtt_ms: int
    """om_rtt: milliseconds from transmission until the reply was received, summed over requests."""
    execute_time_ms: int
    """om_execute: milliseconds from the request's creation until it completed, summed over requests (queue + rtt +
    client-side processing)."""
    errors: int | None
    """om_error_status: requests that completed with an error status (added in the 5.x series; some distribution
    kernels backport it). None on older kernels, which print 8 numbers."""


class OperationMemory(Protocol):
    """What a lazily parsed NFSMount asks of the reader that made it (storwatch/sources/mountstats_reader.py): where
    its bad lines go, and the per-op lines parsed for its mountpoint by earlier reads."""

    def report(self, errors: list[MountStatsError]) -> None: ...

    def parsed_op(self, mountpoint: str, line: builtins.bytes) -> NFSOperation | None: ...

    def remember_ops(self, mountpoint: str, parsed: dict[builtins.bytes, NFSOperation]) -> None: ...


class NFSMount:
    """One NFS mount's block of /proc/<pid>/mountstats.

    ``device``, ``mountpoint``, ``fstype`` and ``statvers`` come from the block's first line. The rest (options, age,
    events, bytes, transports, per-op table) is either given (:func:`parse_mountstats`) or parsed from the block on
    first use (``sources/mountstats_reader.py``): a reader of the file every second then pays for a busy mount's
    tables only when something (a scrape, the status page) looks at them. Either way the values are the same; two
    mounts are equal when every field is, and a mount hashes by its fields (the counter maps left out).

    Fields (the table's are properties; ``bytes`` is the ``bytes:`` line, not the type):
      options: the ``opts:`` line, the NFS mount options in effect (``vers=4.2``, ``nconnect=4``, ``proto=tcp``...).
      age_seconds: the ``age:`` line, seconds since the superblock was mounted, when every counter here started.
      events: the ``events:`` line, enum nfs_stat_eventcounters by lower-case name without NFSIOS_ (``vfsopen``,
        ``shortread``...; see EVENT_NAMES; ``event_N`` for counters a newer kernel adds). Empty if missing or bad.
      bytes: the ``bytes:`` line (NFSBytes); None if missing or bad.
      transports: the ``xprt:`` lines, in the kernel's order.
      operations: the ``per-op statistics`` lines, in the kernel's (procedure number) order.
    """

    __slots__ = (
        "_block",
        "_lineno",
        "_op_lines",
        "_operations",
        "_ops",
        "_parsed",
        "_perop",
        "_reader",
        "_table",
        "device",
        "fstype",
        "mountpoint",
        "statvers",
    )

    device: str
    """The mount's source (``server:/export``), octal escapes undone."""
    mountpoint: str
    """Mount point relative to the reading process's root, octal escapes undone."""
    fstype: str
    """``nfs`` (NFSv2/v3, and v4 mounted as ``-t nfs`` on some kernels) or ``nfs4``."""
    statvers: str | None
    """NFS_IOSTAT_VERS, ``1.0`` or ``1.1``; None if the device line had no ``statvers=``."""

    def __init__(
        self,
        device: str,
        mountpoint: str,
        fstype: str,
        statvers: str | None,
        options: tuple[str, ...] = (),
        age_seconds: int | None = None,
        events: Mapping[str, int] | None = None,
        bytes: NFSBytes | None = None,
        transports: tuple[NFSTransport, ...] = (),
        operations: tuple[NFSOperation, ...] = (),
    ) -> None:
        self.device, self.mountpoint, self.fstype, self.statvers = device, mountpoint, fstype, statvers
        self._table: _Table | None = _Table(options, age_seconds, events or {}, bytes, transports)
        self._operations: tuple[NFSOperation, ...] | None = operations
        """The whole per-op table, once parsed."""
        self._op_lines: list[tuple[builtins.bytes, int]] = []
        """Per-op lines the table's parse found before any ``per-op statistics`` line (a damaged header leaves them
        there), with their numbers in the block; those after it are split off when ``operations`` is asked for."""
        self._block: builtins.bytes = b""
        self._lineno = 1
        self._reader: OperationMemory | None = None
        self._parsed: dict[builtins.bytes, NFSOperation] = {}
        """Per-op lines this mount has parsed or found parsed before, for the reader to remember."""
        self._ops: dict[str, NFSOperation | None] = {}
        self._perop = -1
        """Offset in ``_block`` of the first per-op line, just past the ``per-op statistics`` line (0 when the block has
        no such line), found when first needed."""

    @classmethod
    def from_block(cls, head: DeviceLine, block: builtins.bytes, lineno: int, reader: OperationMemory) -> NFSMount:
        """A mount whose tables are parsed from ``block`` (its device line first, every line ending in a newline) on
        first use. ``lineno`` is the device line's number in the file; bad lines go to the reader's ``report`` with
        their numbers in the file, when the tables are parsed. Per-op lines the reader has seen parsed for this
        mountpoint before are not parsed again."""
        mount = cls.__new__(cls)  # not __init__: it would build a table only to drop it, once per busy mount a second
        mount.device, mount.mountpoint, mount.fstype, mount.statvers = (
            head.device,
            head.mountpoint,
            head.fstype,
            head.statvers,
        )
        mount._table, mount._block, mount._lineno, mount._reader, mount._ops = None, block, lineno, reader, {}
        mount._operations, mount._op_lines, mount._parsed, mount._perop = None, [], {}, -1
        return mount

    def _tables(self) -> _Table:
        """Everything but the per-op lines, which are parsed when asked for (``operations``, ``operation``)."""
        table = self._table
        if table is None:
            # Only the lines before the per-op ones: a scrape wants the transports of every changed mount, and
            # the per-op lines it exports it finds one by one (``operation``).
            cut = self._perop_start()
            builders, errors = _parse(self._block[:cut] if cut else self._block, defer_ops=True)
            if builders:
                table, self._op_lines = builders[0].table(), builders[0].op_lines
            else:
                table = _Table((), None, {}, None, ())
            self._report(errors)
            self._table = table  # one assignment: a reader in another thread sees the old None or the whole table
        return table

    def _report(self, errors: list[MountStatsError]) -> None:
        if errors and self._reader is not None:
            self._reader.report([_moved(e, self._lineno - 1) for e in errors])

    def _parse_op(self, line: builtins.bytes, lineno: int | Callable[[], int]) -> NFSOperation | None:
        """One per-op line (``lineno`` in the block, or how to count it: needed only when the line is bad): looked
        up among those parsed before, or parsed; None and reported when it is bad."""
        op = self._parsed.get(line)
        if op is None:
            op = self._reader.parsed_op(self.mountpoint, line) if self._reader is not None else None
            if op is None:
                try:
                    op = parse_operation_line(line, lineno if isinstance(lineno, int) else 0)
                except MountStatsError as err:
                    self._report([err if isinstance(lineno, int) else _moved(err, lineno())])
                    return None
            self._parsed[line] = op
            if self._reader is not None:
                self._reader.remember_ops(self.mountpoint, self._parsed)
        return op

    @property
    def options(self) -> tuple[str, ...]:
        return self._tables().options

    @property
    def age_seconds(self) -> int | None:
        return self._tables().age_seconds

    @property
    def events(self) -> Mapping[str, int]:
        return self._tables().events

    @property
    def bytes(self) -> NFSBytes | None:
        return self._tables().bytes

    @property
    def transports(self) -> tuple[NFSTransport, ...]:
        return self._tables().transports

    @property
    def operations(self) -> tuple[NFSOperation, ...]:
        ops = self._operations
        if ops is None:
            self._tables()
            parsed = (self._parse_op(line, lineno) for line, lineno in [*self._op_lines, *self._after_header()])
            ops = self._operations = tuple(op for op in parsed if op is not None)
        return ops

    def _after_header(self) -> list[tuple[builtins.bytes, int]]:
        """The lines after the ``per-op statistics`` line, with their numbers in the block; a line there that is
        neither indented nor blank is reported as ``_parse`` reports it."""
        block, cut = self._block, self._perop_start()
        if not cut:
            return []
        lines: list[tuple[builtins.bytes, int]] = []
        errors: list[MountStatsError] = []
        for n, line in enumerate(block[cut:].split(b"\n"), block.count(b"\n", 0, cut) + 1):
            if line[:1].isspace() and line.strip():
                lines.append((line, n))
            elif line.strip():
                errors.append(MountStatsError(n, _NOT_INDENTED, shown(line)))
        self._report(errors)
        return lines

    def operation(self, name: str) -> NFSOperation | None:
        """The per-op statistics for procedure ``name`` (``READ``), or None if the mount has none. On a mount read
        by :class:`MountStatsReader` whose per-op table is not parsed yet, only that one line is found and parsed."""
        if self._operations is not None:
            return next((op for op in self._operations if op.name == name), None)
        if name not in self._ops:
            self._ops[name] = self._one_operation(name)
        return self._ops[name]

    def _one_operation(self, name: str) -> NFSOperation | None:
        block = self._block
        key = name.encode("utf-8", "surrogateescape") + b": "
        at = op_line_at(block, key, self._perop_start(), len(block))
        if at is None:
            return None
        start, end = at
        return self._parse_op(block[start:end], functools.partial(_line_number, block, start))

    def _perop_start(self) -> int:
        start = self._perop
        if start < 0:
            header = self._block.find(PER_OP_HEADER)
            start = self._perop = header + len(PER_OP_HEADER) if header >= 0 else 0
        return start

    def _head_key(self) -> tuple[object, ...]:
        t = self._tables()
        return (self.device, self.mountpoint, self.fstype, self.statvers, t.options, t.age_seconds, t.bytes,
                t.transports)  # fmt: skip

    def _key(self) -> tuple[object, ...]:
        return (*self._head_key(), self.operations)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NFSMount):
            return NotImplemented
        # The per-op table is compared last: parsing it is most of the cost, and two reads of a mount differ in their
        # age (a second apart) or bytes before it, so the exporter's "has this mount changed?" stays cheap.
        return self is other or (
            self._head_key() == other._head_key()
            and self.events == other.events
            and self.operations == other.operations
        )

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        t = self._tables()
        return (
            f"NFSMount(device={self.device!r}, mountpoint={self.mountpoint!r}, fstype={self.fstype!r}, "
            f"statvers={self.statvers!r}, options={t.options!r}, age_seconds={t.age_seconds!r}, events={t.events!r}, "
            f"bytes={t.bytes!r}, transports={t.transports!r}, operations={self.operations!r})"
        )


@dataclass(frozen=True)
class _Table:
    options: tuple[str, ...]
    age_seconds: int | None
    events: Mapping[str, int] = field(hash=False)
    bytes: NFSBytes | None
    transports: tuple[NFSTransport, ...]


class MountStatsError(LineError):
    """A line of /proc/<pid>/mountstats that could not be parsed; ``lineno`` is 1-based."""


def _line_number(block: bytes, offset: int) -> int:
    """The 1-based number of the line that starts at ``offset`` in ``block``."""
    return block.count(b"\n", 0, offset) + 1


def shown(line: bytes) -> str:
    return line.decode("utf-8", "backslashreplace")


def _numbers(fields: list[bytes], lineno: int, line: bytes, what: str, signed: int | None = None) -> list[int]:
    # int() alone would take "+1", "1_000" and surrounding junk; the kernel prints plain decimals, all unsigned but
    # the one at index ``signed``.
    for i, f in enumerate(fields):
        digits = f[1:] if i == signed and f.startswith(b"-") else f
        if not digits.isdigit():
            raise MountStatsError(lineno, f"{what} holds a value that is not a decimal integer", shown(line))
    return [int(f) for f in fields]


_NO_ERRORS: dict[int, tuple[None, ...]] = {8: (None,), 9: ()}
_OP_NAMES: dict[bytes, str] = {}
"""Kernels before om_error_status print 8 numbers: their ``errors`` is None."""


def parse_operation_line(line: bytes, lineno: int = 1) -> NFSOperation:
    """Parse one ``per-op statistics`` line: ``NAME: ops trans timeouts sent recv queue rtt execute [errors]``."""
    fields = line.split()
    # The usual line in one split (names hold no spaces, the kernel writes "NAME: " and plain unsigned decimals);
    # bytes.isdigit is ASCII only, and one check of all the numbers keeps "+1", "1_000" and "-1" out of int().
    head = fields[0] if fields else b""
    if 9 <= len(fields) <= 10 and head[-1:] == b":" and b"".join(fields[1:]).isdigit() and b":" not in head[:-1]:
        name = _OP_NAMES.get(head)
        if name is None:
            name = os.fsdecode(head[:-1])
            if len(_OP_NAMES) < 1024:  # procedure names are a few dozen; a garbled file must not grow this for ever
                _OP_NAMES[head] = name
        if name:
            return NFSOperation(name, *map(int, fields[1:]), *_NO_ERRORS[len(fields) - 1])
    # Anything else is an error, or a line the kernel does not write but that still reads ("NAME : ...").
    name_part, sep, rest = line.partition(b":")
    fields = rest.split()
    if not sep or len(name_part.split()) != 1 or len(fields) not in (8, 9):
        raise MountStatsError(
            lineno, f"per-op line: expected 'NAME:' and 8 or 9 numbers, got {len(fields)}", shown(line)
        )
    if not b"".join(fields).isdigit():
        raise MountStatsError(lineno, "per-op line holds a value that is not a decimal integer", shown(line))
    return NFSOperation(os.fsdecode(name_part.strip()), *map(int, fields), *_NO_ERRORS[len(fields)])


class OperationTimes(NamedTuple):
    """What latency needs of one per-op line (see NFSOperation for each field's meaning in the kernel's terms)."""

    requests: int
    major_timeouts: int
    rtt_ms: int
    execute_time_ms: int


def parse_operation_times(line: bytes, lineno: int = 1) -> OperationTimes:
    """The requests, major timeouts, RTT and execute time of a ``per-op statistics`` line, checked as
    :func:`parse_operation_line` checks the whole line (a bad line raises its error), for about half the work: a
    reader every second of every busy mount's READ, WRITE and COMMIT lines needs no more."""
    fields = line.split()
    head = fields[0] if fields else b""
    name_ok = len(head) > 1 and head[-1:] == b":" and b":" not in head[:-1]
    if 9 <= len(fields) <= 10 and name_ok and b"".join(fields[1:]).isdigit():
        return OperationTimes(int(fields[1]), int(fields[3]), int(fields[7]), int(fields[8]))
    op = parse_operation_line(line, lineno)  # the precise error, or a line only the long way reads
    return OperationTimes(op.requests, op.major_timeouts, op.rtt_ms, op.execute_time_ms)


class OperationColumns(NamedTuple):
    """:func:`parse_operation_times` of many lines, as columns: item i of each list is line i's."""

    requests: list[int]
    major_timeouts: list[int]
    rtt_ms: list[int]
    execute_time_ms: list[int]


def parse_operation_times_all(lines: Sequence[builtins.bytes]) -> OperationColumns | None:
    """What :func:`parse_operation_times` reads of each line, for all of them in a few calls over the lot (a reader of
    64 busy mounts' READ, WRITE and COMMIT lines every second makes one call here, not 192); None when any line is
    not of the shape that function reads at once (each line is then parsed on its own, for its error or the long
    way): ``NAME:`` and the same count of plain decimals on every line, 8 or 9 as the kernel prints them.

    The lines are split as one, a ``|`` between each two. Every ``|`` is a field of its own that is neither a name
    (no colon) nor a number, so finding one exactly at the end of each line's place means that every line has that
    count of fields; then each line's first field must be its name and every other a number."""
    count = len(lines)
    if not count:
        return OperationColumns([], [], [], [])
    fields = b" | ".join(lines).split()
    stride = (len(fields) + 1) // count
    width = stride - 1
    if width not in (9, 10) or stride * count - 1 != len(fields) or fields[width::stride] != [b"|"] * (count - 1):
        return None
    for head in set(fields[::stride]):
        if len(head) < 2 or head[-1:] != b":" or b":" in head[:-1]:
            return None
    del fields[width::stride]
    del fields[::width]
    if not b"".join(fields).isdigit():
        return None
    numbers = width - 1
    return OperationColumns(
        list(map(int, fields[0::numbers])),
        list(map(int, fields[2::numbers])),
        list(map(int, fields[6::numbers])),
        list(map(int, fields[7::numbers])),
    )


# Numbers after the protocol name: the statvers=1.0 layout, then 1.1, which added max_slots, sending_u and pending_u.
_SOCKET_LAYOUTS = {"tcp": (10, 13), "udp": (7, 10), "local": (9, 12)}


def parse_transport_line(line: bytes, lineno: int = 1) -> NFSTransport:
    """Parse one ``xprt:`` line (tcp, udp, rdma or local)."""
    key, sep, rest = line.strip().partition(b":")
    fields = rest.split()
    if key != b"xprt" or not sep or not fields:
        raise MountStatsError(lineno, "not an 'xprt: PROTOCOL ...' line", shown(line))
    protocol = os.fsdecode(fields[0])
    count = len(fields) - 1
    if protocol == "rdma":
        if not _RDMA_MIN <= count <= _RDMA_GENERIC + len(RDMA_COUNTER_NAMES):
            raise MountStatsError(
                lineno,
                f"xprt rdma: expected {_RDMA_MIN} to {_RDMA_GENERIC + len(RDMA_COUNTER_NAMES)} numbers, got {count}",
                shown(line),
            )
    elif protocol in _SOCKET_LAYOUTS:
        if count not in _SOCKET_LAYOUTS[protocol]:
            short, full = _SOCKET_LAYOUTS[protocol]
            raise MountStatsError(
                lineno, f"xprt {protocol}: expected {short} or {full} numbers, got {count}", shown(line)
            )
    else:
        raise MountStatsError(lineno, f"xprt: unknown transport protocol {protocol!r}", shown(line))
    # idle_time is printed with %ld: a last_used stamped after the jiffies read makes it briefly negative.
    idle_index = {"udp": None, "local": 3}.get(protocol, 4)
    v = _numbers(fields[1:], lineno, line, f"xprt {protocol}", signed=idle_index)

    if protocol == "udp":
        # xs_udp_print_stats: port bind sends recvs bad_xids req_u bklog_u [max_slots sending_u pending_u]
        return NFSTransport(
            protocol=protocol,
            port=v[0],
            bind_count=v[1],
            connect_count=None,
            connect_idle_time=None,
            idle_time=None,
            sends=v[2],
            recvs=v[3],
            bad_xids=v[4],
            req_u=v[5],
            backlog_u=v[6],
            max_slots=_at(v, 7),
            sending_u=_at(v, 8),
            pending_u=_at(v, 9),
        )
    if protocol == "local":
        # xs_local_print_stats: the tcp layout without a port.
        v = [0, *v]
    # xs_tcp_print_stats / xprt_rdma_print_stats: port bind connect connect_time idle sends recvs bad_xids req_u
    # bklog_u, then [max_slots sending_u pending_u] for tcp and local, the rpcrdma_stats counters for rdma.
    rdma = dict(zip(RDMA_COUNTER_NAMES, v[_RDMA_GENERIC:], strict=False)) if protocol == "rdma" else {}
    socket_tail = protocol != "rdma"
    return NFSTransport(
        protocol=protocol,
        port=None if protocol == "local" else v[0],
        bind_count=v[1],
        connect_count=v[2],
        connect_idle_time=v[3],
        idle_time=v[4],
        sends=v[5],
        recvs=v[6],
        bad_xids=v[7],
        req_u=v[8],
        backlog_u=v[9],
        max_slots=_at(v, 10) if socket_tail else None,
        sending_u=_at(v, 11) if socket_tail else None,
        pending_u=_at(v, 12) if socket_tail else None,
        rdma=rdma,
    )


def _at(values: list[int], index: int) -> int | None:
    return values[index] if index < len(values) else None


def parse_events_line(line: bytes, lineno: int = 1) -> dict[str, int]:
    """Parse an ``events:`` line into counters by name (see EVENT_NAMES)."""
    values = _numbers(line.strip().partition(b":")[2].split(), lineno, line, "events")
    if len(values) < _MIN_EVENTS:
        raise MountStatsError(
            lineno, f"events: expected at least {_MIN_EVENTS} counters, got {len(values)}", shown(line)
        )
    names = [*EVENT_NAMES, *(f"event_{i}" for i in range(len(EVENT_NAMES), len(values)))]
    return dict(zip(names, values, strict=False))


def parse_bytes_line(line: bytes, lineno: int = 1) -> NFSBytes:
    """Parse a ``bytes:`` line (enum nfs_stat_bytecounters: exactly 8 counters)."""
    values = _numbers(line.strip().partition(b":")[2].split(), lineno, line, "bytes")
    if len(values) != 8:
        raise MountStatsError(lineno, f"bytes: expected 8 counters, got {len(values)}", shown(line))
    return NFSBytes(*values)


@dataclass(frozen=True)
class DeviceLine:
    device: str
    mountpoint: str
    fstype: str
    statvers: str | None


def parse_device_line(line: bytes, lineno: int) -> DeviceLine:
    # Source and mount point are escaped by the kernel (space as \040), so single spaces separate the fields.
    fields = line.split(b" ")
    if fields[:2] == [b"no", b"device"]:
        fields = [b"device", b"", *fields[2:]]
    if (
        len(fields) not in (8, 9)
        or fields[0] != b"device"
        or fields[2:4] != [b"mounted", b"on"]
        or fields[5:7] != [b"with", b"fstype"]
        or not fields[7]
    ):
        raise MountStatsError(
            lineno, "expected 'device SOURCE mounted on MOUNTPOINT with fstype TYPE [statvers=V]'", shown(line)
        )
    statvers: str | None = None
    if len(fields) == 9:
        key, sep, value = fields[8].partition(b"=")
        if key != b"statvers" or not sep or not value:
            raise MountStatsError(lineno, "expected 'statvers=VERSION' after the fstype", shown(line))
        statvers = os.fsdecode(value)
    if b"\x00" in line or b"\\000" in fields[1] + b" " + fields[4]:
        # The kernel prints C strings (see mountinfo.parse_line): a NUL is never in a line it wrote.
        raise MountStatsError(lineno, "the source or mount point holds a NUL byte", shown(line))
    return DeviceLine(unescape(fields[1]), unescape(fields[4]), os.fsdecode(fields[7]), statvers)


class _MountBuilder:
    def __init__(self, head: DeviceLine, defer_ops: bool = False) -> None:
        self.head = head
        self.defer_ops = defer_ops
        self.op_lines: list[tuple[bytes, int]] = []
        """With ``defer_ops``: the per-op lines and their numbers, not parsed."""
        self.options: tuple[str, ...] = ()
        self.age_seconds: int | None = None
        self.events: dict[str, int] = {}
        self.bytes: NFSBytes | None = None
        self.transports: list[NFSTransport] = []
        self.operations: list[NFSOperation] = []

    def add(self, line: bytes, lineno: int) -> None:
        key, sep, rest = line.partition(b":")
        key = key.strip()
        if sep and key in _KEYED_LINES:
            _KEYED_LINES[key](self, line, rest, lineno)
        elif (sep and rest.startswith(b"\t")) or key in (b"RPC iostats version", b"per-op statistics"):
            # caps:, nfsv4:, sec:, impl_id:, fsc: and any later "key:<TAB>value" line: nothing we report. Per-op
            # lines print "NAME: " with a space, so they never land here.
            pass
        elif self.defer_ops:
            self.op_lines.append((line, lineno))
        else:
            self.operations.append(parse_operation_line(line, lineno))

    def _options(self, line: bytes, rest: bytes, lineno: int) -> None:
        self.options = tuple(os.fsdecode(o) for o in rest.strip().split(b",") if o)

    def _age(self, line: bytes, rest: bytes, lineno: int) -> None:
        fields = rest.split()
        if len(fields) != 1:
            raise MountStatsError(lineno, f"age: expected 1 number, got {len(fields)}", shown(line))
        self.age_seconds = _numbers(fields, lineno, line, "age")[0]

    def _events(self, line: bytes, rest: bytes, lineno: int) -> None:
        self.events = parse_events_line(line, lineno)

    def _bytes(self, line: bytes, rest: bytes, lineno: int) -> None:
        self.bytes = parse_bytes_line(line, lineno)

    def _transport(self, line: bytes, rest: bytes, lineno: int) -> None:
        self.transports.append(parse_transport_line(line, lineno))

    def table(self) -> _Table:
        return _Table(self.options, self.age_seconds, self.events, self.bytes, tuple(self.transports))

    def build(self) -> NFSMount:
        return NFSMount(
            device=self.head.device,
            mountpoint=self.head.mountpoint,
            fstype=self.head.fstype,
            statvers=self.head.statvers,
            options=self.options,
            age_seconds=self.age_seconds,
            events=self.events,
            bytes=self.bytes,
            transports=tuple(self.transports),
            operations=tuple(self.operations),
        )


_KEYED_LINES: dict[bytes, Callable[[_MountBuilder, bytes, bytes, int], None]] = {
    b"opts": _MountBuilder._options,
    b"age": _MountBuilder._age,
    b"events": _MountBuilder._events,
    b"bytes": _MountBuilder._bytes,
    b"xprt": _MountBuilder._transport,
}
"""The ``key:`` lines a mount's block is read for, other than its per-op lines."""


_NOT_INDENTED = "expected a 'device ...' line or an indented statistics line"


def parse_mountstats(data: bytes) -> tuple[list[NFSMount], list[MountStatsError]]:
    """Parse a whole /proc/<pid>/mountstats into its NFS mounts (nfs and nfs4; other mounts are passed over).

    Bad lines are returned as errors and skip only themselves; a bad ``device`` line skips its mount's block. Good
    lines and other mounts are never lost to them. A caller that reads the file again and again uses
    :class:`MountStatsReader`, which gives the same mounts and errors for a fraction of the work.
    """
    builders, errors = _parse(data)
    return [b.build() for b in builders], errors


def _parse(data: bytes, defer_ops: bool = False) -> tuple[list[_MountBuilder], list[MountStatsError]]:
    mounts: list[_MountBuilder] = []
    errors: list[MountStatsError] = []
    current: _MountBuilder | None = None
    # True inside the block of a mount we do not report: a non-NFS mount, or one whose device line was bad.
    skipping = False
    lines = data.split(b"\n")
    last = len(lines)
    i = 0
    while i < last:
        line = lines[i]
        i += 1
        lineno = i
        if not line.strip():
            continue
        if lineno == len(lines):
            errors.append(MountStatsError(lineno, "truncated: the last line has no newline", shown(line)))
            continue
        if not line[:1].isspace():
            if line.startswith((b"device ", b"no device ")):
                if current is not None:
                    mounts.append(current)
                current, skipping = None, True
                try:
                    head = parse_device_line(line, lineno)
                except MountStatsError as err:
                    errors.append(err)
                    continue
                if head.fstype in NFS_FSTYPES:
                    current, skipping = _MountBuilder(head, defer_ops), False
                continue
            # Not a device line and not indented: a stray or mangled line; the mount around it carries on.
            errors.append(MountStatsError(lineno, _NOT_INDENTED, shown(line)))
            continue
        if skipping:
            continue
        if current is None:
            errors.append(MountStatsError(lineno, "statistics line before any 'device ...' line", shown(line)))
            continue
        try:
            current.add(line, lineno)
        except MountStatsError as err:
            errors.append(err)
    if current is not None:
        mounts.append(current)
    return mounts, errors


def _moved(err: MountStatsError, offset: int) -> MountStatsError:
    """The same error for a block that starts ``offset`` lines into the file."""
    moved = MountStatsError(err.lineno + offset, "", err.line)
    moved.args = (str(err).replace(f"line {err.lineno}:", f"line {err.lineno + offset}:", 1),)
    return moved


PER_OP_HEADER = b"\n\tper-op statistics\n"


def op_line_at(data: bytes, key: bytes, lo: int, hi: int) -> tuple[int, int] | None:
    """Where the per-op line of ``key`` (``b"READ: "``) lies in ``data[lo:hi]``: the start and end (before its newline)
    of the first line that begins with it after the kernel's padding; None when there is none or it is cut short."""
    i = data.find(key, lo, hi)
    while i >= 0:
        start = data.rfind(b"\n", 0, i) + 1
        if not data[start:i].strip():  # the name begins its line
            end = data.find(b"\n", i, hi)
            return (start, end) if end >= 0 else None  # no newline: cut short, not trusted
        i = data.find(key, i + 1, hi)
    return None


def later_blocks(data: bytes) -> list[int]:
    """The offsets of the ``device`` and ``no device`` lines in ``data`` after its first line, in order."""
    starts: list[int] = []
    i = next_block(data, 1)
    while i >= 0:
        starts.append(i)
        i = next_block(data, i + 1)
    return starts


def next_block(data: bytes, lo: int, hi: int | None = None) -> int:
    """The offset of the first ``device`` or ``no device`` line that begins at or after ``lo`` (and before ``hi``),
    or -1: one search for ``device ``, a hit kept where a line begins with it, or with ``no `` and it (a search for
    each of the two went through the whole file twice; with 64 NFS mounts, a quarter of a megabyte read every second,
    one time through costs as much as finding every line the reader needs in it)."""
    end = len(data) if hi is None else hi
    i = data.find(b"device ", lo, end + 3 + 7)
    while i >= 0:
        if i >= 1 and i >= lo and data[i - 1] == 10:  # b"\n" before it
            start = i
        elif i >= 4 and i - 3 >= lo and data[i - 4 : i] == b"\nno ":
            start = i - 3
        else:
            i = data.find(b"device ", i + 7, end + 3 + 7)
            continue
        return start if start < end else -1
    return -1


def line_number(data: bytes, offset: int) -> int:
    """The 1-based number of the line that starts at ``offset`` in ``data``."""
    return data.count(b"\n", 0, offset) + 1


def moved(err: MountStatsError, lineno: int) -> MountStatsError:
    """``err`` (from parsing one line on its own, as line 1) as the error of line ``lineno`` of the file."""
    return _moved(err, lineno - 1)
