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
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class NFSOperation:
    """One line of ``per-op statistics``: struct rpc_iostats for one RPC procedure, totals since the mount."""

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


@dataclass(frozen=True)
class NFSMount:
    """One NFS mount's block of /proc/<pid>/mountstats."""

    device: str
    """The mount's source (``server:/export``), octal escapes undone."""
    mountpoint: str
    """Mount point relative to the reading process's root, octal escapes undone."""
    fstype: str
    """``nfs`` (NFSv2/v3, and v4 mounted as ``-t nfs`` on some kernels) or ``nfs4``."""
    statvers: str | None
    """NFS_IOSTAT_VERS, ``1.0`` or ``1.1``; None if the device line had no ``statvers=``."""
    options: tuple[str, ...]
    """The ``opts:`` line: the NFS mount options in effect (``vers=4.2``, ``nconnect=4``, ``proto=tcp``...)."""
    age_seconds: int | None
    """The ``age:`` line: seconds since the superblock was mounted, which is when every counter here started."""
    events: Mapping[str, int] = field(hash=False)
    """The ``events:`` line: enum nfs_stat_eventcounters by lower-case name without NFSIOS_ (``inoderevalidate``,
    ``vfsopen``, ``shortread``, ``pnfs_read``...; see EVENT_NAMES). Counters a newer kernel adds are named
    ``event_N`` by position. Empty if the line was missing or bad."""
    bytes: NFSBytes | None
    """The ``bytes:`` line; None if it was missing or bad."""
    transports: tuple[NFSTransport, ...]
    """The ``xprt:`` lines, in the kernel's order."""
    operations: tuple[NFSOperation, ...]
    """The ``per-op statistics`` lines, in the kernel's (procedure number) order."""

    def operation(self, name: str) -> NFSOperation | None:
        """The per-op statistics for procedure ``name`` (``READ``), or None if the mount has none."""
        return next((op for op in self.operations if op.name == name), None)


class MountStatsError(LineError):
    """A line of /proc/<pid>/mountstats that could not be parsed; ``lineno`` is 1-based."""


def _shown(line: bytes) -> str:
    return line.decode("utf-8", "backslashreplace")


def _numbers(fields: list[bytes], lineno: int, line: bytes, what: str, signed: int | None = None) -> list[int]:
    # int() alone would take "+1", "1_000" and surrounding junk; the kernel prints plain decimals, all unsigned but
    # the one at index ``signed``.
    for i, f in enumerate(fields):
        digits = f[1:] if i == signed and f.startswith(b"-") else f
        if not digits.isdigit():
            raise MountStatsError(lineno, f"{what} holds a value that is not a decimal integer", _shown(line))
    return [int(f) for f in fields]


# The common case in one match: a name, a colon, then 8 or 9 plain decimals (the kernel prints no signs).
_OP_LINE = re.compile(rb"\s*([^\s:]+): +((?:\d+ +){7}\d+)(?: +(\d+))?\s*")


def parse_operation_line(line: bytes, lineno: int = 1) -> NFSOperation:
    """Parse one ``per-op statistics`` line: ``NAME: ops trans timeouts sent recv queue rtt execute [errors]``."""
    # A host with many NFS mounts has thousands of these lines a second: parse the well-formed ones fast and leave
    # the precise complaint to the slow path below.
    m = _OP_LINE.fullmatch(line)
    if m is not None:
        v = [int(x) for x in m.group(2).split()]
        errors = m.group(3)
        return NFSOperation(
            os.fsdecode(m.group(1)), v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], int(errors) if errors else None
        )
    name, sep, rest = line.strip().partition(b":")
    fields = rest.split()
    if not sep or len(name.split()) != 1 or len(fields) not in (8, 9):
        raise MountStatsError(
            lineno, f"per-op line: expected 'NAME:' and 8 or 9 numbers, got {len(fields)}", _shown(line)
        )
    values = _numbers(fields, lineno, line, "per-op line")
    return NFSOperation(
        name=os.fsdecode(name),
        requests=values[0],
        transmissions=values[1],
        major_timeouts=values[2],
        bytes_sent=values[3],
        bytes_received=values[4],
        queue_time_ms=values[5],
        rtt_ms=values[6],
        execute_time_ms=values[7],
        errors=values[8] if len(values) == 9 else None,
    )


# Numbers after the protocol name: the statvers=1.0 layout, then 1.1, which added max_slots, sending_u and pending_u.
_SOCKET_LAYOUTS = {"tcp": (10, 13), "udp": (7, 10), "local": (9, 12)}


