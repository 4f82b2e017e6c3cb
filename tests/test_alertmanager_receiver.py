"""The Alertmanager receiver (storwatch/web/alertmanager.py): the webhook payload checked field by field (tables),
then real HTTP requests to an agent's own server (Agent.start, as `storwatch agent` runs it, with one fixed mount
source): accepted posts, 401 without or with a wrong token, 413 before the body is read, 400 naming the field,
other nodes' alerts ignored, a repeat post deduplicated, the counters, the bounds on request bodies, a reload.
Alertmanager itself posting to a real agent is in test_alertmanager_real.py."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from storwatch.agent import Agent
from storwatch.config import AlertmanagerConfig, Config, ConfigError, TLSConfig
from storwatch.web.alertmanager import PATH, BadPayload, parse_payload, read_token, settings_from
from tests.agentproc import REPO_ROOT, wait_until
from tests.builders import FixedMounts

TOKEN = "s3cr3t-t0ken_for.tests"
NODE = "node-a"
T0 = "2026-11-22T10:00:00.123456789Z"
T0_EPOCH = 1795341600.123456  # date -u -d 2026-11-22T10:00:00Z +%s
ZERO = "0001-01-01T00:00:00Z"


def am_alert(fp: str, node: str | None = NODE, status: str = "firing", **fields: Any) -> dict[str, Any]:
    """One alert as Alertmanager's webhook (version 4) writes it."""
    labels = {"alertname": "StorageBackendDegraded", "severity": "critical"}
    if node is not None:
        labels["node"] = node
    alert = {
        "status": status,
        "labels": labels,
        "annotations": {"summary": "the backend is slow"},
        "startsAt": T0,
        "endsAt": ZERO if status == "firing" else "2026-11-22T10:05:00Z",
        "generatorURL": "http://prometheus:9090/graph?g0.expr=up",
        "fingerprint": fp,
    }
    alert.update(fields)
    return alert


def payload(*alerts: dict[str, Any]) -> dict[str, Any]:
    firing = [a for a in alerts if a["status"] == "firing"]
    return {
        "receiver": "storwatch",
        "status": "firing" if firing else "resolved",
        "alerts": list(alerts),
        "groupLabels": {"alertname": "StorageBackendDegraded"},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "version": "4",
        "groupKey": '{}:{alertname="StorageBackendDegraded"}',
        "truncatedAlerts": 0,
    }


def body(data: Any) -> bytes:
    return json.dumps(data).encode()


# -- the payload, field by field


def test_a_payload_gives_its_alerts_with_times_in_seconds() -> None:
    (firing, resolved) = parse_payload(body(payload(am_alert("a1"), am_alert("b2", status="resolved"))), 42.0)
    assert firing.fingerprint == "a1" and firing.status == "firing"
    assert firing.starts_at == pytest.approx(T0_EPOCH, abs=1e-6)
    assert firing.ends_at is None  # Alertmanager's zero time
    assert firing.labels == {"alertname": "StorageBackendDegraded", "severity": "critical", "node": NODE}
    assert firing.annotations == {"summary": "the backend is slow"}
    assert firing.received_at == 42.0
    assert (resolved.status, resolved.ends_at) == ("resolved", T0_EPOCH - 0.123456 + 300)


@pytest.mark.parametrize(
    ("text", "epoch"),
    [
        pytest.param("2026-11-22T10:00:00Z", T0_EPOCH - 0.123456, id="zulu"),
        pytest.param("2026-11-22T11:00:00+01:00", T0_EPOCH - 0.123456, id="offset"),
        pytest.param("2026-11-22t09:30:00.5-00:30", T0_EPOCH - 0.123456 + 0.5, id="lowercase-t-negative-offset"),
    ],
)
def test_times_as_go_writes_them(text: str, epoch: float) -> None:
    (alert,) = parse_payload(body(payload(am_alert("a", startsAt=text))), 0.0)
    assert alert.starts_at == pytest.approx(epoch, abs=1e-6)


