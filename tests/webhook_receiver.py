"""A local HTTP(S) receiver for the webhook action's tests: records every request (headers and body) and answers
each as the test scripted it (a status, a redirect, or no answer at all until the test ends)."""

from __future__ import annotations

import contextlib
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


class Receiver:
    def __init__(self) -> None:
        self.received: list[Received] = []
        self.script: list[int | str] = []
        """What to answer each next request: a status code, ``"hang"`` (read the request, never answer), or
        ``"redirect:URL"`` (302 to URL). Once used up, 204."""
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None
        self.scheme = "http"

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"{self.scheme}://127.0.0.1:{self.server.server_address[1]}/hook?x=1"

    def next_answer(self, request: Received) -> int | str:
        with self.lock:
            self.received.append(request)
            return self.script.pop(0) if self.script else 204


class _Handler(BaseHTTPRequestHandler):
    receiver: Receiver

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        answer = self.receiver.next_answer(Received(self.path, dict(self.headers.items()), body))
        if answer == "hang":
            self.receiver.release.wait(30)
            return
        if isinstance(answer, str) and answer.startswith("redirect:"):
            self.send_response(302)
            self.send_header("Location", answer.removeprefix("redirect:"))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        code = int(answer)
        text = b"" if code == 204 else f"answer {code}".encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)


@contextlib.contextmanager
def receiver(cert: tuple[Path, Path] | None = None) -> Iterator[Receiver]:
    """A receiver on a loopback port; HTTPS with ``cert`` (certificate, key)."""
    recv = Receiver()
    handler = type("Handler", (_Handler,), {"receiver": recv})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    if cert is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        recv.scheme = "https"
    recv.server = server
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield recv
    finally:
        recv.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
