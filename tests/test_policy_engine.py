"""The policy engine (storwatch/policy/engine.py): for, keep_firing_for and cooldown as Prometheus's alerting rules
have them, per (rule, kind, key); a rule over its time budget disabled with its reason; state kept across a reload
for unchanged rules; the status and metrics it gives. Time is the View's, given to each evaluation; the timer that
measures evaluations is injected where the budget is what is tested."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from storwatch.actions.base import Entity, EntityKind
from storwatch.exporter.policy import families
from storwatch.exporter.text import render_text
from storwatch.policy.engine import Engine
from storwatch.policy.load import Policy, parse_policy

T0 = 1_800_000_000.0


def policy(rules: str, lists: str = "") -> Policy:
    return parse_policy([("p.yaml", f"{lists}rules:\n{rules}")])


def mount(key: str, stuck: bool, **more: object) -> Entity:
    return Entity("mount", key, {"mountpoint": key, "stuck": stuck, "stuck_seconds": 5.0, "fstype": "nfs4", **more})


def of(*ents: Entity) -> dict[EntityKind, list[Entity]]:
    out: dict[EntityKind, list[Entity]] = {}
    for e in ents:
        out.setdefault(e.kind, []).append(e)
    return out


def run(engine: Engine, steps: list[tuple[float, dict[EntityKind, list[Entity]]]]) -> list[tuple[float, str, str]]:
    """(time offset, entity key, transition) of every request, in order."""
    out = []
    for t, ents in steps:
        out += [(t, r.entity.key, r.transition) for r in engine.evaluate(ents, T0 + t)]
    return out


STUCK = """\
  - name: stuck
    on: mount
    when: stuck
    for: 2m
    keep_firing_for: 3m
    severity: critical
    labels: {team: storage}
    message: "{mountpoint} stuck for {stuck_seconds}"
    actions: [{action: log}, {action: event, params: {reason: Stuck}}]
"""


def test_for_holds_firing_back_until_the_condition_held_that_long() -> None:
    engine = Engine(policy(STUCK))
    a = mount("/a", True)
    assert run(engine, [(0, of(a)), (60, of(a))]) == []
    (active,) = engine.status().active
    assert (active.state, active.since, active.announced) == ("pending", T0, False)
    requests = engine.evaluate(of(a), T0 + 120)
    assert [(r.action, r.transition, r.severity, dict(r.labels), r.message, r.at) for r in requests] == [
        ("log", "firing", "critical", {"team": "storage"}, "/a stuck for 5 s", T0 + 120),
        ("event", "firing", "critical", {"team": "storage"}, "/a stuck for 5 s", T0 + 120),
    ]
    assert requests[1].params == {"reason": "Stuck"} and requests[0].entity is a
    (active,) = engine.status().active
    assert (active.state, active.since, active.announced) == ("firing", T0 + 120, True)


def test_pending_that_stops_holding_is_forgotten_without_a_word() -> None:
    engine = Engine(policy(STUCK))
    a = mount("/a", True)
    assert run(engine, [(0, of(a)), (60, of(mount("/a", False))), (120, of(a)), (180, of(a))]) == []
    (active,) = engine.status().active
    assert (active.state, active.since) == ("pending", T0 + 120)  # the for counts again from when it held again
    assert run(engine, [(240, of(a))]) == [(240, "/a", "firing")] * 2


def test_keep_firing_for_holds_a_firing_entity_after_it_stops_then_resolves() -> None:
    engine = Engine(policy(STUCK))
    a, fine = mount("/a", True), mount("/a", False)
    events = run(
        engine,
        [(0, of(a)), (120, of(a)), (180, of(fine)), (300, of(fine)), (340, of(a)), (400, of(fine)), (580, of(fine))],
    )
    # fires at 120; stops holding at 180, still firing at 300 (120 s < 180 s kept); holds again at 340 (the count
    # starts over); stops at 400, resolved at 580 (180 s after 400)
    assert events == [(120, "/a", "firing")] * 2 + [(580, "/a", "resolved")] * 2
    assert engine.status().active == ()


def test_an_entity_that_is_gone_counts_as_not_holding() -> None:
    engine = Engine(policy(STUCK))
    a = mount("/a", True)
    events = run(engine, [(0, of(a)), (120, of(a)), (200, of()), (379, of()), (380, of())])
    assert events == [(120, "/a", "firing")] * 2 + [(380, "/a", "resolved")] * 2
    (resolved,) = [r for r in engine.evaluate(of(a), T0 + 400)] or [None]  # pending again, nothing sent
    assert resolved is None


COOLDOWN = """\
  - name: stuck
    on: mount
    when: stuck
    cooldown: 10m
    actions: [{action: log}]
