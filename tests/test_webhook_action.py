"""The webhook action against a local HTTPS receiver whose certificate a CA made in the test signed: the documented
body, the bearer and HMAC headers, retries on 500, a receiver that never answers, redirects, a CA that does not sign
the receiver, and the checks of a rule's params."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from storwatch.actions.base import ActionRequest, ActionResult, Entity
from storwatch.actions.runner import ActionRunner, Limits
from storwatch.actions.secret_file import MAX_SECRET_BYTES
from storwatch.actions.webhook import SIGNATURE_HEADER, WebhookAction
from storwatch.actions.webhook import read_params as webhook_params
from tests.pki import have_openssl, make_ca, server_for_loopback
from tests.webhook_receiver import Receiver, receiver

pytestmark = pytest.mark.realpart

T0 = 1_800_000_000.0


@dataclass(frozen=True)
class Certs:
    ca: Path
    server: tuple[Path, Path]
    other_ca: Path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    if not have_openssl():
        pytest.skip("the openssl CLI is not on PATH (Debian package 'openssl')")
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d, "webhook-ca")
    other = make_ca(d, "other-ca")
    return Certs(ca[0], server_for_loopback(d, ca), other[0])


@pytest.fixture
def https(certs: Certs) -> Iterator[Receiver]:
    with receiver(certs.server) as recv:
        yield recv


def request(url: str, **params: object) -> ActionRequest:
    entity = Entity(
        "run",
        "home/alice/run1",
        {"path": "/home/alice/run1", "durability": "node", "bytes": 123, "ratio": float("nan"), "tags": ("a", "b")},
    )
    return ActionRequest(
        rule="ephemeral-only",
        action="webhook",
        params={"url": url, **params},
        entity=entity,
        severity="critical",
        message="run home/alice/run1 has checkpoints only on node storage",
        labels={"team": "ml"},
        at=T0,
    )


def test_the_documented_payload_with_a_bearer_token(https: Receiver, certs: Certs, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cr3t-token\n")
    action = WebhookAction(node_name="node-a")
    req = request(https.url, ca_file=str(certs.ca), bearer_token_file=str(token))
    assert action.check(req.params) == []
    result = action.run(req, timeout=10)
    assert result.outcome == "ok", result.detail
    [got] = https.received
    assert got.path == "/hook?x=1"
    assert got.headers["Authorization"] == "Bearer s3cr3t-token"
    assert got.headers["Content-Type"] == "application/json"
    assert SIGNATURE_HEADER not in got.headers
    body = json.loads(got.body)
    assert body == {
        "version": 1,
        "id": body["id"],
        "rule": "ephemeral-only",
        "severity": "critical",
        "transition": "firing",
        "message": "run home/alice/run1 has checkpoints only on node storage",
        "labels": {"team": "ml"},
        "entity": {
            "kind": "run",
            "key": "home/alice/run1",
            "fields": {
                "path": "/home/alice/run1",
                "durability": "node",
                "bytes": 123,
                "ratio": None,
                "tags": ["a", "b"],
            },
        },
        "time": "2027-01-15T08:00:00Z",
        "timestamp": T0,
        "node": "node-a",
    }
    assert len(body["id"]) == 32 and int(body["id"], 16) >= 0


def test_hmac_signature_of_the_exact_body(https: Receiver, certs: Certs, tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_bytes(b"k\x00ey-bytes\n")
    result = WebhookAction("node-a").run(request(https.url, ca_file=str(certs.ca), hmac_key_file=str(key)), 10)
    assert result.outcome == "ok", result.detail
    [got] = https.received
    expected = hmac.new(b"k\x00ey-bytes", got.body, hashlib.sha256).hexdigest()
    assert got.headers[SIGNATURE_HEADER] == f"sha256={expected}"
    assert "Authorization" not in got.headers
    # A signature with another key does not match: the receiver can tell.
    assert got.headers[SIGNATURE_HEADER] != "sha256=" + hmac.new(b"other", got.body, hashlib.sha256).hexdigest()


def test_retried_on_500_then_delivered_with_the_same_body(https: Receiver, certs: Certs) -> None:
    https.script = [500, 503]
    result = WebhookAction().run(request(https.url, ca_file=str(certs.ca), backoff=0.01, retries=3), 10)
    assert result.outcome == "ok", result.detail
    assert "attempt 3 of 4" in result.detail
    assert len(https.received) == 3
    assert len({r.body for r in https.received}) == 1


def test_retries_give_up_and_a_client_error_is_not_retried(https: Receiver, certs: Certs) -> None:
    https.script = [500, 500, 500]
    result = WebhookAction().run(request(https.url, ca_file=str(certs.ca), backoff=0.01, retries=2), 10)
    assert result.outcome == "failed" and "HTTP 500" in result.detail and "attempt 3 of 3" in result.detail
    assert len(https.received) == 3
    https.script = [403]
    result = WebhookAction().run(request(https.url, ca_file=str(certs.ca), backoff=0.01, retries=2), 10)
    assert result.outcome == "failed" and "HTTP 403: answer 403" in result.detail and "not retried" in result.detail
    assert len(https.received) == 4


def test_a_receiver_that_never_answers_is_cut_off(https: Receiver, certs: Certs) -> None:
    """Each attempt ends at its timeout and the retries stop at the run's own time: the run returns, failed, having
    tried no more often than its params allow, while the receiver is still holding every request."""
    https.script = ["hang"] * 10
    result = WebhookAction().run(request(https.url, ca_file=str(certs.ca), timeout=1, retries=1, backoff=0.01), 10)
    assert result.outcome == "failed" and result.detail == "timed out: no whole answer within 1 s (attempt 2 of 2)"
    # (On a loaded machine an attempt may time out in its TLS handshake, before the receiver has the request.)
    assert len(https.received) <= 2
    assert not https.release.is_set()
    # The run's own time cuts an attempt whose per-attempt timeout is longer.
    result = WebhookAction().run(request(https.url, ca_file=str(certs.ca), timeout=30, retries=0), 0.3)
    assert result.outcome == "failed" and result.detail.startswith("timed out"), result.detail


def test_a_redirect_is_not_followed(certs: Certs, https: Receiver) -> None:
    with receiver() as elsewhere:
        https.script = [f"redirect:{elsewhere.url}"]
        result = WebhookAction().run(request(https.url, ca_file=str(certs.ca)), 10)
        assert result.outcome == "failed" and "not followed" in result.detail and elsewhere.url in result.detail
        assert elsewhere.received == []
        assert len(https.received) == 1


def test_a_receiver_not_signed_by_the_ca_gets_nothing(https: Receiver, certs: Certs, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cr3t")
    result = WebhookAction().run(request(https.url, ca_file=str(certs.other_ca), bearer_token_file=str(token)), 10)
    assert result.outcome == "failed" and "certificate failed verification" in result.detail, result.detail
    assert https.received == []


def test_a_missing_secret_fails_and_sends_nothing(https: Receiver, certs: Certs, tmp_path: Path) -> None:
    result = WebhookAction().run(
        request(https.url, ca_file=str(certs.ca), bearer_token_file=str(tmp_path / "nope")), 10
    )
    assert result.outcome == "failed" and "bearer_token_file" in result.detail
    assert https.received == []


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({}, "params.url: required"),
        ({"url": "ftp://x/"}, "params.url: must be an http:// or https:// URL"),
        ({"url": "https://u:p@x/"}, "params.url: must not carry a user or password"),
        ({"url": "https://x:99999/"}, "params.url: not a URL"),
        ({"url": "https:///path"}, "params.url: names no host"),
        ({"url": "http://x/", "bearer_token_file": "/t"}, "params.bearer_token_file: a bearer token is sent only"),
        ({"url": "http://x/", "ca_file": "/ca"}, "params.ca_file: only for an https:// url"),
        ({"url": "https://x/", "bearer_token_file": "/t", "hmac_key_file": "/k"}, "params.hmac_key_file: give"),
        ({"url": "https://x/", "timeout": 0}, "params.timeout: must be between"),
        ({"url": "https://x/", "timeout": True}, "params.timeout: must be a number"),
        ({"url": "https://x/", "retries": 1.5}, "params.retries: must be a whole number"),
        ({"url": "https://x/", "retries": 11}, "params.retries: must be between 0 and 10"),
        ({"url": "https://x/", "headers": {}}, "params.headers: unknown field"),
    ],
    ids=["no-url", "scheme", "userinfo", "port", "no-host", "token-in-clear", "ca-on-http", "both-secrets",
         "timeout-range", "timeout-bool", "retries-float", "retries-range", "unknown"],
)  # fmt: skip
def test_params_checked_with_the_field_named(params: dict[str, object], error: str) -> None:
    errors = WebhookAction().check(params)
    assert any(e.startswith(error) for e in errors), errors
    # What the check refuses, a run refuses too, without sending anything.
    req = ActionRequest("r", "webhook", params, Entity("node", "node-a", {}), "info", "m")
    assert WebhookAction().run(req, 1).outcome == "failed"


def test_good_params_pass() -> None:
    assert WebhookAction().check({"url": "http://127.0.0.1:9/x", "hmac_key_file": "/k", "retries": 0}) == []
    read, errors = webhook_params({"url": "https://[::1]/hook"})
    assert errors == [] and read is not None and (read.host, read.port, read.target) == ("::1", 443, "/hook")


# -- secret files that are not small regular files


@contextlib.contextmanager
def hostile_secret(kind: str, tmp_path: Path) -> Iterator[Path]:
    """A path where a secret is named that is a FIFO nothing writes, a symbolic link to a good key, a directory, or
    a file over the bound. A reader stuck on the FIFO (before the fix) is let go at the end."""
    path = tmp_path / f"secret-{kind}"
    good = tmp_path / "good-key"
    good.write_bytes(b"key\n")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        path.symlink_to(good)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"k" * (MAX_SECRET_BYTES + 1))
    try:
        yield path
    finally:
        if kind == "fifo":
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


SECRET_ERRORS = {
    "fifo": "is a FIFO, not a regular file: not read",
    "symlink": "is a symbolic link, not followed: name the file itself (a Kubernetes Secret volume's keys, as the "
    "kubelet writes them, are read)",
    "directory": "is a directory, not a regular file: not read",
    "oversized": f"is {MAX_SECRET_BYTES + 1} bytes, over the {MAX_SECRET_BYTES} a secret may hold",
}


def hook(url: str, rule: str, **params: object) -> ActionRequest:
    return dataclasses.replace(request(url, **params), rule=rule, cooldown=0.0)


@pytest.mark.parametrize("kind", list(SECRET_ERRORS))
def test_a_secret_that_is_no_small_regular_file_fails_clearly_and_the_next_webhook_goes_out(
    kind: str, tmp_path: Path
) -> None:
    """Through the runner, as the agent runs webhooks: the webhook whose ``hmac_key_file`` is a FIFO (which would
    hold the lane for good), a symbolic link, a directory or a file over the bound fails at once, naming the file;
    the next webhook, of another rule, to the same receiver, goes out."""
    with receiver() as recv, hostile_secret(kind, tmp_path) as secret:
        runner = ActionRunner(
            {"webhook": WebhookAction()}, limits={"webhook": Limits(timeout=3, burst=10, per_second=1)}
        )
        try:
            assert runner.submit(hook(recv.url, "signed", hmac_key_file=str(secret))) is None
            assert runner.submit(hook(recv.url, "plain")) is None
            assert runner.wait_idle(30)
            results = {r.rule: r for r in runner.recent()}
            assert results["signed"].outcome == "failed"
            assert results["signed"].detail == f"hmac_key_file: {secret} {SECRET_ERRORS[kind]}: not sent"
            assert results["plain"].outcome == "ok", results["plain"].detail
            [got] = recv.received
            assert json.loads(got.body)["rule"] == "plain"
        finally:
            runner.close()


def test_a_fifo_as_bearer_token_or_ca_file_fails_without_waiting(https: Receiver, certs: Certs, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cr3t\n")
    with hostile_secret("fifo", tmp_path) as fifo:
        for params, field in (({"bearer_token_file": str(fifo), "ca_file": str(certs.ca)}, "bearer_token_file"),
                              ({"bearer_token_file": str(token), "ca_file": str(fifo)}, "ca_file")):  # fmt: skip
            result = run_in_thread(lambda p=params: WebhookAction().run(request(https.url, **p), 10))  # type: ignore[misc]
            assert result is not None, f"{field} as a FIFO held the webhook"
            assert result.outcome == "failed" and result.detail == f"{field}: {fifo} {SECRET_ERRORS['fifo']}: not sent"
    assert https.received == []
    # The CA as a regular file still verifies the receiver.
    result = WebhookAction().run(request(https.url, bearer_token_file=str(token), ca_file=str(certs.ca)), 10)
    assert result.outcome == "ok", result.detail


def run_in_thread(job: Callable[[], ActionResult], timeout: float = 10.0) -> ActionResult | None:
    """``job``'s result, or None when it has not returned within ``timeout`` (it is left blocked)."""
    out: list[ActionResult] = []
    thread = threading.Thread(target=lambda: out.append(job()), daemon=True)
    thread.start()
    thread.join(timeout)
    return out[0] if out else None


