"""The ``webhook`` action: POSTs a rule's transition as JSON to a URL, over HTTPS with a CA file where asked,
authenticated by a bearer token or an HMAC-SHA256 signature of the body (each secret read from a file at every post,
so a rotated secret is used at once), retried with exponential backoff within the run's time.

The body (``Content-Type: application/json``), the same bytes on every attempt::

    {"version": 1, "id": "<32 hex: the same for every attempt of this request>",
     "rule": "...", "severity": "info|warning|critical", "transition": "firing|repeat|resolved",
     "message": "...", "labels": {"k": "v"},
     "entity": {"kind": "mount|run|gpu|workload|finding|node|alert", "key": "...", "fields": {...}},
     "time": "2026-11-22T10:00:00Z", "timestamp": 1800000000.0, "node": "<this node's name>"}

``time``/``timestamp`` are when the rule's engine decided (its View's time); a field that is not a finite number is
null. Headers: ``Authorization: Bearer <token>`` with ``bearer_token_file``; ``X-Storwatch-Signature:
sha256=<hex HMAC-SHA256 of the body>`` with ``hmac_key_file`` (the key is the file's bytes, one trailing newline
dropped); the body carries its own time and id, so a receiver can refuse a replay. The secret files and the CA file
are read at every post through ``secret_file.py``: a regular file only (a FIFO, a directory or a symbolic link is
refused, the action failing with a message naming the file), bounded in size, never waited on.

Params: ``url`` (required; http or https; no user or password in it), ``timeout`` (seconds per attempt, default 5),
``retries`` (after the first attempt, default 3), ``backoff`` (seconds before the first retry, doubled for each
next, default 0.5), ``bearer_token_file`` (https only: a token never travels in clear), ``hmac_key_file``, ``ca_file``
(https only: the CAs that sign the receiver's certificate, instead of the system's). A 2xx answer is success; 429,
5xx, a refused or broken connection and a timeout are retried while the run's time allows; any other answer fails
at once. Each attempt is cut off at its deadline (its ``timeout``, or what is left of the run's time), the whole of
it: connecting, sending, and the answer's head and body however slowly the receiver trickles them; an answer cut
short is no answer, whatever its status said (retried as a timeout). The runner gives each receiver
(``scheme://host:port``, :meth:`WebhookAction.lane`) a lane of its own, so one that never answers holds up only its
own webhooks. A redirect is never followed, to another host or the same one: it fails, naming where it pointed. At
most ``MAX_RESPONSE_BYTES`` of the answer are read.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import json
import math
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from storwatch import __version__
from storwatch.actions.base import ActionRequest, ActionResult, FieldValue
from storwatch.actions.params import Params
from storwatch.actions.secret_file import MAX_SECRET_BYTES, SecretFileError, read_secret_file
from storwatch.pace import Backoff
from storwatch.printable import printable, shown_data

MAX_BODY_BYTES = 256 << 10
"""A body larger than this is not sent (an entity with runaway fields): the action fails, naming the size."""
MAX_RESPONSE_BYTES = 4096
"""What is read of an answer: enough for an error message, never a receiver's whole page."""
MAX_CA_BYTES = 1 << 20
"""A CA file past this is refused (the system's whole bundle is about a fifth of it)."""
SIGNATURE_HEADER = "X-Storwatch-Signature"
PAYLOAD_VERSION = 1
_RETRIED_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class WebhookParams:
    url: str
    https: bool
    host: str
    port: int
    target: str
    """The path and query sent in the request line."""
    timeout: float
    retries: int
    backoff: float
    bearer_token_file: str | None
    hmac_key_file: str | None
    ca_file: str | None