"""


def test_cooldown_repeats_while_firing_and_holds_back_a_new_firing_within_it() -> None:
    engine = Engine(policy(COOLDOWN))
    a, fine = mount("/a", True), mount("/a", False)
    steps = [(t, of(a)) for t in range(0, 1260, 60)]
    events = run(engine, steps)
    assert events == [(0, "/a", "firing"), (600, "/a", "repeat"), (1200, "/a", "repeat")]
    # resolves at 1260; fires again at 1320, within 10 min of the last run (1200): held back until 1800
    events = run(engine, [(1260, of(fine)), *[(t, of(a)) for t in range(1320, 1860, 60)]])
    assert events == [(1260, "/a", "resolved"), (1800, "/a", "firing")]
    assert [(x.state, x.since) for x in engine.status().active] == [("firing", T0 + 1320)]


def test_without_a_cooldown_actions_run_on_firing_and_resolving_only() -> None:
    engine = Engine(policy(COOLDOWN.replace("    cooldown: 10m\n", "")))
    a, fine = mount("/a", True), mount("/a", False)
    events = run(engine, [(t, of(a)) for t in range(0, 7200, 60)] + [(7200, of(fine)), (7260, of(a))])
    assert events == [(0, "/a", "firing"), (7200, "/a", "resolved"), (7260, "/a", "firing")]


ASK = """\
  - name: ask
    on: mount
    when: stuck
    actions: [{action: log}, {action: request_checkpoint}]
"""


def test_an_action_refused_for_its_rate_is_asked_again_while_it_fires() -> None:
    """A rule without a cooldown announces a firing once: the action the runner refused for its rate is owed, asked
    again (``deferred``, alone) at every evaluation until it is taken, and a resolution leaves out the action whose
    firing never went out."""
    engine = Engine(policy(ASK))
    a = mount("/a", True)
    log, ask = engine.evaluate(of(a), T0)
    assert (log.action, ask.action, ask.transition, ask.deferred) == ("log", "request_checkpoint", "firing", False)
    assert engine.owe(ask)
    for t in (10, 20):
        (again,) = engine.evaluate(of(a), T0 + t)
        assert (again.action, again.transition, again.deferred, again.at) == ("request_checkpoint", "firing", True,
                                                                            T0 + t)  # fmt: skip
        assert engine.owe(again)  # refused again
    assert [r.action for r in engine.evaluate(of(a), T0 + 30)] == ["request_checkpoint"]
    # Taken this time (not owed): nothing more while it fires.
    assert engine.evaluate(of(a), T0 + 40) == []
    # Refused once more at 50 and resolved at 60 before it was taken: only the log's firing is resolved.
    b = mount("/b", True)
    _, ask_b = engine.evaluate(of(a, b), T0 + 50)
    assert engine.owe(ask_b)
    resolved = engine.evaluate(of(), T0 + 60)
    assert [(r.entity.key, r.action, r.transition) for r in resolved] == [
        ("/a", "log", "resolved"),
        ("/a", "request_checkpoint", "resolved"),
        ("/b", "log", "resolved"),
    ]
    # Nothing is owed to an entity that no longer fires, nor to a rule that is gone.
    assert not engine.owe(ask_b)
    assert not Engine(policy(STUCK)).owe(ask)


def test_a_resolution_refused_for_its_rate_is_owed_until_taken_or_firing_again() -> None:
    engine = Engine(policy(ASK))
    a, b = mount("/a", True), mount("/b", True)
    engine.evaluate(of(a, b), T0)
    resolved = engine.evaluate(of(), T0 + 10)
    assert len(resolved) == 4
    for r in resolved:
        if r.action == "request_checkpoint":
            assert engine.owe(r)
    again = engine.evaluate(of(), T0 + 20)
    assert [(r.entity.key, r.action, r.transition, r.deferred) for r in again] == [
        ("/a", "request_checkpoint", "resolved", True),
        ("/b", "request_checkpoint", "resolved", True),
    ]
    for r in again:
        assert engine.owe(r)
    # /a fires again before its resolution was taken: that resolution is dropped; /b's is still owed.
    out = engine.evaluate(of(a), T0 + 30)
    assert [(r.entity.key, r.action, r.transition) for r in out] == [
        ("/a", "log", "firing"),
        ("/a", "request_checkpoint", "firing"),
        ("/b", "request_checkpoint", "resolved"),
    ]


def test_a_repeat_due_asks_an_undelivered_firing_as_a_firing() -> None:
    engine = Engine(policy(ASK + "    cooldown: 5m\n"))
    a = mount("/a", True)
    _, ask = engine.evaluate(of(a), T0)
    assert engine.owe(ask)
    (again,) = engine.evaluate(of(a), T0 + 60)
    assert engine.owe(again)
    out = engine.evaluate(of(a), T0 + 300)
    assert [(r.action, r.transition, r.deferred) for r in out] == [
        ("log", "repeat", False),
        ("request_checkpoint", "firing", True),
    ]


def test_state_is_per_entity() -> None:
    engine = Engine(policy(STUCK))
    a, b = mount("/a", True), mount("/b", True)
    events = run(engine, [(0, of(a)), (60, of(a, b)), (120, of(a, b)), (180, of(a, b))])
    assert events == [(120, "/a", "firing")] * 2 + [(180, "/b", "firing")] * 2
    assert engine.status().rules[0].firing == 2


def test_dry_run_and_a_disabled_rule() -> None:
    engine = Engine(
        policy(
            COOLDOWN + "    dry_run: true\n" + COOLDOWN.replace("name: stuck", "name: quiet") + "    enabled: false\n"
        )
    )
    (request,) = engine.evaluate(of(mount("/a", True)), T0)
    assert (request.rule, request.dry_run) == ("stuck", True)
    off = engine.status().rules[1]
    assert (off.name, off.enabled, off.evaluations_total) == ("quiet", False, 0)


def test_an_evaluation_error_is_counted_and_the_entity_does_not_match() -> None:
    engine = Engine(policy("  - name: late\n    on: run\n    when: recovery_point_seconds > 3600.0\n"))
    ents = of(
        Entity("run", "r", {"recovery_point_seconds": None}), Entity("run", "s", {"recovery_point_seconds": 7200.0})
    )
    engine.evaluate(ents, T0)
    engine.evaluate(ents, T0 + 60)
    (rule,) = engine.status().rules
    assert (rule.errors_total, rule.firing, rule.evaluations_total) == (2, 1, 4)
    assert rule.last_error is not None and rule.last_error.startswith("run r: ")


class Ticks:
    """A timer that advances a fixed step each time it is read: an evaluation takes ``step / 2`` seconds."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step / 2
        return self.now


