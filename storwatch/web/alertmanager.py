"""The Alertmanager webhook receiver, ``POST /api/v1/alertmanager``: who may post (a bearer token read from a file,
and/or the client certificate the TLS handshake verified), what a post must be (the webhook payload, version 4:
strict JSON, bounded in bytes, depth and values, every alert checked), and which of its alerts are this node's (a
label naming the node). This node's alerts go to the agent's AlertBook; the rest are counted and dropped.

Alertmanager does not retry a 4xx answer, so every refusal of a request names the field at fault in its body; it
retries a 5xx one (503 when every body slot is in use).
"""

from __future__ import annotations

import datetime
import hmac
import json
import logging
import os
import re
import socket
import threading
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from storwatch.actions.alertbook import AlertBook
from storwatch.actions.base import Alert
from storwatch.actions.secret_file import SecretFileError, read_secret_file
from storwatch.config import Config, ConfigError
from storwatch.exporter.area import AlertmanagerCounts
from storwatch.printable import printable
from storwatch.web.server import Reply

log = logging.getLogger(__name__)

PATH = "/api/v1/alertmanager"
MAX_TOKEN_BYTES = 4096
MAX_JSON_DEPTH = 8
"""The payload nests four levels (the object, alerts, an alert, its labels); a little room for fields we ignore."""
MAX_JSON_VALUES = 200_000
"""Values (keys included) one body may hold: a 1 MiB payload of real alerts holds about a tenth of that."""
MAX_PAIRS = 128
"""Labels, and annotations, of one alert."""
MAX_NAME_CHARS = 256
MAX_VALUE_CHARS = 16_384
MAX_ALERT_CHARS = 65_536
"""Every label and annotation name and value of one alert together: with alertmanager.max_alerts (512) about 32 MiB
held at most."""
MAX_FINGERPRINT_CHARS = 64
REFUSAL_LOG_SECONDS = 60.0
"""A refused request is logged at most this often for each kind of refusal (each is counted)."""
_FINGERPRINT = re.compile(r"[0-9A-Za-z]+")
_RFC3339 = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d\d):(\d\d))", re.ASCII
)
_GO_ZERO_TIME = datetime.datetime(1, 1, 1, tzinfo=datetime.timezone.utc)
"""What Alertmanager writes for "no time" (Go's zero time.Time, "0001-01-01T00:00:00Z")."""
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_JSON_STRING = re.compile(rb'"[^"]*"')


@dataclass(frozen=True)
class ReceiverSettings:
    """The receiver's configuration as it takes requests: the ``alertmanager`` section with its token read."""

    enabled: bool = False
    token: bytes | None = None
    """The bearer token a request must carry; None: none is asked for (a client certificate is)."""
    client_certificate: bool = False
    """The server requires a client certificate signed by tls.client_ca_file: every connection that reaches a
    request presented one, verified by the TLS handshake."""
    node_label: str = "node"
    node_name: str = ""
    accept_without_node_label: bool = False
    max_body_bytes: int = 1 << 20


def settings_from(config: Config, environ: Mapping[str, str] | None = None) -> ReceiverSettings:
    """The receiver's settings from a configuration, its token file read (when the receiver is on): a ConfigError
    naming the field when the file cannot be read or holds no token, or when nothing would authenticate a request.
    ``environ``: where NODE_NAME is looked up (this process's environment by default)."""
    section = config.alertmanager
    environ = os.environ if environ is None else environ
    node_name = section.node_name or environ.get("NODE_NAME", "") or socket.gethostname()
    client_certificate = bool(config.tls.cert_file and config.tls.client_ca_file)
    token = read_token(section.token_file) if section.enabled and section.token_file else None
    if section.enabled and token is None and not client_certificate:
        raise ConfigError(
            "alertmanager.enabled: needs alertmanager.token_file or tls.client_ca_file (tls takes effect on "
            "restart): the receiver never takes alerts from an unauthenticated client"
        )
    return ReceiverSettings(
        section.enabled,
        token,
        client_certificate,
        section.node_label,
        node_name,
        section.accept_without_node_label,
        section.max_body_bytes,
    )


