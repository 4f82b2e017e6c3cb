"""The log action (the rule's severity as the level, data made printable) and the event action driven through the
official client against the local Kubernetes API (tests/kubeapi.py): an Event about this Node, or about the pod the
entity names, its reason from params or the rule; through the runner, a dry run posts nothing."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from storwatch.actions.base import ActionRequest, Entity, Severity
from storwatch.actions.event import EventAction, reason_from_rule
from storwatch.actions.log import LogAction
from storwatch.actions.runner import ActionRunner
from storwatch.kube.client import KubeClient
from storwatch.kube.events import KubeEvents
from tests.kubeapi import NODE, FakeKubeAPI, fake_kube_api, k8s_node_objects

T0 = 1_800_000_000.0


def request(
    action: str,
    entity: Entity,
    severity: Severity = "warning",
    rule: str = "ephemeral-only",
    **kw: object,
) -> ActionRequest:
    return ActionRequest(rule, action, kw.pop("params", {}), entity, severity, "checkpoints only on node storage", **kw)  # type: ignore[arg-type]


NODE_ENTITY = Entity("node", NODE, {})
POD_RUN = Entity("run", "home/run1", {"namespace": "train", "pod": "trainer-0", "path": "/home/run1"})


@pytest.mark.parametrize(
    ("severity", "transition", "level"),
    [
        ("info", "firing", logging.INFO),
        ("warning", "firing", logging.WARNING),
        ("critical", "repeat", logging.CRITICAL),
        ("critical", "resolved", logging.INFO),
    ],
    ids=["info", "warning", "critical", "resolved"],
)
def test_log_at_the_severity_level_and_printable(
    severity: Severity, transition: str, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="storwatch.policy.actions")
    entity = Entity("mount", "/mnt/\x1b]0;owned\x07x\u202e", {})
    result = LogAction().run(request("log", entity, severity, rule="stuck\nmount", transition=transition), 1)
    assert result.outcome == "ok"
    [record] = caplog.records
    assert record.levelno == level
    assert record.getMessage() == (
        f"rule stuck\\x0amount {transition}: mount /mnt/\\x1b]0;owned\\x07x\\u202e: checkpoints only on node storage"
    )


@pytest.mark.parametrize(
    ("message", "line"),
    [
        ("run home/run1 (trainer, 8 GPUs): 900 s old", "run home/run1 (trainer, 8 GPUs): 900 s old"),
        ("run home/run1: 900 s old", "run home/run1: 900 s old"),
        ("900 s old", "run home/run1: 900 s old"),
        ("run home/run10 is another run", "run home/run1: run home/run10 is another run"),
    ],
    ids=["named-first", "named-colon", "not-named", "another-entity"],
)
def test_the_entity_is_named_once(message: str, line: str, caplog: pytest.LogCaptureFixture) -> None:
    """A rule's message that begins by naming its entity (the default rules' do) is not preceded by the same name."""
    caplog.set_level(logging.DEBUG, logger="storwatch.policy.actions")
    req = ActionRequest("recovery-point-over-budget", "log", {}, POD_RUN, "warning", message)
    assert LogAction().run(req, 1).outcome == "ok"
    [record] = caplog.records
    assert record.getMessage() == f"rule recovery-point-over-budget firing: {line}"


@pytest.mark.parametrize(
    ("rule", "reason"),
    [
        ("ephemeral-only", "EphemeralOnly"),
        ("gpu_stall share", "GpuStallShare"),
        ("9lives", "Rule9lives"),
        ("--", "StorwatchPolicy"),
    ],
    ids=["dashes", "mixed", "digit", "empty"],
)
def test_reason_from_rule(rule: str, reason: str) -> None:
    assert reason_from_rule(rule) == reason


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    with fake_kube_api() as server:
        for obj in k8s_node_objects():
            server.add(obj)
        yield server


@pytest.fixture
def events(api: FakeKubeAPI, tmp_path: Path) -> Iterator[KubeEvents]:
    client = KubeClient(environ={}, kubeconfig=str(api.kubeconfig(tmp_path)), node_name=NODE, request_timeout=(1, 2))
    assert client.enabled, client.off_reason
    yield KubeEvents(client, clock=lambda: T0)
    client.close()


def created(api: FakeKubeAPI) -> list[dict[str, object]]:
    return [r.body for r in api.recorded if r.verb == "create"]


def test_an_event_about_this_node(api: FakeKubeAPI, events: KubeEvents) -> None:
    result = EventAction(events).run(request("event", NODE_ENTITY, "critical"), 10)
    assert result.outcome == "ok" and result.detail == "EphemeralOnly about Node: created"
    [body] = created(api)
    assert body["involvedObject"] == {"kind": "Node", "name": NODE, "apiVersion": "v1"}
    assert body["reason"] == "EphemeralOnly" and body["type"] == "Warning"
    assert body["message"] == "checkpoints only on node storage"


def test_an_event_about_the_entity_pod_with_params(api: FakeKubeAPI, events: KubeEvents) -> None:
    action = EventAction(events)
    params = {"reason": "CheckpointOnEphemeral", "type": "Normal"}
    assert action.check(params) == []
    result = action.run(request("event", POD_RUN, params=params), 10)
    assert result.outcome == "ok" and "about Pod train/trainer-0" in result.detail
    # A repeat patches the count; a resolution is an Event of its own, Normal.
    assert action.run(request("event", POD_RUN, params=params), 10).detail.endswith("patched")
    action.run(request("event", POD_RUN, "critical", transition="resolved"), 10)
    first, resolved = created(api)
    assert first["involvedObject"] == {"kind": "Pod", "name": "trainer-0", "namespace": "train", "apiVersion": "v1"}
    assert first["reason"] == "CheckpointOnEphemeral" and first["type"] == "Normal"
    assert resolved["reason"] == "EphemeralOnlyResolved" and resolved["type"] == "Normal"
    # about: node keeps it on the Node whatever the entity names.
    action.run(request("event", POD_RUN, params={"about": "node"}, rule="other"), 10)
    assert created(api)[-1]["involvedObject"]["kind"] == "Node"  # type: ignore[index]


def test_a_pod_name_that_is_not_a_kubernetes_name_posts_nothing(api: FakeKubeAPI, events: KubeEvents) -> None:
    entity = Entity("run", "r", {"namespace": "train", "pod": "../../nodes/x"})
    result = EventAction(events).run(request("event", entity), 10)
    assert result.outcome == "failed" and "not a Kubernetes pod name" in result.detail
    assert api.recorded == []


def test_refused_by_the_api_and_no_cluster(api: FakeKubeAPI, events: KubeEvents, tmp_path: Path) -> None:
    api.events_status = 403
    result = EventAction(events).run(request("event", NODE_ENTITY), 10)
    assert result.outcome == "failed" and "EphemeralOnly about Node: failed" in result.detail
    assert EventAction(None).run(request("event", NODE_ENTITY), 10).outcome == "skipped"
    offline = KubeEvents(KubeClient(environ={"HOME": str(tmp_path)}))
    result = EventAction(offline).run(request("event", NODE_ENTITY), 10)
    assert result.outcome == "skipped" and result.detail.startswith("no Kubernetes API: ")


def test_through_the_runner_a_dry_run_posts_nothing(api: FakeKubeAPI, events: KubeEvents) -> None:
    runner = ActionRunner({"event": EventAction(events)}, clock=lambda: T0)
    try:
        assert runner.submit(request("event", NODE_ENTITY, dry_run=True)) is None
        assert runner.wait_idle(10)
        assert api.recorded == [] and api.events == {}
        assert runner.counts() == {("ephemeral-only", "event", "dry_run"): 1}
        assert runner.submit(request("event", NODE_ENTITY)) is None
        assert runner.wait_idle(10)
        assert len(created(api)) == 1
        assert runner.counts()[("ephemeral-only", "event", "ok")] == 1
    finally:
        runner.close()


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"reason": "lower"}, "params.reason: must be UpperCamelCase"),
        ({"reason": 5}, "params.reason: must be a string"),
        ({"type": "Error"}, "params.type: must be one of Normal, Warning, auto"),
        ({"about": "pod"}, "params.about: must be one of auto, node"),
        ({"namespace": "x"}, "params.namespace: unknown field"),
    ],
    ids=["reason-case", "reason-type", "type", "about", "unknown"],
)
def test_event_params_checked(params: dict[str, object], error: str) -> None:
    assert any(e.startswith(error) for e in EventAction(None).check(params))