def test_a_rule_over_its_budget_is_disabled_with_the_reason() -> None:
    node = "  - name: other\n    on: node\n    when: ready\n    actions: [{action: log}]\n"
    engine = Engine(policy(STUCK.replace("for: 2m", "for: 0s") + node), budget_seconds=0.025, timer=Ticks(0.02))
    mounts = [mount(f"/m{i}", True) for i in range(5)]
    requests = engine.evaluate(of(*mounts, Entity("node", "node", {"ready": True})), T0)  # 10 ms an evaluation
    slow = engine.status().rules[0]
    assert slow.disabled_reason == (
        "its evaluations over one View took 30.0 ms after 3 of 5 mount entities, over its budget of 25 ms: disabled "
        "until the policy is reloaded"
    )
    assert slow.firing == 0 and slow.evaluations_total == 3
    assert {r.rule for r in requests} == {"other"}  # the rules after it are evaluated as before, each its own budget
    assert engine.status().rules[1].disabled_reason is None
    assert engine.evaluate(of(*mounts, Entity("node", "node", {"ready": True})), T0 + 60) == []
    metrics = engine.status().metrics()
    assert metrics.rules["stuck"].disabled


def test_a_real_slow_rule_is_disabled() -> None:
    """A comprehension over the longest list at the bounds, over many entities, against a budget below what it
    takes on any machine."""
    text = "  - name: slow\n    on: gpu\n    when: workloads.exists(w, w.startsWith('ns/') && w.endsWith('x'))\n"
    engine = Engine(policy(text), budget_seconds=1e-9)
    gpus = [Entity("gpu", str(i), {"workloads": tuple(f"ns/pod-{j}" for j in range(64))}) for i in range(50)]
    engine.evaluate(of(*gpus), T0)
    (rule,) = engine.status().rules
    assert rule.disabled_reason is not None and "after 1 of 50 gpu entities" in rule.disabled_reason