# -- receivers that trickle or never answer


@contextlib.contextmanager
def trickling_receiver(head_at_once: bool) -> Iterator[str]:
    """A raw HTTP receiver that reads a request and answers 200 a byte every 0.5 s (with ``head_at_once``, the
    status line and headers at once and only the body trickled), for far longer than any webhook deadline here."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 64\r\n\r\n"

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
            while len(body) < length:
                body += conn.recv(65536)
            try:
                if head_at_once:
                    conn.sendall(answer)
                for byte in (b"" if head_at_once else answer) + b"x" * 64:
                    if stop.wait(0.5):
                        return
                    conn.sendall(bytes([byte]) if isinstance(byte, int) else byte)
            except OSError:
                return  # the webhook hung up

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/hook"
    finally:
        stop.set()
        server.close()
        thread.join(10)


@pytest.mark.parametrize("head_at_once", [True, False], ids=["body-trickled", "all-trickled"])
def test_an_answer_trickled_past_the_deadline_is_cut_and_failed(head_at_once: bool) -> None:
    """The deadline covers the whole request, the answer's body included: a 200 whose body is still coming when it
    passes is no answer (before, the cut body read as the end of the answer, and the webhook was recorded ok)."""
    with trickling_receiver(head_at_once) as url:
        result = WebhookAction().run(request(url, timeout=1, retries=0), 10)
    assert result.outcome == "failed"
    if head_at_once:
        assert result.detail == "cut at 1 s: the answer (HTTP 200) was still coming (attempt 1 of 1)"
    else:
        assert result.detail == "timed out: no whole answer within 1 s (attempt 1 of 1)"


def test_a_receiver_that_never_answers_holds_up_only_its_own_webhooks() -> None:
    """Each receiver has its own lane: while the first receiver holds a webhook without answering, a webhook of
    another rule to another receiver is delivered (its result comes while the first's has not)."""
    with receiver() as hung, receiver() as good:
        hung.script = ["hang"]
        runner = ActionRunner({"webhook": WebhookAction()})
        try:
            assert runner.submit(hook(hung.url, "to-hung", timeout=30, retries=0)) is None
            assert runner.submit(hook(good.url, "to-good")) is None
            for _ in range(600):  # until the good one's result is in (a bound, not a measure)
                if any(r.rule == "to-good" for r in runner.recent()):
                    break
                time.sleep(0.1)
            results = {r.rule: r for r in runner.recent()}
            assert results["to-good"].outcome == "ok", results["to-good"].detail
            assert "to-hung" not in results  # still held by its receiver
            assert [json.loads(r.body)["rule"] for r in hung.received] == ["to-hung"]
            assert [json.loads(r.body)["rule"] for r in good.received] == ["to-good"]
            assert runner.lanes() == {"webhook": [f"http://127.0.0.1:{port(hung)}", f"http://127.0.0.1:{port(good)}"]}
        finally:
            hung.release.set()
            runner.close()


def port(recv: Receiver) -> int:
    assert recv.server is not None
    return int(recv.server.server_address[1])