def read_token(path: str) -> bytes:
    """The bearer token in ``path``: its bytes without surrounding whitespace (a trailing newline). Read as every
    secret file is (storwatch.actions.secret_file: a regular file only, never a FIFO that would hold the agent's
    start, never through a symbolic link, bounded)."""
    try:
        data = read_secret_file(path, "alertmanager.token_file", MAX_TOKEN_BYTES)
    except SecretFileError as err:
        raise ConfigError(str(err)) from None
    token = data.strip()
    if not token:
        raise ConfigError(f"alertmanager.token_file: {printable(path)} holds no token")
    if any(b < 0x21 or b > 0x7E for b in token):
        # It has to travel in an HTTP header: Alertmanager would send what no client can match.
        raise ConfigError(f"alertmanager.token_file: {printable(path)}: the token has spaces or non-ASCII bytes")
    return token


class BadPayload(ValueError):
    """A post that is not a webhook payload we take; the message starts with the field at fault."""


class AlertmanagerReceiver:
    """The handler of ``POST /api/v1/alertmanager`` (a ``web.server.PostHandler``). Thread-safe: its settings are
    swapped whole (:meth:`configure`), the book and the counts lock for themselves."""

    def __init__(
        self,
        book: AlertBook,
        counts: AlertmanagerCounts,
        settings: ReceiverSettings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.book = book
        self.counts = counts
        self.settings = settings
        self.clock = clock
        self._logged: dict[int, float] = {}
        self._log_lock = threading.Lock()

    def configure(self, settings: ReceiverSettings) -> None:
        self.settings = settings

    def describe(self) -> str:
        """One line for the log: whether it takes alerts, for which node and how they are authenticated."""
        s = self.settings
        if not s.enabled:
            return "alertmanager: the receiver is off (alertmanager.enabled: false)"
        how = " and ".join(
            what
            for what, on in (("a bearer token", s.token is not None), ("a client certificate", s.client_certificate))
            if on
        )
        unlabelled = "taken" if s.accept_without_node_label else "ignored"
        return (
            f"alertmanager: taking alerts at {PATH} for {s.node_label}={s.node_name!r} with {how}; alerts without "
            f"the {s.node_label} label are {unlabelled}"
        )

    # -- web.server.PostHandler

    def admit(self, headers: Mapping[str, str], length: int) -> Reply | None:
        s = self.settings
        if not s.enabled:
            self.counts.request("off")
            return self._refused(404, "the Alertmanager receiver is off (alertmanager.enabled: false)")
        if s.token is not None:
            given = _bearer(headers.get("authorization", ""))
            if given is None:
                return self._unauthorized("a bearer token is required (Authorization: Bearer ...)", "")
            if not hmac.compare_digest(given, s.token):
                return self._unauthorized("the bearer token is not this receiver's", ', error="invalid_token"')
        elif not s.client_certificate:  # settings_from refuses this; never take alerts unauthenticated
            return self._unauthorized("the receiver has no credential to check", "")
        if length > s.max_body_bytes:
            self.counts.request("too_large")
            return self._refused(413, f"body: {length} bytes, over alertmanager.max_body_bytes ({s.max_body_bytes})")
        return None

    def handle(self, headers: Mapping[str, str], body: bytes) -> Reply:
        s = self.settings
        try:
            alerts = parse_payload(body, self.clock())
        except BadPayload as err:
            self.counts.request("bad_request")
            return self._refused(400, str(err))
        mine = [a for a in alerts if self._is_mine(a, s)]
        result = self.book.add(mine)
        ignored = len(alerts) - len(mine)
        self.counts.request("accepted")
        for name, count in (
            ("stored", result.stored),
            ("updated", result.updated),
            ("stale", result.stale),
            ("ignored", ignored),
            ("evicted", result.evicted),
        ):
            if count:
                self.counts.alerts(name, count)
        answer = {
            "status": "accepted",
            "accepted": len(mine),
            "ignored": ignored,
            "stored": result.stored,
            "updated": result.updated,
            "stale": result.stale,
            "evicted": result.evicted,
        }
        return Reply(200, (json.dumps(answer) + "\n").encode())

    # -- /api/status

    def status_extras(self) -> dict[str, object]:
        """``alerts``: the alerts the book holds, for /api/status."""
        return {"alerts": [alert_to_dict(a) for a in self.book.current()]}

    def _is_mine(self, alert: Alert, s: ReceiverSettings) -> bool:
        node = alert.labels.get(s.node_label)
        return s.accept_without_node_label if node is None else node == s.node_name

    def _unauthorized(self, message: str, error: str) -> Reply:
        self.counts.request("unauthorized")
        challenge = ("WWW-Authenticate", f'Bearer realm="storwatch"{error}')
        return self._refused(401, message, (challenge,))

    def _refused(self, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
        """The refusal, logged (at most every REFUSAL_LOG_SECONDS for each status): Alertmanager does not retry a
        4xx, so this line and its own log are where a misconfigured sender shows."""
        now = time.monotonic()
        with self._log_lock:
            last = self._logged.get(status)
            due = last is None or now - last >= REFUSAL_LOG_SECONDS
            if due:
                self._logged[status] = now
        if due:
            log.warning("alertmanager: refused a request with %d: %s (logged once a minute at most)", status, message)
        return _error(status, message, headers)


def alert_to_dict(alert: Alert) -> dict[str, object]:
    """An alert as /api/status lists it (times in seconds since the epoch; ``ends_at`` null while it fires)."""
    return {
        "fingerprint": alert.fingerprint,
        "status": alert.status,
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "starts_at": alert.starts_at,
        "ends_at": alert.ends_at,
        "received_at": alert.received_at,
    }


def _error(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(status, (json.dumps({"error": message}) + "\n").encode(), headers=headers)


def _bearer(authorization: str) -> bytes | None:
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return None
    return credentials.strip().encode("latin-1")  # the head was decoded as latin-1: this gives back its bytes


# -- the payload


def parse_payload(body: bytes, received_at: float) -> list[Alert]:
    """A webhook payload (version 4) -> its alerts, every one checked; BadPayload naming the field otherwise.
    Fields other than ``version`` and ``alerts`` (receiver, status, groupLabels, commonLabels, externalURL...) are
    not read: each alert carries its own labels."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadPayload(f"body: not UTF-8 ({err.reason} at byte {err.start})") from None
    _check_structure(body)
    try:
        data = json.loads(
            text, parse_constant=_refuse_constant, parse_float=_finite_float, object_pairs_hook=_no_duplicate_keys
        )
    except BadPayload:
        raise
    except RecursionError:
        raise BadPayload(f"body: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as err:  # json.JSONDecodeError, an integer of thousands of digits
        raise BadPayload(f"body: not JSON: {err}") from None
    if not isinstance(data, dict):
        raise BadPayload(f"body: expected a JSON object (the webhook payload), got {_kind(data)}")
    version = data.get("version", "4")
    if version != "4":
        raise BadPayload(f'version: {version!r} is not "4", the only webhook payload version this receiver reads')
    raw_alerts = data.get("alerts")
    if not isinstance(raw_alerts, list):
        raise BadPayload(f"alerts: expected a list, got {_kind(raw_alerts)}")
    return [_alert(raw, f"alerts[{i}]", received_at) for i, raw in enumerate(raw_alerts)]


def _alert(raw: Any, where: str, received_at: float) -> Alert:
    if not isinstance(raw, dict):
        raise BadPayload(f"{where}: expected an object, got {_kind(raw)}")
    status = raw.get("status")
    if status not in ("firing", "resolved"):
        raise BadPayload(f'{where}.status: expected "firing" or "resolved", got {_shown(status)}')
    fingerprint = raw.get("fingerprint")
    if not isinstance(fingerprint, str) or not _FINGERPRINT.fullmatch(fingerprint):
        raise BadPayload(
            f"{where}.fingerprint: expected Alertmanager's fingerprint (hex digits), got {_shown(fingerprint)}"
        )
    if len(fingerprint) > MAX_FINGERPRINT_CHARS:
        raise BadPayload(f"{where}.fingerprint: longer than {MAX_FINGERPRINT_CHARS} characters")
    labels = _pairs(raw.get("labels"), f"{where}.labels", required=True)
    annotations = _pairs(raw.get("annotations"), f"{where}.annotations", required=False)
    size = sum(len(k) + len(v) for pairs in (labels, annotations) for k, v in pairs.items())
    if size > MAX_ALERT_CHARS:
        raise BadPayload(f"{where}: its labels and annotations hold {size} characters, over {MAX_ALERT_CHARS}")
    starts_at = _time(raw.get("startsAt"), f"{where}.startsAt")
    if starts_at is None:
        raise BadPayload(f"{where}.startsAt: the zero time; an alert has a start")
    ends_at = _time(raw["endsAt"], f"{where}.endsAt") if raw.get("endsAt") is not None else None
    return Alert(
        fingerprint,
        "firing" if status == "firing" else "resolved",
        types.MappingProxyType(labels),
        types.MappingProxyType(annotations),
        starts_at,
        ends_at,
        received_at,
    )


def _pairs(raw: Any, where: str, required: bool) -> dict[str, str]:
    if raw is None and not required:
        return {}
    if not isinstance(raw, dict):
        raise BadPayload(f"{where}: expected an object of strings, got {_kind(raw)}")
    if len(raw) > MAX_PAIRS:
        raise BadPayload(f"{where}: {len(raw)} entries, over {MAX_PAIRS}")
    for name, value in raw.items():
        field = f"{where}.{name}" if _IDENTIFIER.fullmatch(name) else f"{where}[{json.dumps(name[:64])}]"
        if not name or len(name) > MAX_NAME_CHARS:
            raise BadPayload(f"{field}: a name must be 1 to {MAX_NAME_CHARS} characters")
        if not isinstance(value, str):
            raise BadPayload(f"{field}: expected a string, got {_kind(value)}")
        if len(value) > MAX_VALUE_CHARS:
            raise BadPayload(f"{field}: {len(value)} characters, over {MAX_VALUE_CHARS}")
    return dict(raw)


def _time(raw: Any, where: str) -> float | None:
    """An RFC 3339 time (as Go writes time.Time) -> seconds since the epoch; None for Go's zero time."""
    m = _RFC3339.fullmatch(raw) if isinstance(raw, str) else None
    if m is None:
        raise BadPayload(f"{where}: expected an RFC 3339 time (2006-01-02T15:04:05Z), got {_shown(raw)}")
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = m.groups()
    try:
        offset = (
            datetime.timedelta(0)
            if zulu
            else int(sign + "1") * datetime.timedelta(hours=int(off_h), minutes=int(off_m))
        )
        at = datetime.datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            int((fraction or "0").ljust(6, "0")[:6]),
            tzinfo=datetime.timezone(offset),
        )
    except (ValueError, OverflowError) as err:  # month 13, a second of 60, an offset of 24 hours...
        raise BadPayload(f"{where}: {raw!r} is not a time: {err}") from None
    if at == _GO_ZERO_TIME:
        return None
    return at.timestamp()


def _check_structure(body: bytes) -> None:
    """Depth and value count, from the bytes before any parse: a parser that recurses or builds would spend memory
    on a hostile body first. Brackets inside strings are dropped first (escaped quotes and backslashes before)."""
    values = body.count(b",") + body.count(b":") + body.count(b"[") + body.count(b"{") + 1
    if values > MAX_JSON_VALUES:
        raise BadPayload(f"body: may hold {values} JSON values, over {MAX_JSON_VALUES}")
    raw = body.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in body else body
    brackets = _JSON_STRING.sub(b"", raw.translate(None, _NOT_STRUCTURE)).translate(_BRACES_AS_BRACKETS)
    for passes in range(MAX_JSON_DEPTH + 1):
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):
            # Only unmatched brackets are left (the parser refuses them): each opener is one more level.
            if passes + inner.count(b"[") <= MAX_JSON_DEPTH:
                return
            break
        brackets = inner  # each pass removed the innermost level
    raise BadPayload(f"body: nested deeper than {MAX_JSON_DEPTH} levels")


_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_BRACES_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")


def _refuse_constant(name: str) -> Any:
    raise BadPayload(f"body: {name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise BadPayload(f"body: the number {text[:40]} is not finite as a double")
    return value


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:  # json.loads keeps the last silently: which one Alertmanager meant is unknown
            raise BadPayload(f"body: the key {json.dumps(key[:64])} is given twice in one object")
        data[key] = value
    return data


def _kind(value: Any) -> str:
    names: dict[type, str] = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = [
    "PATH",
    "AlertmanagerReceiver",
    "BadPayload",
    "ReceiverSettings",
    "alert_to_dict",
    "parse_payload",
    "read_token",
    "settings_from",
]