def test_a_reload_keeps_the_state_of_unchanged_rules_only() -> None:
    other = STUCK.replace("name: stuck", "name: also")
    engine = Engine(policy(STUCK + other))
    a = mount("/a", True)
    run(engine, [(0, of(a)), (60, of(a))])
    # reloaded with 'stuck' unchanged and 'also' changed (a longer for): 'stuck' fires at 120 as it would have;
    # 'also' starts afresh, pending from 120
    engine.load(policy(STUCK + other.replace("for: 2m", "for: 3m")))
    assert run(engine, [(120, of(a))]) == [(120, "/a", "firing")] * 2
    assert {(x.rule, x.state, x.since) for x in engine.status().active} == {
        ("stuck", "firing", T0 + 120),
        ("also", "pending", T0 + 120),
    }
    engine.load(policy(other))  # 'stuck' gone with its state
    assert [r.name for r in engine.status().rules] == ["also"]
    assert engine.status().active == ()


def test_a_failed_reload_is_kept_for_status_and_metrics() -> None:
    engine = Engine(policy(STUCK))
    engine.load_failed(["p.yaml:3: rules[0].on: 'disk' is not one of mount"])
    status = engine.status()
    assert (status.last_reload_success, status.reloads_failed_total) == (False, 1)
    assert [r.name for r in status.rules] == ["stuck"]  # the policy in force stays
    engine.load(policy(STUCK))
    assert engine.status().last_reload_success


def lines(text: str) -> Iterator[str]:
    return (line for line in text.splitlines() if not line.startswith("#"))


def test_the_metrics_of_a_status() -> None:
    engine = Engine(policy(STUCK.replace("for: 2m", "for: 0s")))
    engine.evaluate(of(mount("/a", True), mount("/b", True)), T0)
    engine.load_failed(["bad"])
    text = render_text(families(engine.status().metrics({("stuck", "log", "ok"): 2, ("stuck", "event", "failed"): 1})))
    assert list(lines(text.decode())) == [
        'storwatch_policy_rule_firing{rule="stuck",severity="critical"} 2.0',
        'storwatch_policy_rule_errors_total{rule="stuck"} 0.0',
        'storwatch_policy_rule_disabled{rule="stuck"} 0.0',
        "storwatch_policy_last_reload_success 0.0",
        'storwatch_policy_actions_total{action="event",result="failed",rule="stuck"} 1.0',
        'storwatch_policy_actions_total{action="log",result="ok",rule="stuck"} 2.0',
    ]


@pytest.mark.parametrize("kind", ["mount", "run", "gpu", "workload", "finding", "node", "alert"])
def test_a_default_message_names_the_entity(kind: EntityKind) -> None:
    from storwatch.policy.schema import SCHEMA

    fields = {f.name: None for f in SCHEMA[kind].fields}
    p = policy(f"  - name: any\n    on: {kind}\n    when: 'true'\n    actions: [{{action: log}}]\n")
    (request,) = Engine(p).evaluate({kind: [Entity(kind, "k", fields)]}, T0)
    assert request.message == f"any: {kind} k"


def test_the_catalogs_policy_values_are_the_policys() -> None:
    """The exporter sits below the policy and the actions, so the catalog spells their sets out: held equal here."""
    from storwatch.actions.base import OUTCOMES, SEVERITIES
    from storwatch.exporter import policy as catalog  # the policy area declares its metrics and their values
    from storwatch.policy.load import MAX_RULES, RULE_NAME

    assert catalog.POLICY_SEVERITIES == SEVERITIES
    assert catalog.ACTION_OUTCOMES == OUTCOMES
    assert catalog.MAX_POLICY_RULES == MAX_RULES
    assert RULE_NAME.pattern.endswith("{0,63}")  # "each name at most 64 letters...", as the label's bound says


def ckpt_run(name: str, checkpoint: str, severity: str = "warning") -> Entity:
    return Entity(
        "run", "alice/llm", {"run": "alice/llm", "checkpoint": checkpoint, "complete": 3, "severity": severity}
    )


SYNC_EACH = """\
  - name: copy-each
    on: run
    when: complete > 0
    cooldown: 1h
    repeat_on: [checkpoint]
    actions: [{action: sync}]
"""