def read_params(params: Mapping[str, object]) -> tuple[WebhookParams | None, list[str]]:
    p = Params(params, ("url", "timeout", "retries", "backoff", "bearer_token_file", "hmac_key_file", "ca_file"))
    url = p.string("url", required=True)
    timeout = p.number("timeout", 5.0, 0.05, 60.0)
    retries = p.integer("retries", 3, 0, 10)
    backoff = p.number("backoff", 0.5, 0.0, 30.0)
    token_file = p.string("bearer_token_file")
    key_file = p.string("hmac_key_file")
    ca_file = p.string("ca_file")
    parsed = None
    if url is not None:
        try:
            parsed = urllib.parse.urlsplit(url)
            _ = parsed.port  # raises for a port out of range
        except ValueError as err:
            p.problem("url", f"not a URL: {err}")
            parsed = None
        if parsed is not None:
            if parsed.scheme not in ("http", "https"):
                p.problem("url", "must be an http:// or https:// URL")
            elif not parsed.hostname:
                p.problem("url", "names no host")
            elif parsed.username is not None or parsed.password is not None:
                p.problem("url", "must not carry a user or password (use bearer_token_file or hmac_key_file)")
    https = parsed is not None and parsed.scheme == "https"
    if parsed is not None and not https:
        if token_file is not None:
            p.problem("bearer_token_file", "a bearer token is sent only over https")
        if ca_file is not None:
            p.problem("ca_file", "only for an https:// url")
    if token_file is not None and key_file is not None:
        p.problem("hmac_key_file", "give bearer_token_file or hmac_key_file, not both")
    if p.errors or parsed is None or url is None:
        return None, p.errors
    target = parsed.path or "/"
    if parsed.query:
        target += "?" + parsed.query
    # The port always given: http.client would read the last group of an IPv6 literal as one.
    port = parsed.port or (443 if https else 80)
    return (
        WebhookParams(
            url, https, parsed.hostname or "", port, target, timeout, retries, backoff, token_file, key_file, ca_file
        ),
        [],
    )


def _plain(value: FieldValue) -> Any:
    """A field as JSON can carry it: lists for tuples, objects for maps, null for a number that is not finite."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def payload(request: ActionRequest, node: str) -> bytes:
    """The body posted for ``request`` (the module docstring documents it)."""
    entity = request.entity
    ident = hashlib.sha256(
        json.dumps(
            [request.rule, request.action, entity.kind, entity.key, request.transition, request.at], allow_nan=True
        ).encode("ascii")
    ).hexdigest()[:32]
    document = {
        "version": PAYLOAD_VERSION,
        "id": ident,
        "rule": request.rule,
        "severity": request.severity,
        "transition": request.transition,
        "message": request.message,
        "labels": dict(request.labels),
        "entity": {"kind": entity.kind, "key": entity.key, "fields": _plain(entity.fields)},
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(request.at)),
        "timestamp": request.at,
        "node": node,
    }
    # Names from disk as printable.shown text: a byte that is not UTF-8 as \xNN, never a lone surrogate.
    return json.dumps(shown_data(document), separators=(",", ":"), allow_nan=False).encode("ascii")


def _secret(path: str, what: str) -> bytes:
    """A secret file's bytes (one trailing newline dropped); SecretFileError naming ``what`` when it cannot be had."""
    data = read_secret_file(path, what, MAX_SECRET_BYTES)
    data = data[:-1] if data.endswith(b"\n") else data
    if not data:
        raise SecretFileError(f"{what}: {printable(path)} is empty")
    return data


class _Cut(Exception):
    """The attempt's deadline came before the whole answer did (``status``: the answer's, when its head had come)."""

    def __init__(self, status: int | None) -> None:
        super().__init__(status)
        self.status = status


class _Attempt:
    """One POST, the whole of it (connect, send, the answer's head and body) cut off at ``deadline`` however slowly
    the receiver answers: a timer shuts the socket down (which wakes a blocked read, as closing it from another
    thread does not). An answer the timer cut is no answer, whatever its status said."""

    def __init__(self, conn: http.client.HTTPConnection, deadline: float) -> None:
        self.conn = conn
        self.timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._cut)
        self.timer.daemon = True
        self.lock = threading.Lock()
        self.cut = False
        self.done = False

    def _cut(self) -> None:
        with self.lock:
            if self.done:
                return
            self.cut = True
        sock = self.conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def post(self, target: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, str, str]:
        """(status, location header, the answer's first bytes as printable text); _Cut when the deadline came first
        (the socket's own timeout included)."""
        status: int | None = None
        self.timer.start()
        try:
            self.conn.request("POST", target, body=body, headers=dict(headers))
            response = self.conn.getresponse()
            status = response.status
            # A shut-down socket reads as the end of the answer: what was read by then is not the whole of it.
            data = response.read(MAX_RESPONSE_BYTES)
            with self.lock:
                self.done = True
                cut = self.cut
            if cut:
                raise _Cut(status)
            text = data.decode("utf-8", "replace")
            return status, response.getheader("Location") or "", printable(text.strip())[:200]
        except (OSError, http.client.HTTPException) as err:
            if self.cut or isinstance(err, TimeoutError):
                raise _Cut(status) from None
            raise
        finally:
            self.timer.cancel()
            self.conn.close()