BAD_ALERTS = [
    pytest.param({"status": "pending"}, 'alerts[0].status: expected "firing" or "resolved", got "pending"',
                 id="status"),
    pytest.param({"fingerprint": ""}, "alerts[0].fingerprint: expected Alertmanager's fingerprint", id="fp-empty"),
    pytest.param({"fingerprint": "../x"}, "alerts[0].fingerprint: expected", id="fp-chars"),
    pytest.param({"fingerprint": "a" * 65}, "alerts[0].fingerprint: longer than 64 characters", id="fp-long"),
    pytest.param({"labels": None}, "alerts[0].labels: expected an object of strings, got null", id="labels-missing"),
    pytest.param({"labels": {"node": 7}}, "alerts[0].labels.node: expected a string, got a number", id="label-type"),
    pytest.param({"labels": {"a b": []}}, 'alerts[0].labels["a b"]: expected a string, got a list', id="label-name"),
    pytest.param({"labels": {"": "x"}}, 'alerts[0].labels[""]: a name must be 1 to 256 characters', id="label-empty"),
    pytest.param({"annotations": {"d": "x" * 16_385}}, "alerts[0].annotations.d: 16385 characters, over 16384",
                 id="annotation-long"),
    pytest.param({"annotations": {f"k{i}": "v" for i in range(129)}}, "alerts[0].annotations: 129 entries, over 128",
                 id="annotations-many"),
    pytest.param({"annotations": {f"k{i}": "v" * 10_000 for i in range(7)}},
                 "alerts[0]: its labels and annotations hold 70071 characters, over 65536", id="alert-large"),
    pytest.param({"startsAt": ZERO}, "alerts[0].startsAt: the zero time; an alert has a start", id="starts-zero"),
    pytest.param({"startsAt": "yesterday"}, 'alerts[0].startsAt: expected an RFC 3339 time (2006-01-02T15:04:05Z), '
                 'got "yesterday"', id="starts-text"),
    pytest.param({"startsAt": 1795356000}, "alerts[0].startsAt: expected an RFC 3339 time", id="starts-number"),
    pytest.param({"startsAt": "2026-13-01T00:00:00Z"}, "alerts[0].startsAt: '2026-13-01T00:00:00Z' is not a time",
                 id="month-13"),
    pytest.param({"endsAt": "2026-11-22T10:00:00"}, "alerts[0].endsAt: expected an RFC 3339 time", id="ends-no-zone"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "message"), BAD_ALERTS)
def test_a_bad_alert_is_refused_naming_its_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(BadPayload) as info:
        parse_payload(body(payload(am_alert("a"), am_alert("b")) | {"alerts": [am_alert("a", **fields)]}), 0.0)
    assert str(info.value).startswith(message), str(info.value)


BAD_BODIES = [
    pytest.param(b'{"alerts": [', "body: not JSON", id="truncated"),
    pytest.param(b"\xff\xfe{}", "body: not UTF-8", id="not-utf8"),
    pytest.param(b'{"alerts": [], "x": NaN}', "body: NaN is not JSON", id="nan"),
    pytest.param(b'{"alerts": [], "x": -Infinity}', "body: -Infinity is not JSON", id="minus-infinity"),
    pytest.param(b'{"alerts": [], "x": 1e999}', "body: the number 1e999 is not finite", id="overflowing-number"),
    pytest.param(b'{"alerts": [], "x": ' + b"9" * 5000 + b"}", "body: not JSON", id="integer-of-5000-digits"),
    pytest.param(b'{"alerts": [], "alerts": []}', 'body: the key "alerts" is given twice', id="duplicate-key"),
    pytest.param(b'{"alerts": [], "x": ' + b"[" * 9 + b"]" * 9 + b"}", "body: nested deeper than 8 levels",
                 id="deep"),
    pytest.param(b"[" * 100_000, "body: nested deeper than 8 levels", id="100k-open-brackets"),
    pytest.param(b'{"alerts": [' + b"0," * 200_000 + b"0]}", "body: may hold 200004 JSON values, over 200000",
                 id="many-values"),
    pytest.param(b"[]", "body: expected a JSON object (the webhook payload), got a list", id="not-an-object"),
    pytest.param(b'{"version": "3", "alerts": []}', 'version: \'3\' is not "4"', id="version-3"),
    pytest.param(b'{"version": "4"}', "alerts: expected a list, got null", id="no-alerts"),
    pytest.param(b'{"alerts": ["x"]}', "alerts[0]: expected an object, got a string", id="alert-not-object"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "message"), BAD_BODIES)
