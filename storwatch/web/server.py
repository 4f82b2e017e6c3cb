"""The HTTP server: /metrics (cached bytes), /healthz, /readyz, /status (HTML, from web/page.py), /api/status
(JSON), and the paths that take a request body (POST) from their handlers (the Alertmanager receiver, in
web/alertmanager.py), on one event-loop thread and a few workers.

This module stays whole because it is one state machine: a connection moves through handshake,
head, busy and write states on the loop thread, and splitting those states across modules would spread one
invariant (only the loop thread touches a connection's socket) over several files."""

from __future__ import annotations

import contextlib
import email.utils
import errno
import functools
import gzip
import logging
import queue
import resource
import selectors
import socket
import ssl
import threading
import time
import urllib.parse
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from typing import Protocol

from storwatch.analysis.view import View
from storwatch.config import ConfigError, TLSConfig, parse_listen
from storwatch.paths import OWN_SOMAXCONN
from storwatch.report import strict_json, view_to_dict
from storwatch.threadname import name_this_thread
from storwatch.web.page import render_status_page

log = logging.getLogger(__name__)

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


ViewProvider = Callable[[], "View | None"]
"""The current View (None while the agent is starting)."""
MetricsProvider = Callable[[], bytes]
"""The current exposition text; rendered only when /metrics asks for it."""
StatusExtras = Callable[[], Mapping[str, object]]
"""Keys added to /api/status beside the View's (the alerts Alertmanager posted), read when the JSON is rendered."""
Liveness = Callable[[], "str | None"]
"""Why the agent is not alive (/healthz answers 503 with it), or None; called on the loop thread, so it never waits."""


