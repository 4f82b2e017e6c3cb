"""The agent's HTTP server on real sockets, in this process: request parsing, keep-alive and pipelining, gzip, the
bounds that keep it standing under many or slow clients, and answers made once per tick.

The providers are an Agent's own (a fixed mount source, ticked by hand), so /status and /api/status render a real
View; the real agent process under load is in test_agent_http.py.
"""

from __future__ import annotations

import dataclasses
import gzip
import http.client
import re
import socket
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import storwatch.web.server as web
from storwatch.agent import Agent
from storwatch.analysis.view import View
from storwatch.config import Config
from storwatch.paths import OWN_SOMAXCONN
from storwatch.web import NOT_CACHED, ServerLimits, StatusHTTPServer, accepts_gzip, listen_backlog, parse_head
from tests.agentproc import wait_until
from tests.builders import FixedMounts


@pytest.fixture
def agent() -> Iterator[Agent]:
    config = dataclasses.replace(Config(), listen="127.0.0.1:0", platform="generic")
    source = FixedMounts()
    agent = Agent(config, sources=[source], process_metrics=False)
    agent.collect_now()
    agent.advance()
    try:
        yield agent
    finally:
        agent.stop()


def serve(agent: Agent, **limits: Any) -> StatusHTTPServer:
    server = StatusHTTPServer(
        "127.0.0.1:0",
        agent.current_view,
        agent.metrics,
        cached_view=agent.cached_view,
        cached_metrics=agent.cached_metrics,
        limits=ServerLimits(**limits),
    )
    server.start()
    agent.server = server  # agent.stop() stops it
    return server


def connect(server: StatusHTTPServer, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=timeout)


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response from ``sock`` (which must send Content-Length)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed mid-head: {buf!r}"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        rest += chunk
    assert len(rest) == length, f"{len(rest) - length} bytes more than Content-Length"
    return status, headers, rest


