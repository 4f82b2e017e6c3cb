"""TLS and client certificates on the agent's server, with a CA and certificates made by the openssl CLI.

``tls: {cert_file, key_file, client_ca_file}`` makes the agent serve HTTPS and require a client certificate signed by
that CA; without ``client_ca_file`` any TLS client is served.
"""

from __future__ import annotations

import http.client
import json
import shutil
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.agentproc import AgentProcess, Response, fetch, running_agent, wait_until
from tests.pki import make_ca, make_leaf

pytestmark = pytest.mark.realpart

# What a refused TLS client sees: an alert (ssl.SSLError), or the server closing or resetting the connection, all
# of which urllib wraps in URLError.
REFUSED = (urllib.error.URLError, ssl.SSLError, ConnectionError, http.client.HTTPException)


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_client_cert: Path
    """Signed by a second CA that the agent does not trust."""
    rogue_client_key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is not on PATH")
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d, "storwatch-test-ca")
    rogue_ca = make_ca(d, "rogue-ca")
    server = make_leaf(d, "server", ca, "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    client = make_leaf(d, "client", ca, "extendedKeyUsage=clientAuth\n")
    rogue = make_leaf(d, "rogue-client", rogue_ca, "extendedKeyUsage=clientAuth\n")
    return Pki(ca[0], server[0], server[1], client[0], client[1], rogue[0], rogue[1])


def client_context(pki: Pki, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """Trusts our CA and checks that the server's certificate is for 127.0.0.1; presents ``cert`` if given."""
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def tls_agent(tmp_path: Path, pki: Pki, client_ca: bool, more: str = "") -> Iterator[AgentProcess]:
    config = tmp_path / "storwatch.yaml"
    lines = ["tls:", f"  cert_file: {pki.server_cert}", f"  key_file: {pki.server_key}"]
    if client_ca:
        lines.append(f"  client_ca_file: {pki.ca_cert}")
    config.write_text("\n".join(lines) + "\n" + more, encoding="utf-8")
    with running_agent("--listen", "127.0.0.1:0", "--config", str(config), env={"NODE_NAME": "node-a"}) as agent:
        yield agent


@pytest.fixture(scope="module")
def mtls_agent(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    yield from tls_agent(tmp_path_factory.mktemp("mtls"), pki, client_ca=True)


@pytest.fixture(scope="module")
def server_tls_agent(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    yield from tls_agent(tmp_path_factory.mktemp("tls"), pki, client_ca=False)


def https_metrics(agent: AgentProcess, ctx: ssl.SSLContext) -> Response:
    return fetch(agent.url("/metrics", scheme="https"), context=ctx, timeout=10.0)


def assert_whole_scrape(resp: Response) -> None:
    """The agent's own scrape, whole. Not whether the mounts collector succeeded: that depends on the host's mount
    table (another test's hung FUSE mounts can leave mounts unmeasured), and these tests are about TLS."""
    assert b"storwatch_build_info{" in resp.body
    assert b'storwatch_collector_success{collector="mounts"} ' in resp.body
    assert resp.body.endswith(b"\n")


def full_scrape(agent: AgentProcess, ctx: ssl.SSLContext) -> Response:
    def probe() -> Response | None:
        resp = https_metrics(agent, ctx)
        return resp if resp.status == 200 and b"storwatch_mount_info{" in resp.body else None

    return wait_until(probe, timeout=15.0, what="a full /metrics over TLS")


def test_trusted_client_certificate_is_served(mtls_agent: AgentProcess, pki: Pki) -> None:
    resp = full_scrape(mtls_agent, client_context(pki, pki.client_cert, pki.client_key))
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert_whole_scrape(resp)


def test_client_without_certificate_is_refused(mtls_agent: AgentProcess, pki: Pki) -> None:
    full_scrape(mtls_agent, client_context(pki, pki.client_cert, pki.client_key))  # the server is up and serving
    with pytest.raises(REFUSED):
        https_metrics(mtls_agent, client_context(pki))


def test_client_certificate_from_untrusted_ca_is_refused(mtls_agent: AgentProcess, pki: Pki) -> None:
    full_scrape(mtls_agent, client_context(pki, pki.client_cert, pki.client_key))
    with pytest.raises(REFUSED):
        https_metrics(mtls_agent, client_context(pki, pki.rogue_client_cert, pki.rogue_client_key))


def test_plain_http_is_refused(mtls_agent: AgentProcess, server_tls_agent: AgentProcess) -> None:
    for agent in (mtls_agent, server_tls_agent):
        with pytest.raises(REFUSED):
            fetch(agent.url("/metrics"), timeout=10.0)


def test_server_presents_the_configured_certificate(server_tls_agent: AgentProcess, pki: Pki) -> None:
    """A client that does not trust our CA refuses the server: the agent really serves the configured certificate."""
    with pytest.raises(urllib.error.URLError) as info:
        https_metrics(server_tls_agent, ssl.create_default_context())
    assert isinstance(info.value.reason, ssl.SSLCertVerificationError)


def test_without_client_ca_a_client_without_certificate_is_served(server_tls_agent: AgentProcess, pki: Pki) -> None:
    resp = full_scrape(server_tls_agent, client_context(pki))
    assert_whole_scrape(resp)
    # A client certificate is not asked for, and not refused when offered.
    resp = https_metrics(server_tls_agent, client_context(pki, pki.rogue_client_cert, pki.rogue_client_key))
    assert resp.status == 200


# -- the Alertmanager receiver behind client certificates

AM_TOKEN = "token-for-the-receiver"
AM_PAYLOAD = json.dumps(
    {
        "version": "4",
        "status": "firing",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "X", "node": "node-a"},
                "annotations": {},
                "startsAt": "2026-11-22T10:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "fingerprint": "0123456789abcdef",
            }
        ],
    }
).encode()


@pytest.fixture(scope="module")
def am_cert_agent(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    """The receiver on with the client certificate alone as its credential."""
    yield from tls_agent(tmp_path_factory.mktemp("am-cert"), pki, True, "alertmanager: {enabled: true}\n")


@pytest.fixture(scope="module")
def am_both_agent(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    """The receiver on with a client certificate and a bearer token: a request needs both."""
    d = tmp_path_factory.mktemp("am-both")
    (d / "token").write_text(AM_TOKEN + "\n", encoding="utf-8")
    yield from tls_agent(d, pki, True, f"alertmanager: {{enabled: true, token_file: {d / 'token'}}}\n")


def post_alerts(agent: AgentProcess, ctx: ssl.SSLContext, token: str | None) -> Response:
    request = urllib.request.Request(agent.url("/api/v1/alertmanager", scheme="https"), data=AM_PAYLOAD, method="POST")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10.0, context=ctx) as resp:
            return Response(resp.status, resp.headers, resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return Response(err.code, err.headers, err.read())


def test_the_receiver_takes_a_client_certificate_as_its_credential(am_cert_agent: AgentProcess, pki: Pki) -> None:
    trusted = client_context(pki, pki.client_cert, pki.client_key)
    full_scrape(am_cert_agent, trusted)
    resp = post_alerts(am_cert_agent, trusted, token=None)
    assert (resp.status, json.loads(resp.body)["accepted"]) == (200, 1)
    for refused in (client_context(pki), client_context(pki, pki.rogue_client_cert, pki.rogue_client_key)):
        with pytest.raises(REFUSED):
            post_alerts(am_cert_agent, refused, token=None)


def test_with_a_token_too_the_receiver_needs_both(am_both_agent: AgentProcess, pki: Pki) -> None:
    trusted = client_context(pki, pki.client_cert, pki.client_key)
    full_scrape(am_both_agent, trusted)
    assert post_alerts(am_both_agent, trusted, token=None).status == 401
    assert post_alerts(am_both_agent, trusted, token="not-it").status == 401
    assert post_alerts(am_both_agent, trusted, token=AM_TOKEN).status == 200
    with pytest.raises(REFUSED):
        post_alerts(am_both_agent, client_context(pki), token=AM_TOKEN)