def test_repeat_on_asks_again_for_every_newer_value_whatever_the_cooldown() -> None:
    """Three newer checkpoints within the hour of the rule's cooldown: three more copies asked for, and the runner takes
    each (its idempotency counts the value), where the cooldown alone would ask for one an hour."""
    from storwatch.actions.runner import ActionRunner, Limits
    from tests.builders import Recorder

    clock = [T0]
    sync = Recorder("sync")
    runner = ActionRunner({"sync": sync}, clock=lambda: clock[0], limits={"sync": Limits(10.0, 100, 0.0)})
    engine = Engine(policy(SYNC_EACH))
    steps = [(0, "step-100.pt"), (60, "step-100.pt"), (600, "step-200.pt"), (900, "step-200.pt")]
    steps += [(1200, "step-300.pt"), (1800, "step-400.pt"), (2400, "step-400.pt")]
    try:
        for t, checkpoint in steps:
            clock[0] = T0 + t
            for request in engine.evaluate(of(ckpt_run("alice/llm", checkpoint)), T0 + t):
                runner.submit(request)
        assert runner.wait_idle(10)
    finally:
        runner.close()
    asked = [(r.transition, r.entity.fields["checkpoint"], r.at - T0) for r in sync.runs]
    assert asked == [
        ("firing", "step-100.pt", 0),
        ("repeat", "step-200.pt", 600),
        ("repeat", "step-300.pt", 1200),
        ("repeat", "step-400.pt", 1800),
    ]
    # Without repeat_on, the cooldown alone: one copy in that hour.
    engine = Engine(policy(SYNC_EACH.replace("    repeat_on: [checkpoint]\n", "")))
    once = [r for t, c in steps for r in engine.evaluate(of(ckpt_run("alice/llm", c)), T0 + t)]
    assert [(r.transition, r.entity.fields["checkpoint"]) for r in once] == [("firing", "step-100.pt")]


def test_repeat_on_a_firing_held_back_by_the_cooldown_announces_it_when_the_value_changes() -> None:
    engine = Engine(policy(SYNC_EACH.replace("when: complete > 0", "when: complete > 2")))
    gone = Entity("run", "alice/llm", {"run": "alice/llm", "checkpoint": "step-100.pt", "complete": 1})
    steps = [(0, ckpt_run("x", "step-100.pt")), (60, gone), (120, ckpt_run("x", "step-100.pt"))]
    steps += [(180, ckpt_run("x", "step-200.pt"))]
    got = [(t, r.transition) for t, e in steps for r in engine.evaluate(of(e), T0 + t)]
    assert got == [(0, "firing"), (60, "resolved"), (180, "firing")]


def test_a_rule_may_take_each_entitys_own_severity() -> None:
    engine = Engine(policy(SYNC_EACH.replace("    cooldown: 1h\n", '    severity: "{severity}"\n')))
    requests = engine.evaluate(of(ckpt_run("x", "a.pt", "critical")), T0)
    assert [r.severity for r in requests] == ["critical"]
    (active,) = engine.status().active
    assert active.severity == "critical"
    (rule,) = engine.status().rules
    assert rule.severity == "{severity}" and rule.firing_by_severity == {"info": 0, "warning": 0, "critical": 1}
    text = render_text(families(engine.status().metrics())).decode()
    assert [line for line in lines(text) if "rule_firing" in line] == [
        'storwatch_policy_rule_firing{rule="copy-each",severity="critical"} 1.0',
        'storwatch_policy_rule_firing{rule="copy-each",severity="info"} 0.0',
        'storwatch_policy_rule_firing{rule="copy-each",severity="warning"} 0.0',
    ]
    # The severity follows the entity's as it changes (no new firing: the same one, now a warning).
    assert engine.evaluate(of(ckpt_run("x", "a.pt", "warning")), T0 + 60) == []
    assert engine.status().active[0].severity == "warning"


def test_the_documented_sync_rule_copies_every_newer_checkpoint() -> None:
    """docs/sync.md's own sync rule ("When the node or a pod goes"), as printed there: three newer checkpoints within
    an hour, three more copies asked for."""
    from tests.docs_text import DOCS, section, yaml_blocks

    text = section(DOCS / "sync.md", "## When the node or a pod goes")
    (block,) = [b for b in yaml_blocks(text) if "action: sync" in b]
    engine = Engine(parse_policy([("docs/sync.md", block)]))
    (rule,) = engine.policy.rules

    def at_risk(checkpoint: str) -> Entity:
        fields = {"run": "alice/llm", "ephemeral": True, "complete": 2, "gpus": 8, "checkpoint": checkpoint}
        return Entity("run", "alice/llm", {**fields, "severity": "critical"})

    steps = [(0, "step-100"), (300, "step-100"), (900, "step-200"), (1500, "step-300"), (2400, "step-400")]
    asked = [
        (t, r.action, r.entity.fields["checkpoint"]) for t, c in steps for r in engine.evaluate(of(at_risk(c)), T0 + t)
    ]
    assert asked == [(0, "sync", "step-100"), (900, "sync", "step-200"), (1500, "sync", "step-300"),
                     (2400, "sync", "step-400")]  # fmt: skip
    assert engine.status().active[0].severity == "critical" and rule.repeat_on == ("checkpoint",)