def test_a_bad_body_is_refused_before_any_alert_is_read(raw: bytes, message: str) -> None:
    with pytest.raises(BadPayload) as info:
        parse_payload(raw, 0.0)
    assert str(info.value).startswith(message), str(info.value)


def test_brackets_and_escapes_inside_strings_are_not_nesting() -> None:
    deep_looking = '[[[[[[[[[[{{{{{{{{{{ \\"[[[[[[[[[[ \\\\'
    (alert,) = parse_payload(body(payload(am_alert("a", annotations={"d": deep_looking}))), 0.0)
    assert alert.annotations["d"] == deep_looking


# -- settings and the token


def test_the_token_file_is_read_once_and_must_hold_a_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    assert read_token(str(token)) == TOKEN.encode()
    token.write_text("\n")
    with pytest.raises(ConfigError, match=f"alertmanager.token_file: {token} holds no token"):
        read_token(str(token))
    token.write_text("two words")
    with pytest.raises(ConfigError, match="the token has spaces or non-ASCII bytes"):
        read_token(str(token))
    with pytest.raises(ConfigError, match=f"alertmanager.token_file: cannot read {tmp_path}/gone: No such file"):
        read_token(str(tmp_path / "gone"))


def test_a_token_file_that_is_no_small_regular_file_is_refused_without_waiting(tmp_path: Path) -> None:
    """A FIFO (nothing writing it), a symbolic link, a directory or a file past the bound, named as the token file,
    is refused at once with the reason (a FIFO would have held the agent's start, or its reload, for good)."""
    good = tmp_path / "good"
    good.write_text(TOKEN)
    fifo, link, directory, big = (tmp_path / n for n in ("fifo", "link", "dir", "big"))
    os.mkfifo(fifo)
    link.symlink_to(good)
    directory.mkdir()
    big.write_bytes(b"t" * 4097)
    expected = {
        fifo: "is a FIFO, not a regular file: not read",
        link: "is a symbolic link, not followed",
        directory: "is a directory, not a regular file: not read",
        big: "is 4097 bytes, over the 4096 a secret may hold",
    }
    try:
        for path, why in expected.items():
            errors: list[str] = []

            def read(p: Path = path, errors: list[str] = errors) -> None:
                try:
                    read_token(str(p))
                except ConfigError as err:
                    errors.append(str(err))

            thread = threading.Thread(target=read, daemon=True)
            thread.start()
            thread.join(10)
            assert not thread.is_alive(), f"reading {path} as the token file did not return"
            assert errors and errors[0].startswith(f"alertmanager.token_file: {path} {why}"), errors
    finally:
        with contextlib.suppress(OSError):  # let go a reader stuck on the FIFO (before the fix)
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_the_node_name_comes_from_the_config_then_node_name_then_the_host_name(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    section = AlertmanagerConfig(enabled=True, token_file=str(token))
    config = dataclasses.replace(Config(), alertmanager=section)
    assert settings_from(config, {"NODE_NAME": "gpu-017"}).node_name == "gpu-017"
    assert settings_from(config, {}).node_name == socket.gethostname()
    named = dataclasses.replace(config, alertmanager=dataclasses.replace(section, node_name="n9"))
    assert settings_from(named, {"NODE_NAME": "gpu-017"}).node_name == "n9"


def test_a_client_certificate_alone_authenticates_only_where_the_server_asks_for_one() -> None:
    section = AlertmanagerConfig(enabled=True)
    mtls = TLSConfig("/t.crt", "/t.key", "/ca.crt")
    settings = settings_from(dataclasses.replace(Config(), alertmanager=section, tls=mtls), {})
    assert (settings.token, settings.client_certificate) == (None, True)
    with pytest.raises(
        ConfigError, match=r"alertmanager\.enabled: needs alertmanager\.token_file or tls\.client_ca_file"
    ):
        settings_from(dataclasses.replace(Config(), alertmanager=section), {})


# -- real HTTP to the agent's server


class Client:
    """Requests to one agent's server over a fresh connection each (http.client, as a plain HTTP client sends)."""

    def __init__(self, agent: Agent) -> None:
        assert agent.server is not None
        self.port = agent.server.port

    def request(
        self, method: str, path: str, data: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, path, body=data, headers=dict(headers or {}))
            resp = conn.getresponse()
            return resp.status, resp.headers, resp.read()
        finally:
            conn.close()

    def post(self, data: bytes, token: str | None = TOKEN) -> tuple[int, http.client.HTTPMessage, Any]:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        status, head, raw = self.request("POST", PATH, data, headers)
        return status, head, json.loads(raw)

    def status_alerts(self) -> list[dict[str, Any]]:
        status, _, raw = self.request("GET", "/api/status")
        assert status == 200
        alerts: list[dict[str, Any]] = json.loads(raw)["alerts"]
        return alerts

    def metric(self, name: str, result: str) -> float:
        _, _, raw = self.request("GET", "/metrics")
        prefix = f'{name}{{result="{result}"}} '
        (line,) = [ln for ln in raw.decode().splitlines() if ln.startswith(prefix)]
        return float(line[len(prefix) :])


def start_agent(tmp_path: Path, **section: Any) -> Agent:
    token = tmp_path / "am-token"
    token.write_text(TOKEN + "\n")
    fields: dict[str, Any] = {
        "enabled": True,
        "token_file": str(token),
        "node_name": NODE,
        "max_body_bytes": 65536,
    } | section
    config = dataclasses.replace(
        Config(), listen="127.0.0.1:0", platform="generic", alertmanager=AlertmanagerConfig(**fields)
    )
    agent = Agent(config, sources=[FixedMounts()], process_metrics=False)
    agent.start()
    return agent


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    agent = start_agent(tmp_path)
    try:
        yield agent
    finally:
        agent.stop()


@pytest.fixture
def client(agent: Agent) -> Client:
    c = Client(agent)
    wait_until(lambda: c.request("GET", "/api/status")[0] == 200, timeout=30.0, what="the agent's first View")
    return c


def test_an_accepted_post_keeps_this_nodes_alerts_and_ignores_the_others(agent: Agent, client: Client) -> None:
    mine, theirs, unlabelled = am_alert("aa01"), am_alert("bb02", node="node-b"), am_alert("cc03", node=None)
    status, _, answer = client.post(body(payload(mine, theirs, unlabelled)))
    assert status == 200
    assert answer == {"status": "accepted", "accepted": 1, "ignored": 2, "stored": 1, "updated": 0, "stale": 0,
                      "evicted": 0}  # fmt: skip
    assert [a.fingerprint for a in agent.alerts.current()] == ["aa01"]
    shown = wait_until(lambda: client.status_alerts() or None, timeout=30.0, what="the alert in /api/status")
    assert shown == [
        {
            "fingerprint": "aa01",
            "status": "firing",
            "labels": mine["labels"],
            "annotations": mine["annotations"],
            "starts_at": pytest.approx(T0_EPOCH, abs=1e-6),
            "ends_at": None,
            "received_at": shown[0]["received_at"],
        }
    ]
    assert abs(shown[0]["received_at"] - time.time()) < 600
    assert client.metric("storwatch_alertmanager_alerts_total", "ignored") == 2
    assert client.metric("storwatch_alertmanager_requests_total", "accepted") == 1


def test_alerts_without_the_node_label_are_taken_when_configured(tmp_path: Path) -> None:
    agent = start_agent(tmp_path, accept_without_node_label=True, node_label="instance_node")
    try:
        c = Client(agent)
        cluster_wide = am_alert("cc03", node=None)
        other = am_alert("dd04", node=None, labels={"instance_node": "node-b"})
        status, _, answer = c.post(body(payload(cluster_wide, other)))
        assert (status, answer["accepted"], answer["ignored"]) == (200, 1, 1)
        assert [a.fingerprint for a in agent.alerts.current()] == ["cc03"]
    finally:
        agent.stop()


def test_a_repeat_post_updates_the_alert_and_a_resolution_shows(agent: Agent, client: Client) -> None:
    assert client.post(body(payload(am_alert("aa01"))))[2]["stored"] == 1
    assert client.post(body(payload(am_alert("aa01"))))[2]["updated"] == 1
    assert client.post(body(payload(am_alert("aa01", status="resolved"))))[2]["updated"] == 1
    (alert,) = agent.alerts.current()
    assert (alert.fingerprint, alert.status, alert.ends_at) == ("aa01", "resolved", T0_EPOCH - 0.123456 + 300)
    # The same fingerprint firing again (a later startsAt) replaces it: still one alert for it.
    later = am_alert("aa01", startsAt="2026-11-22T11:00:00Z")
    assert client.post(body(payload(later)))[2]["stored"] == 1
    assert [(a.fingerprint, a.status) for a in agent.alerts.current()] == [("aa01", "firing")]
    assert client.metric("storwatch_alertmanager_alerts_total", "updated") == 2


@pytest.mark.parametrize(
    ("authorization", "challenge"),
    [
        pytest.param(None, 'Bearer realm="storwatch"', id="no-token"),
        pytest.param("Bearer wrong-token", 'Bearer realm="storwatch", error="invalid_token"', id="wrong-token"),
        pytest.param(f"Bearer {TOKEN}x", 'Bearer realm="storwatch", error="invalid_token"', id="token-and-more"),
        pytest.param(f"Basic {TOKEN}", 'Bearer realm="storwatch"', id="basic-scheme"),
    ],
)
def test_a_request_without_the_token_gets_401_and_changes_nothing(
    agent: Agent, client: Client, authorization: str | None, challenge: str
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    status, head, raw = client.request("POST", PATH, body(payload(am_alert("aa01"))), headers)
    assert (status, head["WWW-Authenticate"]) == (401, challenge)
    assert "error" in json.loads(raw)
    assert agent.alerts.current() == ()
    assert client.metric("storwatch_alertmanager_requests_total", "unauthorized") == 1


def test_the_scheme_is_case_insensitive(agent: Agent, client: Client) -> None:
    status, _, _ = client.request("POST", PATH, body(payload(am_alert("aa01"))), {"Authorization": f"bearer {TOKEN}"})
    assert status == 200


def test_a_body_past_the_bound_gets_413_before_it_is_sent(agent: Agent, client: Client) -> None:
    assert agent.server is not None
    with socket.create_connection(("127.0.0.1", agent.server.port), timeout=10) as sock:
        sock.sendall(
            f"POST {PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Length: 65537\r\n\r\n".encode()
        )
        reply = read_all(sock)  # the server answers and closes without waiting for the body
    assert reply.startswith(b"HTTP/1.1 413 ")
    assert b"body: 65537 bytes, over alertmanager.max_body_bytes (65536)" in reply
    assert client.metric("storwatch_alertmanager_requests_total", "too_large") == 1
    # At the bound itself the body is read (and here refused for what it is).
    status, _, answer = client.post(b" " * 65536)
    assert (status, answer["error"][:19]) == (400, "body: not JSON: Exp")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(b"{not json", "body: not JSON", id="malformed-json"),
        pytest.param(body(payload(am_alert("aa01"), am_alert("bb02", startsAt="soon"))),
                     'alerts[1].startsAt: expected an RFC 3339 time (2006-01-02T15:04:05Z), got "soon"',
                     id="bad-alert"),
    ],
)  # fmt: skip
def test_a_bad_request_gets_400_naming_the_field_and_takes_no_alert(
    agent: Agent, client: Client, data: bytes, message: str
) -> None:
    status, head, answer = client.post(data)
    assert (status, head["Content-Type"]) == (400, "application/json")
    assert answer["error"].startswith(message)
    assert agent.alerts.current() == ()  # the good alert beside the bad one is not taken either
    assert client.metric("storwatch_alertmanager_requests_total", "bad_request") == 1


