"""The webhook action against a local HTTPS receiver whose certificate a CA made in the test signed: the documented
body, the bearer and HMAC headers, retries on 500, a receiver that never answers, redirects, a CA that does not sign
the receiver, and the checks of a rule's params."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from storwatch.actions.base import ActionRequest, Entity
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
    assert result.outcome == "failed" and result.detail == "timed out (attempt 2 of 2)", result.detail
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