CLOSE_WAIT_SECONDS = 30.0
"""How long a test waits for the server to close a connection it must close: a bound against hanging, generous for a
loaded machine (each such test sets the other deadlines far beyond it, so only the one under test can close)."""


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """True when the server closes ``sock`` within ``seconds`` (whatever it sent first is read and dropped)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


# -- parsing


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("gzip", True),
        ("GZip", True),
        ("deflate, gzip;q=0.5", True),
        ("gzip;q=0", False),
        ("gzip; q=0.0", False),
        ("identity", False),
        ("", False),
        ("*", True),
        ("*;q=0", False),
        ("*, gzip;q=0", False),
        ("x-gzip", True),
        ("gzip;q=nonsense", False),
    ],
)
def test_accepts_gzip(value: str, expected: bool) -> None:
    assert accepts_gzip(value) is expected


@pytest.mark.parametrize(
    ("head", "fields"),
    [
        pytest.param(b"GET /metrics HTTP/1.1\r\nHost: x", ("GET", "/metrics", False, True, False), id="plain"),
        pytest.param(b"GET /metrics?x=1 HTTP/1.1", ("GET", "/metrics", False, True, False), id="query"),
        pytest.param(b"\r\nGET / HTTP/1.1", ("GET", "/", False, True, False), id="leading-empty-line"),
        pytest.param(b"HEAD /healthz HTTP/1.0", ("HEAD", "/healthz", True, False, False), id="http10-closes"),
        pytest.param(b"GET / HTTP/1.0\r\nConnection: Keep-Alive", ("GET", "/", True, True, False), id="http10-ka"),
        pytest.param(b"GET / HTTP/1.1\r\nConnection: close", ("GET", "/", False, False, False), id="close"),
        pytest.param(b"GET / HTTP/1.1\r\nContent-Length: 5", ("GET", "/", False, False, False), id="with-body"),
        pytest.param(b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked", ("GET", "/", False, False, False), id="chunked"),
        pytest.param(
            b"GET http://node:9477/metrics HTTP/1.1", ("GET", "/metrics", False, True, False), id="absolute-form"
        ),
        pytest.param(
            b"GET /metrics HTTP/1.1\nAccept-Encoding: gzip\nUser-Agent: Prometheus/2.42.0",
            ("GET", "/metrics", False, True, True),
            id="lf-only-prometheus",
        ),
        pytest.param(
            b"GET / HTTP/1.1\r\nAccept-Encoding: br\r\nAccept-Encoding: gzip",
            ("GET", "/", False, True, True),
            id="header-twice",
        ),
    ],
)
def test_parse_head(head: bytes, fields: tuple[str, str, bool, bool, bool]) -> None:
    req = parse_head(head)
    assert (req.method, req.path, req.http10, req.keep_alive, req.gzip) == fields


@pytest.mark.parametrize(
    ("head", "status", "message"),
    [
        (b"GET /metrics", 400, "not an HTTP/1.x request line"),
        (b"GET  /metrics HTTP/1.1", 400, "not an HTTP/1.x request line"),
        (b"GET /metrics HTTP/2.0", 505, "HTTP/2.0 is not supported"),
        (b"GET / HTTP/1.1\r\n folded", 400, "folded header line"),
        (b"GET / HTTP/1.1\r\nNoColon", 400, "malformed header line"),
        (b"GET / HTTP/1.1\r\nName : value", 400, "malformed header line"),
        (b"GET /\xff HTTP/1.1", 400, "request line is not ASCII"),
        (b"\r\n\r\n", 400, "empty request"),
    ],
)
def test_parse_head_refuses(head: bytes, status: int, message: str) -> None:
    with pytest.raises(web._BadRequest) as info:
        parse_head(head)
    assert (info.value.status, str(info.value)) == (status, message)


# -- the listen queue


def test_listen_backlog_is_the_kernels_somaxconn(agent: Agent) -> None:
    with open(OWN_SOMAXCONN, encoding="ascii") as f:
        somaxconn = int(f.read())
    assert listen_backlog() == min(somaxconn, 65535)
    server = serve(agent)
    # For a listening socket, ss shows the backlog it was given as Send-Q.
    out = subprocess.run(
        ["ss", "-ltnH", f"sport = :{server.port}"], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    fields = out.split()
    assert fields[0] == "LISTEN" and int(fields[2]) == listen_backlog(), out


# -- requests and answers


def test_keep_alive_head_and_pipelined_requests(agent: Agent) -> None:
    server = serve(agent)
    with connect(server) as sock:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nHEAD /metrics HTTP/1.1\r\n\r\nGET /nope HTTP/1.1\r\n\r\n"
        )
        buf = b""
        while not buf.endswith(b"not found\n"):
            chunk = sock.recv(65536)
            assert chunk, buf
            buf += chunk
    # Three responses in order; HEAD's gives the length GET would send and no body.
    responses = re.findall(rb"HTTP/1\.1 (\d+) [^\r]*\r\n(.*?)\r\n\r\n", buf, re.S)
    assert [int(code) for code, _ in responses] == [200, 200, 404]
    heads = [dict(line.split(": ", 1) for line in h.decode().split("\r\n")) for _, h in responses]
    assert heads[0]["Content-Type"] == "text/plain; charset=utf-8" and heads[0]["Content-Length"] == "3"
    assert "Connection" not in heads[0]
    assert re.fullmatch(r"\w{3}, \d\d \w{3} \d{4} [\d:]{8} GMT", heads[0]["Date"])
    assert int(heads[1]["Content-Length"]) == len(agent.metrics())
    assert heads[1]["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    bodies = re.split(rb"HTTP/1\.1 \d+ [^\r]*\r\n.*?\r\n\r\n", buf, flags=re.S)
    assert bodies == [b"", b"ok\n", b"", b"not found\n"]


def test_http10_gets_http10_and_the_connection_closes(agent: Agent) -> None:
    server = serve(agent)
    with connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        status, headers, body = read_response(sock)
        assert (status, headers["connection"], body) == (200, "close", b"ok\n")
        assert closed_within(sock, 2.0)


def test_a_request_line_without_version_is_answered_400_at_once(agent: Agent) -> None:
    """`GET /metrics` and a newline (HTTP/0.9): no headers will follow, so nothing is waited for."""
    server = serve(agent, header_timeout_seconds=3600.0)  # a server that waited for the headers would not answer
    with connect(server) as sock:
        sock.sendall(b"GET /metrics\r\n")
        status, headers, body = read_response(sock)
        assert (status, headers["connection"], body) == (400, "close", b"not an HTTP/1.x request line\n")
        assert closed_within(sock, CLOSE_WAIT_SECONDS)


def test_other_methods_get_405_and_the_connection_closes(agent: Agent) -> None:
    server = serve(agent)
    with connect(server) as sock:
        sock.sendall(b"POST /metrics HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody")
        status, headers, _ = read_response(sock)
        assert (status, headers["allow"], headers["connection"]) == (405, "GET, HEAD", "close")
        assert closed_within(sock, 2.0)


def test_a_head_past_the_size_bound_gets_431(agent: Agent) -> None:
    server = serve(agent, max_head_bytes=1024)
    with connect(server) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nX-Filler: " + b"a" * 2048)
        status, _, _ = read_response(sock)
        assert status == 431
        assert closed_within(sock, 2.0)


def test_gzip_when_the_client_takes_it_made_once_per_exposition(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    server = serve(agent)
    compressed: list[int] = []
    real_compress = gzip.compress

    def counting_compress(data: bytes, *args: Any, **kwargs: Any) -> bytes:
        compressed.append(len(data))
        return real_compress(data, *args, **kwargs)

    monkeypatch.setattr(web.gzip, "compress", counting_compress)
    plain = agent.metrics()
    assert len(plain) > 1024
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        for _ in range(5):
            conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            resp = conn.getresponse()
            body = resp.read()
            assert resp.status == 200
            assert resp.getheader("Content-Encoding") == "gzip"
            assert resp.getheader("Vary") == "Accept-Encoding"
            assert gzip.decompress(body) == plain
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip;q=0, identity"})
        resp = conn.getresponse()
        assert resp.getheader("Content-Encoding") is None and resp.read() == plain
    finally:
        conn.close()
    assert compressed == [len(plain)]


def test_status_and_api_status_are_made_once_per_view(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[View] = []
    real = web.view_to_dict

    def counting_view_to_dict(view: View) -> dict[str, Any]:
        made.append(view)
        return real(view)

    monkeypatch.setattr(web, "view_to_dict", counting_view_to_dict)
    server = serve(agent)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:

        def get(path: str) -> bytes:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            assert resp.status == 200, (path, body)
            return body

        first_json = [get("/api/status") for _ in range(10)]
        first_html = [get("/status") for _ in range(10)]
        assert len(made) == 2 and made[0] is made[1]
        assert all(b is first_json[0] or b == first_json[0] for b in first_json)
        assert b'"mountpoint": "/data"' in first_json[0] and b"/data" in first_html[0]
        agent.advance()  # the next tick: a new View, made again once
        get("/api/status")
        get("/api/status")
        assert len(made) == 3 and made[2] is not made[0]
    finally:
        conn.close()


def test_a_slow_render_holds_a_worker_not_the_server(agent: Agent) -> None:
    """The first scrape after a tick renders on a worker thread; /healthz on another connection is answered
    meanwhile."""
    release = threading.Event()
    entered = threading.Event()

    def slow_metrics() -> bytes:
        entered.set()
        release.wait(10)
        return b"# rendered\n"

    server = serve(agent)
    server.metrics, server.cached_metrics = slow_metrics, lambda: None
    with connect(server) as scrape, connect(server) as probe:
        scrape.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        assert entered.wait(5)
        probe.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        assert read_response(probe)[0] == 200
        assert not release.is_set()
        release.set()
        assert read_response(scrape)[2] == b"# rendered\n"


def test_before_the_first_tick(agent: Agent) -> None:
    fresh = Agent(agent.config, sources=[FixedMounts()], process_metrics=False)
    try:
        assert fresh.cached_view() is None  # nothing to wait for: no View yet
        server = serve(fresh)
        with connect(server) as sock:
            for path, status in (("/readyz", 503), ("/api/status", 503), ("/status", 503), ("/metrics", 200)):
                sock.sendall(f"GET {path} HTTP/1.1\r\n\r\n".encode())
                assert read_response(sock)[0] == status, path
        fresh.collect_now()
        fresh.advance()
        view = fresh.cached_view()  # the tick made its View: a request never waits for one
        assert view is not NOT_CACHED and view is fresh.current_view() is not None
    finally:
        fresh.stop()


# -- bounds


def test_a_head_that_does_not_arrive_in_time_closes_the_connection(agent: Agent) -> None:
    # Only the header deadline can close these: the idle timeout is an hour away.
    server = serve(agent, header_timeout_seconds=0.5, idle_timeout_seconds=3600.0)
    with connect(server) as silent, connect(server) as slow:
        slow.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
        assert closed_within(slow, CLOSE_WAIT_SECONDS)
        assert closed_within(silent, CLOSE_WAIT_SECONDS)


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(agent: Agent) -> None:
    server = serve(agent, header_timeout_seconds=3600.0, idle_timeout_seconds=0.5)  # only the idle timeout can close
    with connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        assert read_response(sock)[0] == 200
        assert closed_within(sock, CLOSE_WAIT_SECONDS)


def open_connections(server: StatusHTTPServer) -> int:
    return len(server._conns)


def test_at_the_cap_the_longest_waiting_connection_makes_room(agent: Agent) -> None:
    server = serve(agent, max_connections=8)
    assert server.connection_cap == 8
    slow = [connect(server) for _ in range(20)]
    try:
        for s in slow:
            s.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
        wait_until(lambda: open_connections(server) == 8, timeout=5.0, what="8 connections open")
        # The 12 first were closed to make room, oldest first; the 8 last are still open.
        closed = [closed_within(s, 0.2) for s in slow]
        assert closed == [True] * 12 + [False] * 8
        with connect(server) as client:
            client.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            status, _, body = read_response(client)
            assert status == 200 and b"storwatch_mount_info" in body
        assert open_connections(server) <= 8
    finally:
        for s in slow:
            s.close()


def test_a_client_that_does_not_read_holds_no_thread(agent: Agent) -> None:
    big = b"# padding\n" * 500_000  # 5 MB: far more than the socket buffers hold
    server = serve(agent, write_timeout_seconds=1.0)
    server.metrics, server.cached_metrics = (lambda: big), (lambda: big)
    with connect(server) as stalled:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        for _ in range(3):
            with connect(server) as other:
                other.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
                assert read_response(other)[0] == 200
        # Past the write deadline the stalled client is dropped.
        wait_until(lambda: open_connections(server) == 0, timeout=5.0, what="the stalled client dropped")


def test_shutdown_closes_every_connection_and_ends_the_threads(agent: Agent) -> None:
    server = serve(agent)
    idle = [connect(server) for _ in range(5)]
    try:
        wait_until(lambda: open_connections(server) == 5, timeout=5.0, what="5 connections open")
        threads = list(server._threads)
        server.shutdown()
        server.server_close()
        assert all(closed_within(s, 2.0) for s in idle)
        assert not any(t.is_alive() for t in threads)
        with pytest.raises(OSError):
            connect(server, timeout=1.0)
    finally:
        for s in idle:
            s.close()


def test_renders_one_at_a_time_all_happen_on_one_worker(agent: Agent) -> None:
    """The worker that went idle last takes the next job: renders that come one at a time share one thread (and so
    one malloc arena) rather than going round all of them."""
    names: list[str] = []

    def metrics() -> bytes:
        names.append(threading.current_thread().name)
        return b"# rendered\n"

    server = serve(agent, workers=4)
    server.metrics, server.cached_metrics = metrics, lambda: None
    with connect(server) as sock:
        for _ in range(8):
            sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            assert read_response(sock)[2] == b"# rendered\n"
    assert names == ["http-worker-0"] * 8


def test_a_past_ticks_pages_are_let_go(agent: Agent) -> None:
    server = serve(agent)
    with connect(server) as sock:
        for path in ("/api/status", "/status"):
            sock.sendall(f"GET {path} HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n".encode())
            assert read_response(sock)[0] == 200
    old = agent.current_view()
    assert all(made.source is old for made in server._pages.values()) and len(server._pages) == 2
    agent.advance()  # a new tick: nobody has asked for its View yet
    wait_until(lambda: not server._pages, timeout=5.0, what="the past tick's pages dropped")


def _wakeups(thread: threading.Thread) -> int:
    """The thread's voluntary context switches so far: each one a return from sleeping (the kernel's count)."""
    with open(f"/proc/self/task/{thread.native_id}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))


def test_an_idle_server_sleeps_until_a_client_needs_it(agent: Agent) -> None:
    """Without clients, and with a keep-alive connection waiting for its next request, the loop does not wake on a
    timer (it did four times a second: most of an idle agent's CPU); a client is still answered at once."""
    server = serve(agent, header_timeout_seconds=3600.0, idle_timeout_seconds=3600.0)
    loop = server._threads[0]
    wait_until(lambda: (loop.native_id is not None and _wakeups(loop) > 0) or None, 10, what="the loop running")
    threading.Event().wait(0.5)  # let start-up settle
    before = _wakeups(loop)
    threading.Event().wait(2.0)
    assert _wakeups(loop) - before <= 1, "the loop woke with no client"
    with connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        assert read_response(sock)[0] == 200
        wait_until(lambda: open_connections(server) == 1 or None, 10, what="the connection kept")
        threading.Event().wait(0.5)
        before = _wakeups(loop)
        threading.Event().wait(2.0)
        assert _wakeups(loop) - before <= 1, "the loop woke while its one connection waited for a request"
        sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        assert read_response(sock)[0] == 200