@dataclass(frozen=True)
class Reply:
    """What a handler of a request with a body answers."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    """Extra header lines (WWW-Authenticate on a 401)."""


class PostHandler(Protocol):
    """A path that takes a request body (POST only), its body read whole, with a Content-Length, before it is
    handled."""

    def admit(self, headers: Mapping[str, str], length: int) -> Reply | None:
        """On the loop thread, once the head is in and before a byte of the body is read: a refusal (404 while
        off, 401, 413 past the handler's bound...), or None to read the body. Must not block: no I/O. ``headers``
        by lower-case name; ``length``: the Content-Length."""
        ...

    def handle(self, headers: Mapping[str, str], body: bytes) -> Reply:
        """On a worker thread, with the whole body."""
        ...


# -- the server
#
# One thread runs an event loop over every connection: it accepts, completes TLS handshakes and reads request heads
# without a thread per connection, so a thousand clients that connect and send nothing (or a byte a second) cost a
# file descriptor each, within a cap, and no thread. A complete request is answered on that thread when its answer
# is ready-made (the exposition, page or JSON of the current tick, /healthz); one that needs work (the first request
# after a tick renders it) goes to one of a few worker threads. Answers are written by the loop as the client takes
# them, so a client that reads slowly holds no thread either.

_HANDSHAKE, _HEAD, _BODY, _BUSY, _WRITE, _CLOSED = range(6)
_READ, _WRITABLE = selectors.EVENT_READ, selectors.EVENT_WRITE
_TLS_CHUNK = 64 * 1024
_GZIP_MIN_BYTES = 1024
_GZIP_LEVEL = 1  # about 3x the speed of level 6 for a fifth more bytes; made once per tick
_TEXT = "text/plain; charset=utf-8"
_METRICS, _JSON, _HTML = "metrics", "json", "html"
_CONTENT_TYPES = {_METRICS: METRICS_CONTENT_TYPE, _JSON: "application/json", _HTML: "text/html; charset=utf-8"}
_SWEEP_SECONDS = 0.25
_ACCEPTS_PER_ROUND = 8
"""At most this many new connections a round of the loop; the cap is at least 16, so a new one lives two rounds."""
_CAP_LOG_SECONDS = 60.0


class NotCached:
    """What a ``cached_*`` provider returns when the answer is not made yet (a worker thread makes it)."""


NOT_CACHED = NotCached()
CachedView = Callable[[], "View | NotCached | None"]
"""The current View if it is already made (None while the agent is starting), else NOT_CACHED; never makes it."""
CachedMetrics = Callable[[], "bytes | None"]
"""The current exposition text if it is already rendered, else None; never renders it."""


@dataclass(frozen=True)
class ServerLimits:
    """The bounds that keep the server's file descriptors, threads and memory fixed whatever its clients do."""

    max_connections: int = 0
    """Connections open at once; 0: a quarter of the process's file descriptor limit, 16 to 1024. At the cap a new
    connection closes the one that has waited longest for a request (idle keep-alive or a slow head)."""
    header_timeout_seconds: float = 10.0
    """A request's head must arrive whole within this of its first byte (of connecting, for a new connection)."""
    idle_timeout_seconds: float = 120.0
    """A keep-alive connection with no request for this long is closed (Prometheus scrapes every 15-60 s)."""
    write_timeout_seconds: float = 30.0
    """A client that has not taken its whole answer within this is dropped."""
    max_head_bytes: int = 16 * 1024
    workers: int = 4
    max_bodies: int = 4
    """Requests whose body is being read or handled at once (each holds up to its handler's bound in memory); one
    more is answered 503, which a client such as Alertmanager retries. A body must arrive whole within
    header_timeout_seconds of its head."""


def connection_cap(limits: ServerLimits) -> int:
    if limits.max_connections > 0:
        return limits.max_connections
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    # The rest of the file descriptors are the sources' (files, the helper's pipes, NVML, Kubernetes watches).
    return max(16, min(1024, soft // 4))


@functools.cache
def listen_backlog() -> int:
    """The kernel's somaxconn (the longest accept queue it allows), read once, as Go's net package does: Python's
    default of 5 overflows as soon as a few dozen scrapers connect at once."""
    try:
        with open(OWN_SOMAXCONN, "rb") as f:
            value = int(f.read().strip() or b"0")
    except (OSError, ValueError):
        value = socket.SOMAXCONN
    return max(1, min(value, 65535))


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header value admits gzip (RFC 9110 12.5.3: "gzip;q=0" refuses it, "*" admits it)."""
    star = False
    for item in accept_encoding.split(","):
        coding, _, params = item.partition(";")
        coding = coding.strip().lower()
        q = 1.0
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if coding in ("gzip", "x-gzip"):
            return q > 0
        if coding == "*":
            star = q > 0
    return star


@dataclass(frozen=True)
class _Request:
    method: str
    path: str
    http10: bool
    keep_alive: bool
    gzip: bool
    headers: Mapping[str, str] = field(default_factory=dict)
    """By lower-case name; a name given twice has its values joined with ", "."""
    body: bytes = b""


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    content_type: str = _TEXT
    gzipped: bool = False
    vary: bool = False
    """The body depends on Accept-Encoding."""
    close: bool = False
    allow: bool = False
    headers: tuple[tuple[str, str], ...] = ()


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_head(head: bytes) -> _Request:
    """A request head (request line and header lines, without the blank line) -> _Request; _BadRequest if it is not
    HTTP/1.x we can answer."""
    lines = head.split(b"\n")
    while lines and not lines[0].strip():
        lines.pop(0)  # RFC 9112 2.2: empty lines before the request line are ignored
    if not lines:
        raise _BadRequest(400, "empty request")
    try:
        request_line = lines[0].rstrip(b"\r").decode("ascii")
    except UnicodeDecodeError:
        raise _BadRequest(400, "request line is not ASCII") from None
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise _BadRequest(400, "not an HTTP/1.x request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise _BadRequest(505, f"{version} is not supported")
    headers: dict[str, str] = {}
    for raw in lines[1:]:
        line = raw.rstrip(b"\r")
        if not line:
            continue
        if line[:1] in (b" ", b"\t"):
            raise _BadRequest(400, "folded header line")
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise _BadRequest(400, "malformed header line")
        key = name.decode("latin-1").lower()
        text = value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    if not target.startswith("/"):
        target = urllib.parse.urlsplit(target).path or "/"
    http10 = version == "HTTP/1.0"
    keep_alive = _wants_keep_alive(http10, headers)
    # Only a PostHandler's path reads a request body: any other request that has one ends its connection, or the
    # body would be read as the next request.
    if "transfer-encoding" in headers or headers.get("content-length", "0").strip() not in ("", "0"):
        keep_alive = False
    return _Request(
        method,
        target.split("?", 1)[0],
        http10,
        keep_alive,
        accepts_gzip(headers.get("accept-encoding", "")),
        headers,
    )


def _wants_keep_alive(http10: bool, headers: Mapping[str, str]) -> bool:
    connection = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    return "keep-alive" in connection if http10 else "close" not in connection


def _content_length(headers: Mapping[str, str]) -> int | None:
    """The request's Content-Length, or None where there is none we take (absent, chunked, not one decimal number:
    RFC 9112 6.3 makes a bad one an error, and two of them a smuggling attempt)."""
    if "transfer-encoding" in headers:
        return None
    value = headers.get("content-length", "").strip()
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        return None
    return int(value)


class _Conn:
    __slots__ = (
        *("body_need", "close_after", "deadline", "events", "head", "head_started", "holds_body", "inbuf", "out"),
        *("pending", "sock", "state", "tls"),
    )

    def __init__(self, sock: socket.socket, tls: bool, deadline: float) -> None:
        self.sock = sock
        self.tls = tls
        self.state = _HANDSHAKE if tls else _HEAD
        self.inbuf = bytearray()
        self.out: list[memoryview] = []
        self.deadline = deadline
        self.head_started = True
        """A request's first byte has come (or the connection is new): the head deadline runs, not the idle one."""
        self.close_after = False
        self.events = 0
        self.head = False
        """The answer goes out without its body (HEAD)."""
        self.body_need = 0
        """The Content-Length of the request whose body is being read (state _BODY)."""
        self.pending: _Request | None = None
        """That request, its head parsed."""
        self.holds_body = False
        """It holds one of the server's body slots (ServerLimits.max_bodies) until it is answered or closed."""


@dataclass(frozen=True)
class _Rendered:
    """An answer made from one View or exposition, kept (and swapped whole) until the next one: each is made once per
    tick, however many clients ask for it."""

    source: object = None
    """The View or exposition it was made from."""
    plain: bytes = b""
    gzipped: bytes | None = None


class StatusHTTPServer:
    """The agent's HTTP server. Binds and listens when made (so a busy port fails before anything else starts);
    ``start`` runs it on its own threads; ``shutdown`` then ``server_close`` stop it."""

    def __init__(
        self,
        listen: str,
        view: ViewProvider | None = None,
        metrics: MetricsProvider | None = None,
        tls: TLSConfig | None = None,
        *,
        cached_view: CachedView | None = None,
        cached_metrics: CachedMetrics | None = None,
        limits: ServerLimits | None = None,
    ) -> None:
        host, port = parse_listen(listen)
        self.view: ViewProvider = view or (lambda: None)
        self.metrics: MetricsProvider = metrics or (lambda: b"")
        self.cached_view: CachedView = cached_view or (lambda: NOT_CACHED)
        self.cached_metrics: CachedMetrics = cached_metrics or (lambda: None)
        self.post_handlers: dict[str, PostHandler] = {}
        """The paths that take a request body, by path (set before ``start``)."""
        self.status_extras: StatusExtras = lambda: {}
        self.liveness: Liveness = lambda: None
        self.limits = limits or ServerLimits()
        self._tls = _tls_context(tls) if tls is not None and tls.cert_file else None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(listen_backlog())
            self._listener.setblocking(False)
        except OSError:
            self._listener.close()
            raise
        self.server_address = self._listener.getsockname()
        self._cap = connection_cap(self.limits)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._listener, _READ, None)
        self._sel.register(self._wake_r, _READ, self._wake_r)
        self._conns: dict[int, _Conn] = {}
        self._waiting: OrderedDict[_Conn, None] = OrderedDict()
        """Connections waiting for a request (TLS handshake, idle keep-alive, a head coming in), longest first."""
        self._inboxes: list[queue.SimpleQueue[tuple[_Conn, _Request] | None]] = [
            queue.SimpleQueue() for _ in range(self.limits.workers)
        ]
        self._idle_lock = threading.Lock()
        self._idle = list(range(self.limits.workers - 1, -1, -1))
        """Workers waiting for a job, the last to go idle on top (worker 0 first of all)."""
        self._backlog: deque[tuple[_Conn, _Request]] = deque()
        self._done: queue.SimpleQueue[tuple[_Conn, _Request, _Answer]] = queue.SimpleQueue()
        self._render_lock = threading.Lock()
        self._pages: dict[str, _Rendered] = {}
        """The last answer of each kind (_METRICS, _JSON, _HTML); the loop reads it without the lock."""
        self._threads: list[threading.Thread] = []
        self._bodies = 0
        """Connections holding a body slot (the loop thread's count)."""
        self._stopping = False
        self._accept_paused_until = 0.0
        self._cap_logged = -_CAP_LOG_SECONDS
        self._next_sweep = 0.0
        self._closed = False

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def connection_cap(self) -> int:
        return self._cap

    def start(self) -> threading.Thread:
        loop = threading.Thread(target=self._serve, name="http", daemon=True)
        self._threads = [loop] + [
            threading.Thread(target=self._work, args=(i,), name=f"http-worker-{i}", daemon=True)
            for i in range(self.limits.workers)
        ]
        for t in self._threads:
            t.start()
        return loop

    def shutdown(self, timeout: float = 2.0) -> None:
        """Stop serving: every connection is closed and the threads end (a worker busy rendering finishes first)."""
        self._stopping = True
        self._wake()
        for inbox in self._inboxes:
            inbox.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def server_close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stopping = True
        self._wake()
        if any(t.is_alive() for t in self._threads[:1]):
            return  # the loop still owns the sockets; it closes them as it ends
        self._close_all()

    # -- answers (a worker thread, or the loop when ``inline`` and the answer is ready-made)

    def _answer(self, req: _Request, inline: bool) -> _Answer | None:
        path = req.path
        if req.method == "POST":  # its body read: only a PostHandler's path gets here
            reply = self.post_handlers[path].handle(req.headers, req.body)
            return _reply_answer(reply, close=False)
        if path == "/healthz":
            problem = self.liveness()
            if problem is None:
                return _Answer(200, b"ok\n")
            return _Answer(503, f"not alive: {problem}\n".encode())
        if path == "/metrics":
            body = self.cached_metrics() if inline else self.metrics()
            if body is None:
                return None
            made = self._pages.get(_METRICS)
            if made is None or made.source is not body:
                made = _Rendered(body, body)
            return self._compressible(req, made, _METRICS, inline)
        if path in ("/readyz", "/status", "/", "/api/status"):
            view = self.cached_view() if inline else self.view()
            if isinstance(view, NotCached):
                return None
            if path == "/readyz":
                ready = view is not None and view.ready
                return _Answer(200 if ready else 503, b"ready\n" if ready else b"not ready\n")
            if view is None:
                if path == "/api/status":
                    return _Answer(503, b'{"error": "starting"}\n', "application/json")
                return _Answer(503, b"storwatch is starting; no data yet\n")
            return self._page(req, view, _JSON if path == "/api/status" else _HTML, inline)
        return _Answer(404, b"not found\n")

    def _page(self, req: _Request, view: View, kind: str, inline: bool) -> _Answer | None:
        made = self._pages.get(kind)
        if made is None or made.source is not view:
            if inline:
                return None
            with self._render_lock:
                made = self._pages.get(kind)
                if made is None or made.source is not view:
                    data = view_to_dict(view)
                    data.update(self.status_extras())  # the page shows the policy's part of them
                    body = strict_json(data).encode() if kind == _JSON else render_status_page(data).encode("utf-8")
                    made = self._pages[kind] = _Rendered(view, body)
        return self._compressible(req, made, kind, inline)

    def _compressible(self, req: _Request, made: _Rendered, kind: str, inline: bool) -> _Answer | None:
        """``made``'s answer, gzipped (once per tick) when the client takes gzip."""
        content_type = _CONTENT_TYPES[kind]
        if not req.gzip or len(made.plain) < _GZIP_MIN_BYTES:
            return _Answer(200, made.plain, content_type, vary=True)
        if made.gzipped is None:
            if inline:
                return None
            with self._render_lock:
                latest = self._pages.get(kind)
                if latest is not None and latest.source is made.source and latest.gzipped is not None:
                    made = latest
                else:
                    # Kept even if a newer tick's answer was stored meanwhile: that one is then made again, once.
                    made = _Rendered(made.source, made.plain, gzip.compress(made.plain, _GZIP_LEVEL, mtime=0))
                    self._pages[kind] = made
        assert made.gzipped is not None
        return _Answer(200, made.gzipped, content_type, gzipped=True, vary=True)

    def _dispatch(self, job: tuple[_Conn, _Request]) -> None:
        """Hand a request to the worker that went idle last. Most ticks need one render, so one thread does them all
        and only its malloc arena holds their memory: with the longest-idle worker taking each job, every worker's
        arena grew to a render's peak (a 2,000-mount node's agent went from 42 to 109 MiB in ten seconds)."""
        with self._idle_lock:
            if self._idle:
                self._inboxes[self._idle.pop()].put(job)
            else:
                self._backlog.append(job)

    def _work(self, index: int) -> None:
        name_this_thread()
        inbox = self._inboxes[index]
        job = inbox.get()
        while job is not None:
            conn, req = job
            try:
                answer = self._answer(req, inline=False)
            except Exception:
                log.exception("http: answering %s %s", req.method, req.path)
                answer = None
            if answer is None:
                answer = _Answer(500, b"internal error\n", close=True)
            # Idle again before the answer can reach the client: its next request, sent as soon as the answer
            # arrives, finds this worker at the top of the idle stack (a busy machine could otherwise run the loop
            # and the client before this thread, and hand the request to another worker and its arena).
            with self._idle_lock:
                next_job = self._backlog.popleft() if self._backlog else None
                if next_job is None:
                    self._idle.append(index)
            self._done.put((conn, req, answer))
            self._wake()
            job = next_job if next_job is not None else inbox.get()

    # -- the loop (one thread owns every connection)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake-up is already pending) or closed
            self._wake_w.send(b"\0")

    def _serve(self) -> None:
        name_this_thread()
        try:
            while not self._stopping:
                now = time.monotonic()
                if self._accept_paused_until and now >= self._accept_paused_until:
                    self._accept_paused_until = 0.0
                    self._sel.register(self._listener, _READ, None)
                accept = False
                for key, _mask in self._sel.select(self._select_timeout(now)):
                    data = key.data
                    if data is None:
                        accept = True
                    elif data is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    else:
                        self._ready(data)
                self._take_done()
                # New connections last, a few at a time: a client accepted in the last round has its request read
                # in this one before newer connections can push it out at the cap (under a flood of slow clients
                # that reconnect as fast as they are dropped, the whole cap turns over in milliseconds).
                if accept:
                    self._accept()
                now = time.monotonic()
                if now >= self._next_sweep:
                    self._next_sweep = now + _SWEEP_SECONDS
                    self._sweep(now)
        except Exception:
            log.exception("http: the server loop failed")
        finally:
            self._close_all()

    def _select_timeout(self, now: float) -> float | None:
        """How long the loop may sleep: a sweep's interval while pages of a past tick may wait to be dropped or
        accepting is paused, else until the nearest connection deadline (a keep-alive connection between two scrapes
        waits out its idle timeout), or until woken when there is no connection. An idle agent's server then wakes
        for its clients only, not four times a second (BENCHMARKS.md, idle CPU). Workers wake it with their answers,
        and shutdown with ``_wake``."""
        if self._pages or self._accept_paused_until:
            return _SWEEP_SECONDS
        waiting = [c.deadline for c in self._conns.values() if c.state != _BUSY]
        if waiting:  # no earlier than the next sweep, which is what closes a connection past its deadline
            return max(0.0, max(min(waiting), self._next_sweep) - now)
        return None if not self._conns else _SWEEP_SECONDS

    def _close_all(self) -> None:
        for conn in list(self._conns.values()):
            self._close(conn)
        with contextlib.suppress(Exception):
            self._sel.close()
        for s in (self._listener, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                s.close()

    def _want(self, conn: _Conn, events: int) -> None:
        if events == conn.events:
            return
        if conn.events == 0:
            self._sel.register(conn.sock, events, conn)
        elif events == 0:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def _close(self, conn: _Conn) -> None:
        if conn.state == _CLOSED:
            return
        self._release_body(conn)
        with contextlib.suppress(Exception):
            self._want(conn, 0)
        conn.state = _CLOSED
        self._conns.pop(id(conn), None)
        self._waiting.pop(conn, None)
        with contextlib.suppress(OSError):
            conn.sock.close()
        conn.inbuf = bytearray()
        conn.out = []

    def _accept(self) -> None:
        now = time.monotonic()
        for _ in range(_ACCEPTS_PER_ROUND):
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of file descriptors: leave the queue to the kernel for a moment rather than spin on it.
                    log.warning("http: cannot accept a connection: %s; pausing accepts for 0.1 s", err.strerror)
                    self._sel.unregister(self._listener)
                    self._accept_paused_until = now + 0.1
                    return
                continue  # the client went away before we took it (ECONNABORTED and the like)
            if len(self._conns) >= self._cap and not self._evict(now):
                sock.close()
                continue
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self._tls is not None:
                    sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (OSError, ValueError):
                sock.close()
                continue
            conn = _Conn(sock, self._tls is not None, now + self.limits.header_timeout_seconds)
            self._conns[id(conn)] = conn
            self._waiting[conn] = None
            if conn.tls:
                self._handshake(conn)
            else:
                self._want(conn, _READ)

    def _evict(self, now: float) -> bool:
        """Make room at the cap: close the connection that has waited longest for a request."""
        if not self._waiting:
            return False
        oldest = next(iter(self._waiting))
        if now - self._cap_logged >= _CAP_LOG_SECONDS:
            self._cap_logged = now
            log.warning(
                "http: %d connections open (the cap); closing the ones waiting longest for a request to make room",
                len(self._conns),
            )
        self._close(oldest)
        return True

    def _ready(self, conn: _Conn) -> None:
        if conn.state == _HANDSHAKE:
            self._handshake(conn)
        elif conn.state in (_HEAD, _BODY):
            self._read(conn)
        elif conn.state == _WRITE:
            self._write(conn)

    def _handshake(self, conn: _Conn) -> None:
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._want(conn, _READ)
            return
        except ssl.SSLWantWriteError:
            self._want(conn, _WRITABLE)
            return
        except (OSError, ValueError) as err:  # ssl.SSLError is an OSError: a refused certificate, plain HTTP, ...
            log.debug("http: TLS handshake failed: %s", err)
            self._close(conn)
            return
        conn.state = _HEAD
        self._want(conn, _READ)
        self._read(conn)

    def _read(self, conn: _Conn) -> None:
        sock = conn.sock
        while True:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except OSError:
                self._close(conn)
                return
            if not data:
                self._close(conn)
                return
            if not conn.head_started:
                conn.head_started = True
                conn.deadline = time.monotonic() + self.limits.header_timeout_seconds
            conn.inbuf += data
            # TLS may hold decrypted bytes the socket no longer shows as readable.
            enough = self.limits.max_head_bytes + (conn.body_need if conn.state == _BODY else 0)
            if not isinstance(sock, ssl.SSLSocket) or len(conn.inbuf) > enough:
                break
            if not sock.pending():
                break
        self._parse(conn)

    def _parse(self, conn: _Conn) -> None:
        if conn.state == _BODY:
            self._body(conn)
            return
        buf = conn.inbuf
        ends = [i for i in (buf.find(b"\r\n\r\n"), buf.find(b"\n\n")) if i >= 0]
        if not ends:
            first = buf[: buf.find(b"\n")].strip() if b"\n" in buf else b""
            if first and not first.rsplit(b" ", 1)[-1].startswith(b"HTTP/"):
                # "GET /metrics" and a newline: no version, so no headers to wait for (HTTP/0.9). Answered now.
                self._error(conn, 400, "not an HTTP/1.x request line")
            elif len(buf) > self.limits.max_head_bytes:
                self._error(conn, 431, "request head too large")
            return
        end = min(ends)
        sep = 4 if buf[end : end + 4] == b"\r\n\r\n" else 2
        if end > self.limits.max_head_bytes:
            self._error(conn, 431, "request head too large")
            return
        head = bytes(buf[:end])
        del buf[: end + sep]
        try:
            req = parse_head(head)
        except _BadRequest as err:
            self._error(conn, err.status, str(err))
            return
        self._waiting.pop(conn, None)
        conn.head = req.method == "HEAD"
        handler = self.post_handlers.get(req.path)
        if handler is not None:
            self._post(conn, req, handler)
            return
        if req.method not in ("GET", "HEAD"):
            self._respond(conn, req, _Answer(405, b"only GET and HEAD\n", close=True, allow=True))
            return
        answer = self._answer(req, inline=True)
        if answer is not None:
            self._respond(conn, req, answer)
            return
        conn.state = _BUSY
        self._want(conn, 0)
        self._dispatch((conn, req))

    def _post(self, conn: _Conn, req: _Request, handler: PostHandler) -> None:
        """A request to a path that takes a body: refused from its head, or its body read (state _BODY)."""
        refusal: _Answer | None = None
        length = _content_length(req.headers)
        if req.method != "POST":
            refusal = _Answer(405, b"only POST\n", close=True, headers=(("Allow", "POST"),))
        elif length is None:
            refusal = _Answer(411, b"a request body with a Content-Length (not chunked) is required\n", close=True)
        else:
            try:
                reply = handler.admit(req.headers, length)
            except Exception:  # a bug in a handler must not end the loop that serves every connection
                log.exception("http: admitting %s %s", req.method, req.path)
                reply = Reply(500, b"internal error\n", _TEXT)
            if reply is not None:
                refusal = _reply_answer(reply, close=True)  # its body unread: the connection cannot go on
            elif self._bodies >= self.limits.max_bodies:
                refusal = _Answer(503, b"busy: too many requests with a body at once\n", close=True)
                refusal = replace(refusal, headers=(("Retry-After", "1"),))
        if refusal is not None:
            self._respond(conn, req, refusal)
            return
        assert length is not None
        self._bodies += 1
        conn.holds_body = True
        conn.state = _BODY
        conn.body_need = length
        conn.pending = replace(req, keep_alive=_wants_keep_alive(req.http10, req.headers))
        conn.deadline = time.monotonic() + self.limits.header_timeout_seconds
        if "100-continue" in req.headers.get("expect", "").lower() and len(conn.inbuf) < length:
            # The client waits for this before it sends the body (curl does, a second at most). Sent when the socket
            # takes it whole now; else the client's own wait covers it.
            with contextlib.suppress(OSError):
                conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._want(conn, _READ)
        self._body(conn)

    def _body(self, conn: _Conn) -> None:
        if len(conn.inbuf) < conn.body_need:
            return
        assert conn.pending is not None
        req = replace(conn.pending, body=bytes(conn.inbuf[: conn.body_need]))
        del conn.inbuf[: conn.body_need]
        conn.pending = None
        conn.body_need = 0
        conn.state = _BUSY
        self._want(conn, 0)
        self._dispatch((conn, req))

    def _release_body(self, conn: _Conn) -> None:
        if conn.holds_body:
            conn.holds_body = False
            self._bodies -= 1

    def _error(self, conn: _Conn, status: int, message: str) -> None:
        self._waiting.pop(conn, None)
        conn.head = False
        conn.inbuf = bytearray()
        req = _Request("GET", "", False, False, False)
        self._respond(conn, req, _Answer(status, f"{message}\n".encode(), close=True))

    def _take_done(self) -> None:
        while True:
            try:
                conn, req, answer = self._done.get_nowait()
            except queue.Empty:
                return
            if conn.state == _BUSY:
                self._respond(conn, req, answer)

    def _respond(self, conn: _Conn, req: _Request, answer: _Answer) -> None:
        self._release_body(conn)
        close = answer.close or not req.keep_alive or self._stopping
        lines = [
            f"{'HTTP/1.0' if req.http10 else 'HTTP/1.1'} {answer.status} {_REASONS.get(answer.status, 'Error')}",
            f"Date: {_http_date()}",
            f"Content-Type: {answer.content_type}",
            f"Content-Length: {len(answer.body)}",
        ]
        if answer.gzipped:
            lines.append("Content-Encoding: gzip")
        if answer.vary:
            lines.append("Vary: Accept-Encoding")
        if answer.allow:
            lines.append("Allow: GET, HEAD")
        lines.extend(f"{name}: {value}" for name, value in answer.headers)
        if close:
            lines.append("Connection: close")
        elif req.http10:
            lines.append("Connection: keep-alive")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        conn.out = [memoryview(head)] if conn.head or not answer.body else [memoryview(head), memoryview(answer.body)]
        conn.close_after = close
        conn.state = _WRITE
        conn.deadline = time.monotonic() + self.limits.write_timeout_seconds
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        sock, out = conn.sock, conn.out
        try:
            while out:
                # Head and body in one send: in two, Nagle's algorithm would hold the body back until the client
                # acknowledged the head (TCP_NODELAY is set too).
                n = sock.send(out[0][:_TLS_CHUNK]) if conn.tls else sock.sendmsg(out)
                while n and out:
                    first = out[0]
                    if n >= len(first):
                        n -= len(first)
                        out.pop(0)
                    else:
                        out[0] = first[n:]
                        n = 0
        except (BlockingIOError, ssl.SSLWantWriteError):
            self._want(conn, _WRITABLE)
            return
        except ssl.SSLWantReadError:
            self._want(conn, _READ)
            return
        except OSError:
            self._close(conn)
            return
        if conn.close_after:
            self._close(conn)
            return
        conn.state = _HEAD
        conn.head_started = bool(conn.inbuf)
        timeout = self.limits.header_timeout_seconds if conn.inbuf else self.limits.idle_timeout_seconds
        conn.deadline = time.monotonic() + timeout
        self._waiting[conn] = None
        self._want(conn, _READ)
        if conn.inbuf:  # the next request came with this one (pipelining)
            self._parse(conn)

    def _sweep(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if c.state != _BUSY and c.deadline <= now]:
            self._close(conn)
        # Answers of a past tick go once the tick is over, and with them the View they hold (a 2,000-mount View and
        # its pages are megabytes): nothing would ask for them again.
        current: dict[str, object] = {_METRICS: self.cached_metrics(), _JSON: self.cached_view()}
        current[_HTML] = current[_JSON]
        for kind, made in list(self._pages.items()):
            if made.source is not current[kind] and self._pages.get(kind) is made:
                self._pages.pop(kind, None)


def _reply_answer(reply: Reply, close: bool) -> _Answer:
    return _Answer(reply.status, reply.body, reply.content_type, close=close, headers=reply.headers)


_REASONS = {s.value: s.phrase for s in HTTPStatus}
_date_cache: tuple[int, str] = (0, "")


def _http_date() -> str:
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, email.utils.formatdate(now, usegmt=True))
    return _date_cache[1]


def _tls_context(tls: TLSConfig) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as err:
        why = _why(err)
        raise ConfigError(f"tls: cannot load cert_file {tls.cert_file} / key_file {tls.key_file}: {why}") from None
    if tls.client_ca_file:
        try:
            ctx.load_verify_locations(tls.client_ca_file)
        except (OSError, ssl.SSLError) as err:
            raise ConfigError(f"tls: cannot load client_ca_file {tls.client_ca_file}: {_why(err)}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _why(err: Exception) -> str:
    return getattr(err, "strerror", None) or getattr(err, "reason", None) or str(err)