def test_other_methods_and_a_chunked_body_are_refused(agent: Agent, client: Client) -> None:
    status, head, _ = client.request("GET", PATH)
    assert (status, head["Allow"]) == (405, "POST")
    assert agent.server is not None
    with socket.create_connection(("127.0.0.1", agent.server.port), timeout=10) as sock:
        sock.sendall(
            f"POST {PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n".encode()
        )
        assert read_all(sock).startswith(b"HTTP/1.1 411 ")


def test_keep_alive_and_pipelining_go_on_after_a_post(agent: Agent, client: Client) -> None:
    assert agent.server is not None
    data = body(payload(am_alert("aa01")))
    post = (
        f"POST {PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode() + data
    with socket.create_connection(("127.0.0.1", agent.server.port), timeout=10) as sock:
        sock.sendall(post + post + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        replies = read_all(sock)
    assert replies.count(b"HTTP/1.1 200 ") == 3
    assert b'"stored": 1' in replies and b'"updated": 1' in replies and replies.endswith(b"ok\n")


def test_expect_100_continue_is_answered(agent: Agent, client: Client) -> None:
    assert agent.server is not None
    data = body(payload(am_alert("aa01")))
    with socket.create_connection(("127.0.0.1", agent.server.port), timeout=10) as sock:
        sock.sendall(
            f"POST {PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nExpect: 100-continue\r\n"
            f"Connection: close\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        )
        assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(data)
        assert read_all(sock).startswith(b"HTTP/1.1 200 ")


def test_bodies_read_at_once_are_bounded_and_a_slow_one_is_dropped(tmp_path: Path) -> None:
    agent = start_agent(tmp_path)
    assert agent.server is not None
    agent.server.limits = dataclasses.replace(agent.server.limits, max_bodies=2, header_timeout_seconds=1.0)
    head = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n{{"
    try:
        slow = [socket.create_connection(("127.0.0.1", agent.server.port), timeout=30) for _ in range(2)]
        for sock in slow:
            sock.sendall(head.encode())  # a body begun, never finished: each holds a slot
        Client(agent).request("GET", "/healthz")  # the loop has taken both heads
        with socket.create_connection(("127.0.0.1", agent.server.port), timeout=10) as third:
            third.sendall(head.encode())
            reply = read_all(third)
        assert reply.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1\r\n" in reply
        for sock in slow:  # dropped at the body's deadline, unanswered
            assert read_all(sock) == b""
            sock.close()
        assert Client(agent).post(body(payload(am_alert("aa01"))))[0] == 200  # the slots are free again
    finally:
        agent.stop()


def test_the_receiver_off_answers_404(tmp_path: Path) -> None:
    agent = start_agent(tmp_path, enabled=False)
    try:
        status, _, answer = Client(agent).post(body(payload(am_alert("aa01"))))
        assert (status, answer) == (404, {"error": "the Alertmanager receiver is off (alertmanager.enabled: false)"})
        assert Client(agent).metric("storwatch_alertmanager_requests_total", "off") == 1
    finally:
        agent.stop()


def test_a_reload_reads_the_token_again_and_a_lost_token_file_keeps_the_last_good(tmp_path: Path) -> None:
    token = tmp_path / "am-token"
    config_file = tmp_path / "storwatch.yaml"
    config_file.write_text(
        f"alertmanager: {{enabled: true, token_file: {token}, node_name: {NODE}}}\nlisten: 127.0.0.1:0\n"
    )
    agent = start_agent(tmp_path)
    agent.config_path = str(config_file)
    c = Client(agent)
    try:
        token.write_text("rotated-token\n")
        assert agent.reload()
        assert c.post(body(payload(am_alert("aa01"))), token=TOKEN)[0] == 401
        assert c.post(body(payload(am_alert("aa01"))), token="rotated-token")[0] == 200
        token.unlink()
        assert not agent.reload()
        assert c.post(body(payload(am_alert("aa01"))), token="rotated-token")[0] == 200
    finally:
        agent.stop()


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not chunk:
            return out
        out += chunk


def test_the_agent_does_not_start_without_its_token_file(tmp_path: Path) -> None:
    config = tmp_path / "storwatch.yaml"
    config.write_text(f"alertmanager: {{enabled: true, token_file: {tmp_path / 'gone'}}}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "storwatch", "agent", "--listen", "127.0.0.1:0", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        check=False,
    )
    assert (proc.returncode, proc.stderr) == (
        2,
        f"storwatch: {config}: alertmanager.token_file: cannot read {tmp_path / 'gone'}: No such file or directory\n",
    )
