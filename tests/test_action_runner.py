"""The action runner: idempotent within a rule's cooldown, rate-limited per action, dry runs logged and counted with
nothing done, a hung action never blocking a submission nor another action, and the counts and last results the
policy's metrics and /status read."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping

import pytest

from storwatch.actions.base import ActionRequest, ActionResult, Entity
from storwatch.actions.log import LogAction
from storwatch.actions.registry import ACTION_NAMES, checks, registry
from storwatch.actions.runner import ActionRunner, Limits
from tests.builders import Recorder

T0 = 1_800_000_000.0


def req(rule: str = "r1", key: str = "/mnt/a", **kw: object) -> ActionRequest:
    fields: dict[str, object] = {"action": "record", "cooldown": 300.0, "at": T0}
    fields.update(kw)
    return ActionRequest(
        rule=rule,
        action=str(fields.pop("action")),
        params=fields.pop("params", {}),  # type: ignore[arg-type]
        entity=Entity("mount", key, {}),
        severity="warning",
        message="m",
        **fields,  # type: ignore[arg-type]
    )


@pytest.fixture
def clock() -> list[float]:
    return [T0]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def runner(recorder: Recorder, clock: list[float]) -> Iterator[ActionRunner]:
    made = ActionRunner(
        {"record": recorder, "log": LogAction()},
        clock=lambda: clock[0],
        limits={"record": Limits(timeout=0.3, burst=100, per_second=0.0)},
    )
    yield made
    recorder.gate.set()
    made.close()


def test_the_same_request_runs_once_within_the_cooldown(
    runner: ActionRunner, recorder: Recorder, clock: list[float]
) -> None:
    assert runner.submit(req()) is None
    assert runner.submit(req()) == "skipped"
    clock[0] += 100
    assert runner.submit(req()) == "skipped"
    # Another transition, entity, rule or params is another request.
    assert runner.submit(req(transition="resolved")) is None
    assert runner.submit(req(key="/mnt/b")) is None
    assert runner.submit(req(rule="r2")) is None
    assert runner.submit(req(params={"url": "x"})) is None
    assert runner.wait_idle(10)
    assert len(recorder.runs) == 5
    # Past the cooldown it runs again; with no cooldown every submission runs.
    clock[0] += 201
    assert runner.submit(req()) is None
    assert runner.submit(req(rule="r3", cooldown=0.0)) is None
    assert runner.submit(req(rule="r3", cooldown=0.0)) is None
    assert runner.wait_idle(10)
    assert len(recorder.runs) == 8
    assert runner.counts()[("r1", "record", "skipped")] == 2
    assert runner.counts()[("r1", "record", "ok")] == 5
    skipped = [r for r in runner.recent() if r.outcome == "skipped"]
    assert skipped[0].detail == "the same request was taken 0 s ago, within the rule's cooldown of 300 s"


def test_a_failed_request_is_tried_again(runner: ActionRunner, recorder: Recorder) -> None:
    recorder.answer = ActionResult("failed", "receiver away")
    assert runner.submit(req()) is None
    assert runner.wait_idle(10)
    recorder.answer = ActionResult("ok")
    assert runner.submit(req()) is None
    assert runner.wait_idle(10)
    assert len(recorder.runs) == 2
    assert runner.counts() == {("r1", "record", "failed"): 1, ("r1", "record", "ok"): 1}


def test_rate_limited_per_action(recorder: Recorder, clock: list[float]) -> None:
    other = Recorder("other")
    runner = ActionRunner(
        {"record": recorder, "other": other},
        clock=lambda: clock[0],
        limits={"record": Limits(5, burst=2, per_second=0.1), "other": Limits(5, burst=2, per_second=0.1)},
    )
    try:
        outcomes = [runner.submit(req(key=f"/m{i}")) for i in range(4)]
        assert outcomes == [None, None, "rate_limited", "rate_limited"]
        # Another action has its own bucket.
        assert runner.submit(req(action="other")) is None
        clock[0] += 10  # one token back
        assert [runner.submit(req(key=f"/n{i}")) for i in range(2)] == [None, "rate_limited"]
        assert runner.wait_idle(10)
        assert len(recorder.runs) == 3 and len(other.runs) == 1
        assert runner.counts()[("r1", "record", "rate_limited")] == 3
    finally:
        runner.close()


def test_dry_run_is_logged_counted_and_does_nothing(
    runner: ActionRunner, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="storwatch.actions.runner")
    assert runner.submit(req(dry_run=True, key="/mnt/\x1b[31mred")) is None
    assert runner.wait_idle(10)
    assert recorder.runs == []
    assert runner.counts() == {("r1", "record", "dry_run"): 1}
    [record] = [r for r in caplog.records if "dry run" in r.getMessage()]
    assert "rule r1 firing: mount /mnt/\\x1b[31mred: m" in record.getMessage()
    assert "\x1b" not in record.getMessage()


def test_a_hung_action_blocks_neither_submissions_nor_other_actions(
    runner: ActionRunner, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="storwatch.policy.actions")
    recorder.gate.clear()
    assert runner.submit(req(key="/hung")) is None
    assert recorder.entered.wait(10)
    # The action is still blocked (its gate closed) while each of these returns.
    assert runner.submit(req(key="/second")) is None
    assert runner.submit(req(action="log", key="/logged")) is None
    assert not recorder.gate.is_set()
    assert runner.wait_idle(20)
    assert not recorder.gate.is_set()  # every result came while the action was still hung
    results = {r.entity_key: r for r in runner.recent()}
    assert results["/logged"].outcome == "ok"
    assert results["/hung"].outcome == "failed" and "did not finish within 0.3 s" in results["/hung"].detail
    assert results["/second"].outcome == "failed" and "has not returned" in results["/second"].detail
    assert any("/logged" in r.getMessage() for r in caplog.records)
    assert [r.entity.key for r in recorder.runs] == ["/hung"]
    # Once it returns, the lane runs again (the first tries may still find it returning).
    recorder.gate.set()
    for attempt in range(100):
        assert runner.submit(req(key=f"/after-{attempt}")) is None
        assert runner.wait_idle(10)
        if runner.recent()[-1].outcome == "ok":
            break
        time.sleep(0.05)
    assert runner.recent()[-1].outcome == "ok"


def test_a_full_queue_drops_and_counts(recorder: Recorder, clock: list[float]) -> None:
    runner = ActionRunner(
        {"record": recorder}, clock=lambda: clock[0], limits={"record": Limits(5, 100, 0.0)}, queue_size=2
    )
    try:
        recorder.gate.clear()
        assert runner.submit(req(key="/0")) is None
        assert recorder.entered.wait(10)
        assert [runner.submit(req(key=f"/{i}")) for i in range(1, 4)] == [None, None, "skipped"]
        assert runner.recent()[-1].detail == "2 record requests waiting"
        recorder.gate.set()
        assert runner.wait_idle(20)
        assert len(recorder.runs) == 3
    finally:
        runner.close()


def test_unknown_action_and_history_bound(clock: list[float]) -> None:
    runner = ActionRunner({}, clock=lambda: clock[0], history=3)
    for i in range(5):
        assert runner.submit(req(key=f"/{i}")) == "failed"
    assert [r.entity_key for r in runner.recent()] == ["/2", "/3", "/4"]
    assert runner.recent()[-1].detail == "no action named record"
    runner.close()
    assert runner.submit(req(action="x")) == "failed"


def test_the_registry_names_every_action_and_its_check() -> None:
    actions = registry()
    assert tuple(actions) == ACTION_NAMES
    assert all(actions[name].name == name for name in actions)
    found = checks()
    assert set(found) == set(ACTION_NAMES)
    assert found["log"]({}) == [] and found["log"]({"x": 1}) == ["params.x: unknown field (this action takes: none)"]
    assert found["webhook"]({}) == ["params.url: required"]
    assert found["event"]({"reason": "not camel"})[0].startswith("params.reason: must be UpperCamelCase")
    assert found["request_checkpoint"]({"signal": True}) == []


def owned(owner: str | None, key: str, rule: str = "r1", **kw: object) -> ActionRequest:
    made = req(rule=rule, key=key, cooldown=0.0, **kw)
    return dataclasses.replace(made, entity=Entity("run", key, {}, owner=owner))


def test_one_owners_entities_cannot_use_up_another_owners_budget(recorder: Recorder, clock: list[float]) -> None:
    """Tenant a's six runs ask first: they get the owner's budget (two), the action's own tokens are left for
    tenant b, whose request goes at once; a refused request took nothing of any budget."""
    runner = ActionRunner(
        {"record": recorder},
        clock=lambda: clock[0],
        limits={"record": Limits(5, burst=5, per_second=0.0, owner_burst=2, owner_per_second=0.0)},
    )
    try:
        outcomes = [runner.submit(owned("uid:1001", f"a/run{i}")) for i in range(6)]
        assert outcomes == [None, None] + ["rate_limited"] * 4
        assert runner.submit(owned("uid:1002", "b/run")) is None
        # Nothing of the action's bucket went to a's refusals: two more owners still get theirs.
        assert runner.submit(owned("namespace:c", "c/run")) is None
        assert runner.submit(owned("namespace:d", "d/run")) is None
        assert runner.submit(owned("namespace:e", "e/run")) == "rate_limited"  # the action's own five are spent
        assert runner.wait_idle(10)
        assert sorted(r.entity.key for r in recorder.runs) == ["a/run0", "a/run1", "b/run", "c/run", "d/run"]
        refused = [r for r in runner.recent() if r.outcome == "rate_limited"]
        assert refused[0].detail == (
            "the entities of uid:1001 may have record 2 times at once, 0 a second after: asked again when tokens return"
        )
        assert refused[-1].detail == "record is limited to 5 at once, 0 a second after: asked again when tokens return"
    finally:
        runner.close()


def test_one_rule_cannot_use_up_what_another_rule_needs(recorder: Recorder, clock: list[float]) -> None:
    runner = ActionRunner(
        {"record": recorder},
        clock=lambda: clock[0],
        limits={"record": Limits(5, burst=4, per_second=0.0, rule_burst=2, rule_per_second=0.5)},
    )
    try:
        assert [runner.submit(owned(None, f"/m{i}", rule="noisy")) for i in range(4)] == [None, None] + [
            "rate_limited"
        ] * 2
        assert runner.submit(owned(None, "/m0", rule="critical")) is None
        clock[0] += 2  # one of the noisy rule's tokens is back
        assert runner.submit(owned(None, "/m2", rule="noisy")) is None
        assert runner.submit(owned(None, "/m3", rule="noisy")) == "rate_limited"
        assert runner.wait_idle(10)
        assert runner.counts()[("noisy", "record", "rate_limited")] == 3
        assert next(r.detail for r in runner.recent() if r.outcome == "rate_limited").startswith(
            "rule noisy may ask record 2 times at once, 0.5 a second after"
        )
    finally:
        runner.close()


def test_a_request_refused_for_its_rate_is_handed_back_and_counted_once(recorder: Recorder, clock: list[float]) -> None:
    """The engine takes the refused requests back to ask again while its rule fires: a request asked again and refused
    again is handed back again but not counted again; once tokens return it runs. One the action itself refuses for
    its rate (the Events writer's own bucket) is handed back too, and is no idempotent repeat when asked again."""
    runner = ActionRunner({"record": recorder}, clock=lambda: clock[0], limits={"record": Limits(5, 1, 0.1)})
    try:
        assert runner.submit(req(key="/a")) is None
        first = req(key="/b")
        assert runner.submit(first) == "rate_limited"
        assert runner.take_refused() == [first]
        assert runner.take_refused() == []
        again = dataclasses.replace(first, deferred=True)
        assert runner.submit(again) == "rate_limited"
        assert runner.take_refused() == [again]
        assert runner.counts()[("r1", "record", "rate_limited")] == 1
        clock[0] += 10
        assert runner.submit(again) is None
        assert runner.wait_idle(10)
        assert [r.entity.key for r in recorder.runs] == ["/a", "/b"]
        # Refused by the action itself, at run time.
        recorder.answer = ActionResult("rate_limited", "the Events writer's own bucket is empty")
        clock[0] += 10
        assert runner.submit(req(key="/c")) is None
        assert runner.wait_idle(10)
        [handed] = runner.take_refused()
        assert handed.entity.key == "/c"
        recorder.answer = ActionResult("ok")
        clock[0] += 10
        assert runner.submit(dataclasses.replace(handed, deferred=True)) is None  # not "skipped" within its cooldown
        assert runner.wait_idle(10)
        assert [r.entity.key for r in recorder.runs] == ["/a", "/b", "/c", "/c"]
    finally:
        runner.close()


class Laned(Recorder):
    """A recorder whose requests go where their ``to`` param says (as a webhook's go to its receiver)."""

    def lane(self, params: Mapping[str, object]) -> str:
        return str(params.get("to", ""))


def test_lanes_per_destination_are_bounded(clock: list[float]) -> None:
    """Each destination has its own lane, at most ``max_lanes``; past it, while every lane is busy, the rest share
    one more lane, and once a lane is idle it makes room for a new destination."""
    laned = Laned()
    runner = ActionRunner(
        {"record": laned}, clock=lambda: clock[0], limits={"record": Limits(5, 100, 0.0)}, max_lanes=2
    )
    try:
        laned.gate.clear()
        for to in ("a", "b", "c", "d"):
            assert runner.submit(req(key=f"/{to}", params={"to": to})) is None
        assert runner.lanes() == {"record": ["a", "b", "*"]}
        laned.gate.set()
        assert runner.wait_idle(20)
        assert runner.submit(req(key="/e", params={"to": "e"})) is None
        assert runner.wait_idle(20)
        assert runner.lanes() == {"record": ["b", "*", "e"]}
        assert sorted(r.entity.key for r in laned.runs) == ["/a", "/b", "/c", "/d", "/e"]
    finally:
        laned.gate.set()
        runner.close()