class WebhookAction:
    name = "webhook"

    def __init__(self, node_name: str = "", *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.node_name = node_name
        self._sleep = sleep

    def check(self, params: Mapping[str, object]) -> list[str]:
        return read_params(params)[1]

    def lane(self, params: Mapping[str, object]) -> str:
        """The receiver a request goes to (``scheme://host:port``; empty for params that do not name one): the
        runner's lane for it."""
        read = read_params(params)[0]
        if read is None:
            return ""
        host = f"[{read.host}]" if ":" in read.host else read.host.lower()
        return f"{'https' if read.https else 'http'}://{host}:{read.port}"

    def run(self, request: ActionRequest, timeout: float) -> ActionResult:
        deadline = time.monotonic() + timeout
        params, errors = read_params(request.params)
        if params is None:
            return ActionResult("failed", "; ".join(errors))
        body = payload(request, self.node_name)
        if len(body) > MAX_BODY_BYTES:
            return ActionResult("failed", f"body of {len(body)} bytes is over {MAX_BODY_BYTES}: not sent")
        headers = {"Content-Type": "application/json", "User-Agent": f"storwatch/{__version__}"}
        try:
            if params.bearer_token_file is not None:
                token = _secret(params.bearer_token_file, "bearer_token_file").decode("ascii", "replace")
                token = token.strip()
                # Anything but visible ASCII could end the header and start another.
                if not token or not all("!" <= c <= "~" for c in token):
                    return ActionResult("failed", "bearer_token_file holds characters a header cannot carry")
                headers["Authorization"] = f"Bearer {token}"
            if params.hmac_key_file is not None:
                key = _secret(params.hmac_key_file, "hmac_key_file")
                headers[SIGNATURE_HEADER] = "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()
            context = None
            if params.https:
                cadata = None
                if params.ca_file is not None:
                    # Read here, as the secrets are (ssl would open a FIFO and wait); PEM is ASCII outside comments.
                    cadata = read_secret_file(params.ca_file, "ca_file", MAX_CA_BYTES).decode("ascii", "ignore")
                context = ssl.create_default_context(cadata=cadata)
        except SecretFileError as err:
            return ActionResult("failed", f"{err}: not sent")
        except ssl.SSLError as err:
            return ActionResult("failed", f"ca_file: {printable(params.ca_file or '')}: {err}: not sent")

        last = ""
        backoff = Backoff(params.backoff)
        for attempt in range(params.retries + 1):
            if attempt:
                wait = backoff.failed()
                if time.monotonic() + wait >= deadline:
                    return ActionResult("failed", f"{last}; no time left for retry {attempt} of {params.retries}")
                self._sleep(wait)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            per_try = min(params.timeout, left)
            conn: http.client.HTTPConnection
            if context is not None:
                conn = http.client.HTTPSConnection(params.host, params.port, timeout=per_try, context=context)
            else:
                conn = http.client.HTTPConnection(params.host, params.port, timeout=per_try)
            tried = _Attempt(conn, time.monotonic() + per_try)
            tries = f"attempt {attempt + 1} of {params.retries + 1}"
            try:
                status, location, text = tried.post(params.target, body, headers)
            except _Cut as cut:
                if cut.status is None:
                    last = f"timed out: no whole answer within {per_try:.3g} s ({tries})"
                else:
                    last = f"cut at {per_try:.3g} s: the answer (HTTP {cut.status}) was still coming ({tries})"
                continue
            except ssl.SSLCertVerificationError as err:
                why = err.verify_message or str(err)
                return ActionResult("failed", f"TLS: the receiver's certificate failed verification ({why}): {tries}")
            except (OSError, http.client.HTTPException) as err:
                last = f"{type(err).__name__}: {err} ({tries})"
                continue
            if 200 <= status < 300:
                return ActionResult("ok", f"HTTP {status} ({tries})")
            if 300 <= status < 400:
                return ActionResult(
                    "failed", f"HTTP {status}: redirect to {printable(location)[:200]!r} not followed ({tries})"
                )
            last = f"HTTP {status}" + (f": {text}" if text else "") + f" ({tries})"
            if status not in _RETRIED_STATUS:
                return ActionResult("failed", last + ", not retried")
        return ActionResult("failed", last or "no time left for a first attempt")