def parse_transport_line(line: bytes, lineno: int = 1) -> NFSTransport:
    """Parse one ``xprt:`` line (tcp, udp, rdma or local)."""
    key, sep, rest = line.strip().partition(b":")
    fields = rest.split()
    if key != b"xprt" or not sep or not fields:
        raise MountStatsError(lineno, "not an 'xprt: PROTOCOL ...' line", _shown(line))
    protocol = os.fsdecode(fields[0])
    count = len(fields) - 1
    if protocol == "rdma":
        if not _RDMA_MIN <= count <= _RDMA_GENERIC + len(RDMA_COUNTER_NAMES):
            raise MountStatsError(
                lineno,
                f"xprt rdma: expected {_RDMA_MIN} to {_RDMA_GENERIC + len(RDMA_COUNTER_NAMES)} numbers, got {count}",
                _shown(line),
            )
    elif protocol in _SOCKET_LAYOUTS:
        if count not in _SOCKET_LAYOUTS[protocol]:
            short, full = _SOCKET_LAYOUTS[protocol]
            raise MountStatsError(
                lineno, f"xprt {protocol}: expected {short} or {full} numbers, got {count}", _shown(line)
            )
    else:
        raise MountStatsError(lineno, f"xprt: unknown transport protocol {protocol!r}", _shown(line))
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
            lineno, f"events: expected at least {_MIN_EVENTS} counters, got {len(values)}", _shown(line)
        )
    names = [*EVENT_NAMES, *(f"event_{i}" for i in range(len(EVENT_NAMES), len(values)))]
    return dict(zip(names, values, strict=False))


def parse_bytes_line(line: bytes, lineno: int = 1) -> NFSBytes:
    """Parse a ``bytes:`` line (enum nfs_stat_bytecounters: exactly 8 counters)."""
    values = _numbers(line.strip().partition(b":")[2].split(), lineno, line, "bytes")
    if len(values) != 8:
        raise MountStatsError(lineno, f"bytes: expected 8 counters, got {len(values)}", _shown(line))
    return NFSBytes(*values)


@dataclass(frozen=True)
class _DeviceLine:
    device: str
    mountpoint: str
    fstype: str
    statvers: str | None


def _parse_device_line(line: bytes, lineno: int) -> _DeviceLine:
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
            lineno, "expected 'device SOURCE mounted on MOUNTPOINT with fstype TYPE [statvers=V]'", _shown(line)
        )
    statvers: str | None = None
    if len(fields) == 9:
        key, sep, value = fields[8].partition(b"=")
        if key != b"statvers" or not sep or not value:
            raise MountStatsError(lineno, "expected 'statvers=VERSION' after the fstype", _shown(line))
        statvers = os.fsdecode(value)
    return _DeviceLine(unescape(fields[1]), unescape(fields[4]), os.fsdecode(fields[7]), statvers)


class _MountBuilder:
    def __init__(self, head: _DeviceLine, cache: OperationCache | None = None) -> None:
        self.head = head
        self.cache = cache
        self.section_start: int | None = None
        self.section_lines: list[bytes] = []
        self.section_clean = True
        self.options: tuple[str, ...] = ()
        self.age_seconds: int | None = None
        self.events: dict[str, int] = {}
        self.bytes: NFSBytes | None = None
        self.transports: list[NFSTransport] = []
        self.operations: list[NFSOperation] = []

    def add(self, line: bytes, lineno: int) -> None:
        stripped = line.strip()
        key, sep, rest = stripped.partition(b":")
        if sep and key == b"opts":
            self.options = tuple(os.fsdecode(o) for o in rest.strip().split(b",") if o)
        elif sep and key == b"age":
            fields = rest.split()
            if len(fields) != 1:
                raise MountStatsError(lineno, f"age: expected 1 number, got {len(fields)}", _shown(line))
            self.age_seconds = _numbers(fields, lineno, line, "age")[0]
        elif sep and key == b"events":
            self.events = parse_events_line(line, lineno)
        elif sep and key == b"bytes":
            self.bytes = parse_bytes_line(line, lineno)
        elif sep and key == b"xprt":
            self.transports.append(parse_transport_line(line, lineno))
        elif (sep and rest.startswith(b"\t")) or key == b"RPC iostats version" or stripped == b"per-op statistics":
            # caps:, nfsv4:, sec:, impl_id:, fsc: and any later "key:<TAB>value" line: nothing we report. Per-op
            # lines print "NAME: " with a space, so they never land here.
            pass
        else:
            op = self.cache.parse(line, lineno) if self.cache is not None else parse_operation_line(line, lineno)
            self.operations.append(op)

    def build(self) -> NFSMount:
        if self.cache is not None and self.section_start is not None and self.section_clean:
            ops = tuple(self.operations[self.section_start :])
            if len(ops) == len(self.section_lines):
                self.cache.remember_section(b"\n".join(self.section_lines), ops)
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


