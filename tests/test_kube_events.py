"""The Kubernetes Events action, driven through the official client against the local API server (tests/kubeapi.py):
real HTTP, real create and merge-patch requests. Deduplication, rate limit, every failure path, and one client shared
with the kube source."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3

from storwatch.kube.client import NO_CREDENTIALS, KubeClient, parse_time
from storwatch.kube.events import KubeEvents
from storwatch.sources.kube import KubeSource
from tests.kubeapi import NODE, FakeKubeAPI, fake_kube_api, k8s_node_objects

T0 = 1_800_000_000.0


def wait_for(what: Callable[[], bool], timeout: float) -> None:
    start = time.monotonic()
    while not what():
        if time.monotonic() - start > timeout:
            pytest.fail(f"not within {timeout} s")
        time.sleep(0.02)


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    with fake_kube_api() as server:
        for obj in k8s_node_objects():
            server.add(obj)
        yield server


@pytest.fixture
def client(api: FakeKubeAPI, tmp_path: Path) -> Iterator[KubeClient]:
    c = KubeClient(environ={}, kubeconfig=str(api.kubeconfig(tmp_path)), node_name=NODE, request_timeout=(1.0, 2.0))
    assert c.enabled, c.off_reason
    yield c
    c.close()


def test_events_deduplicated_and_rate_limited(api: FakeKubeAPI, client: KubeClient) -> None:
    now = [T0]
    events = KubeEvents(client, clock=lambda: now[0], burst=4, per_second=1 / 600)
    assert events.post("CheckpointOnEphemeral", "newest checkpoint is on node storage") == "created"
    now[0] += 60
    assert events.post("CheckpointOnEphemeral", "still on node storage") == "patched"
    assert events.post("DrainBeforeCheckpoint", "drain", kind="Pod", name="trainer-0", namespace="train") == "created"
    assert events.post("CheckpointOnEphemeral", "again") == "patched"
    assert events.post("CheckpointOnEphemeral", "too many") == "rate-limited"
    (created_node, created_pod) = [r for r in api.recorded if r.verb == "create"]
    patches = [r for r in api.recorded if r.verb == "patch"]
    assert created_node.namespace == "default" and created_node.body["involvedObject"]["name"] == NODE
    assert created_node.body["involvedObject"]["kind"] == "Node"
    assert created_node.body["source"] == {"component": "storwatch", "host": NODE}
    # The timestamps are RFC 3339, in UTC.
    assert parse_time(created_node.body["firstTimestamp"]) == T0
    assert created_pod.namespace == "train" and created_pod.body["involvedObject"]["kind"] == "Pod"
    assert created_pod.body["involvedObject"]["namespace"] == "train"
    assert [p.body["count"] for p in patches] == [2, 3]
    assert [p.body["message"] for p in patches] == ["still on node storage", "again"]
    assert {p.name for p in patches} == {created_node.name}
    assert api.events[("default", created_node.name)]["count"] == 3
    assert parse_time(api.events[("default", created_node.name)]["lastTimestamp"]) == T0 + 60
    # "too many" was rate-limited: nothing was sent for it.
    assert len(api.recorded) == 4
    # After 10 minutes the same finding is a new Event (and the bucket has refilled).
    now[0] += 601
    assert events.post("CheckpointOnEphemeral", "later") == "created"
    assert len([r for r in api.recorded if r.verb == "create"]) == 3


def test_no_cluster_every_post_is_disabled_and_sends_nothing(tmp_path: Path) -> None:
    client = KubeClient(environ={"HOME": str(tmp_path)})
    assert not client.enabled and client.off_reason == NO_CREDENTIALS
    events = KubeEvents(client)
    assert [events.post("R", "m") for _ in range(3)] == ["disabled"] * 3


def test_refused_is_failed_logged_and_not_remembered(
    api: FakeKubeAPI, client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="storwatch.kube.events")
    events = KubeEvents(client, clock=lambda: T0)
    api.events_status = 403  # the agent's ClusterRole lacks create on events
    assert events.post("CheckpointOnEphemeral", "m") == "failed"
    assert api.events == {}
    [record] = caplog.records
    assert "CheckpointOnEphemeral" in record.getMessage() and "403" in record.getMessage()
    # Nothing was remembered of the failed post: allowed again, it creates rather than patches.
    api.events_status = None
    assert events.post("CheckpointOnEphemeral", "m") == "created"
    # A patch refused is a failure too, and the count on the server stays.
    api.events_status = 500
    assert events.post("CheckpointOnEphemeral", "m") == "failed"
    api.events_status = None
    assert [e["count"] for e in api.events.values()] == [1]
    assert events.post("CheckpointOnEphemeral", "m") == "patched"
    assert [e["count"] for e in api.events.values()] == [2]


def test_a_long_error_answer_is_read_only_in_part_and_its_connection_not_reused(
    api: FakeKubeAPI, client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="storwatch.kube.events")
    events = KubeEvents(client, clock=lambda: T0)
    api.events_status, api.refusal_message = 500, " x" * 16_000_000  # a 32 MB answer
    assert events.post("CheckpointOnEphemeral", "m") == "failed"
    [record] = caplog.records
    assert "500" in record.getMessage() and len(record.getMessage()) < 1000
    # The rest of that answer was never read: the client closed the connection, and the next request has a new one.
    deadline = time.monotonic() + 30  # the server's write ends when the client closes: a bound against hanging
    while not api.refusals_read_whole and time.monotonic() < deadline:
        time.sleep(0.02)
    assert api.refusals_read_whole == [False]
    api.events_status, api.refusal_message = None, ""
    assert events.post("CheckpointOnEphemeral", "m") == "created"
    assert [e["count"] for e in api.events.values()] == [1]


def test_api_away_fails_and_every_request_carries_the_client_timeouts(
    api: FakeKubeAPI, client: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An API that is away makes the post fail, not wait: every request it made was bounded by the client's
    (connect, read) timeouts, so none can wait longer on an API that accepts and never answers."""
    timeouts: list[Any] = []
    urlopen = urllib3.connectionpool.HTTPConnectionPool.urlopen

    def recorded_urlopen(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        timeouts.append(kwargs.get("timeout"))
        return urlopen(self, method, url, *args, **kwargs)

    monkeypatch.setattr(urllib3.connectionpool.HTTPConnectionPool, "urlopen", recorded_urlopen)
    events = KubeEvents(client, clock=lambda: T0)
    api.go_away(30)
    assert events.post("CheckpointOnEphemeral", "m") == "failed"
    connect, read = client.request_timeout
    assert timeouts and all(
        isinstance(t, urllib3.Timeout) and (t.connect_timeout, t.read_timeout) == (connect, read) for t in timeouts
    ), timeouts


def test_an_event_deleted_since_is_created_again(api: FakeKubeAPI, client: KubeClient) -> None:
    now = [T0]
    events = KubeEvents(client, clock=lambda: now[0])
    assert events.post("CheckpointOnEphemeral", "first") == "created"
    [(namespace, name)] = api.events
    api.delete_event(namespace, name)
    now[0] += 30
    assert events.post("CheckpointOnEphemeral", "second") == "created"
    [(_, new_name)] = api.events
    assert new_name != name
    assert api.events[(namespace, new_name)]["count"] == 1
    assert api.events[(namespace, new_name)]["message"] == "second"
    assert [m for m, path in api.requests if "/events" in path] == ["POST", "PATCH", "POST"]
    # Later repeats patch the new one.
    assert events.post("CheckpointOnEphemeral", "third") == "patched"
    assert api.events[(namespace, new_name)]["count"] == 2


def test_source_and_events_share_one_client(api: FakeKubeAPI, client: KubeClient) -> None:
    source = KubeSource(client=client)
    assert source.client is client and source.node_name == NODE
    events = KubeEvents(source.client, clock=lambda: T0)
    try:
        source.start()
        wait_for(lambda: source.collect().api_up, 5)
        assert source.collect().node is not None
        assert events.post("NodeDraining", "drain") == "created"
    finally:
        source.close()
    # The source did not make the client, so it left it open for the action.
    assert events.post("NodeDraining", "drain again") == "patched"