class OperationCache:
    """Parsed per-op lines of the previous read, by their exact bytes.

    Most per-op lines do not change from one second to the next (idle procedures, idle mounts); re-reading
    mountstats every second then costs a dictionary lookup per line instead of a parse. It holds the lines of the
    last read only, so it never grows beyond one mountstats file.
    """

    def __init__(self) -> None:
        self._previous: dict[bytes, NFSOperation] = {}
        self._current: dict[bytes, NFSOperation] = {}
        self._sections: dict[bytes, tuple[NFSOperation, ...]] = {}
        self._sections_now: dict[bytes, tuple[NFSOperation, ...]] = {}

    def known_section(self, section: bytes) -> tuple[NFSOperation, ...] | None:
        ops = self._sections.get(section)
        if ops is not None:
            self._sections_now[section] = ops
        return ops

    def remember_section(self, section: bytes, ops: tuple[NFSOperation, ...]) -> None:
        self._sections_now[section] = ops

    def parse(self, line: bytes, lineno: int) -> NFSOperation:
        op = self._previous.get(line) or self._current.get(line)
        if op is None:
            op = parse_operation_line(line, lineno)
        self._current[line] = op
        return op

    def next_read(self) -> None:
        self._previous, self._current = self._current, {}
        self._sections, self._sections_now = self._sections_now, {}


def parse_mountstats(data: bytes, cache: OperationCache | None = None) -> tuple[list[NFSMount], list[MountStatsError]]:
    """Parse a whole /proc/<pid>/mountstats into its NFS mounts (nfs and nfs4; other mounts are passed over).

    Bad lines are returned as errors and skip only themselves; a bad ``device`` line skips its mount's block. Good
    lines and other mounts are never lost to them. A caller that reads the file repeatedly passes the same
    ``cache`` each time.
    """
    if cache is not None:
        cache.next_read()
    mounts: list[NFSMount] = []
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
        if cache is not None and current is not None and line.endswith(b"per-op statistics"):
            # The per-op table of an idle mount is the same bytes as last time: take it whole from the cache.
            end = i
            while end < last - 1 and lines[end][:1] in (b"\t", b" "):
                end += 1
            section = lines[i:end]
            ops = cache.known_section(b"\n".join(section))
            if ops is not None:
                current.operations.extend(ops)
                i = end
                continue
            current.section_start = len(current.operations)
            current.section_lines = section
            # A busy mount: its op lines, each unchanged one from the cache, the others parsed.
            for k, op_line in enumerate(section, start=i + 1):
                if not op_line.strip():
                    continue
                try:
                    current.operations.append(cache.parse(op_line, k))
                except MountStatsError:
                    try:
                        current.add(op_line, k)  # a "key:<TAB>value" line among the ops, or a bad one
                    except MountStatsError as err:
                        errors.append(err)
                    current.section_clean = False
            i = end
            continue
        if not line.strip():
            continue
        if lineno == len(lines):
            errors.append(MountStatsError(lineno, "truncated: the last line has no newline", _shown(line)))
            continue
        if not line[:1].isspace():
            if line.startswith((b"device ", b"no device ")):
                if current is not None:
                    mounts.append(current.build())
                current, skipping = None, True
                try:
                    head = _parse_device_line(line, lineno)
                except MountStatsError as err:
                    errors.append(err)
                    continue
                if head.fstype in NFS_FSTYPES:
                    current, skipping = _MountBuilder(head, cache), False
                continue
            # Not a device line and not indented: a stray or mangled line; the mount around it carries on.
            errors.append(
                MountStatsError(lineno, "expected a 'device ...' line or an indented statistics line", _shown(line))
            )
            continue
        if skipping:
            continue
        if current is None:
            errors.append(MountStatsError(lineno, "statistics line before any 'device ...' line", _shown(line)))
            continue
        try:
            current.add(line, lineno)
        except MountStatsError as err:
            current.section_clean = False
            errors.append(err)
    if current is not None:
        mounts.append(current.build())
    return mounts, errors
