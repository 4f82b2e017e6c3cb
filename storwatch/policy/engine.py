"""The policy engine: each rule's condition over the entities of a View, with state per (rule, kind, key) kept from
one evaluation to the next, and the action requests that state's transitions make.

States follow Prometheus's alerting rules: an entity whose condition holds is *pending*, and *firing* once it has
held for the rule's ``for``; a firing one stays firing while the condition holds and for ``keep_firing_for`` after it
first stops holding, then resolves. An entity that is gone counts as not holding. Actions run when an entity starts
firing, again while it fires at most once per ``cooldown`` (never with a cooldown of 0) and whenever one of the
rule's ``repeat_on`` fields changes (a newer checkpoint: whatever the cooldown), and when it resolves (if its firing
was announced); a new firing within ``cooldown`` of the last run is not announced until the cooldown is over.

An action the runner refused for its rate is owed (:meth:`Engine.owe`): asked again (``deferred``) at every
evaluation while its entity still fires, whatever the cooldown, until the runner takes it; a resolution is owed until
it is taken or the entity fires again. A firing never delivered is never resolved: that action's resolution is left
out.

Pure and single-threaded: no threads, no clock of its own (``now`` is the View's time; ``timer`` only measures the
evaluations against each rule's budget), no I/O. A rule whose evaluations over one View take longer than its budget is
disabled with the reason, its states dropped (no resolution is claimed for what is no longer watched), until the
policy is loaded again. A reload keeps the state of each rule whose name and definition are unchanged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from storwatch.actions.base import ENTITY_KINDS, SEVERITIES, ActionRequest, Entity, EntityKind, FieldValue, Severity
from storwatch.exporter.policy import PolicyMetrics, RuleMetrics
from storwatch.policy.cel import EvalError
from storwatch.policy.load import Policy, Rule, render_message

DEFAULT_BUDGET_SECONDS = 0.02
"""A rule's evaluations over one View may take this long; past it the rule is disabled. Each evaluation is bounded by
the expression's static bounds (storwatch.policy.cel), so the budget is overrun by one evaluation at most."""
MAX_LAST_ERROR_CHARS = 300
MAX_OWED_RESOLUTIONS = 4096
"""Resolutions owed per rule (refused for their rate, of entities no longer firing); past it the oldest is dropped."""

StateName = Literal["pending", "firing"]


@dataclass
class _EntityState:
    entity: Entity
    """As last seen (a resolution of one that is gone names it as it was)."""
    pending_since: float
    firing_since: float | None = None
    kept_since: float | None = None
    """When the condition first stopped holding while firing (keep_firing_for counts from it)."""
    announced: bool = False
    """Its firing's actions ran (not held back by the cooldown)."""
    last_run: float | None = None
    """When its firing or repeat actions last ran."""
    revision: str | None = None
    """What its rule's ``repeat_on`` fields held when its actions last ran (or were held back by the cooldown)."""
    owed: dict[int, Literal["firing", "repeat"]] = field(default_factory=dict)
    """Its rule's actions (by index) that the runner refused for their rate, with the transition they carried: asked
    again at the next evaluation while it fires."""


@dataclass
class _RuleState:
    rule: Rule
    entities: dict[tuple[EntityKind, str], _EntityState] = field(default_factory=dict)
    last_run: dict[tuple[EntityKind, str], float] = field(default_factory=dict)
    """When the actions last ran for each entity no longer firing: a new firing within the cooldown waits."""
    owed_resolutions: dict[tuple[EntityKind, str], tuple[Entity, set[int]]] = field(default_factory=dict)
    """Resolutions the runner refused for their rate, by entity (as last seen) and action index."""
    errors_total: int = 0
    last_error: str | None = None
    disabled_reason: str | None = None
    evaluations_total: int = 0
    last_seconds: float = 0.0
    """Time its evaluations took over the last View."""


@dataclass(frozen=True)
class Active:
    """An entity a rule holds pending or firing."""

    rule: str
    kind: EntityKind
    key: str
    state: StateName
    since: float
    """Pending since, or firing since."""
    severity: Severity
    """The rule's severity, or the entity's own (``severity: "{severity}"``)."""
    announced: bool
    """Its actions ran for this firing (False while the cooldown holds them back, and while pending)."""
    message: str


@dataclass(frozen=True)
class RuleStatus:
    name: str
    on: EntityKind
    severity: str
    """Its severity, or ``{FIELD}`` where each entity's own is taken."""
    where: str
    """``FILE:LINE`` of its definition."""
    enabled: bool
    """As the policy says (``enabled: false`` rules are loaded and checked, never evaluated)."""
    disabled_reason: str | None
    """Why the engine stopped evaluating it (over its time budget); None while it runs."""
    dry_run: bool
    firing: int
    pending: int
    firing_by_severity: Mapping[Severity, int]
    """``firing`` by the severity each entity fires with: the rule's one severity (0 included), or for a rule that
    takes each entity's own, every severity."""
    errors_total: int
    """Evaluations that did not give a bool (a null compared, a missing key...), since the agent started."""
    last_error: str | None
    evaluations_total: int
    last_seconds: float


@dataclass(frozen=True)
class PolicyStatus:
    """What /status and the metrics show: every rule, what fires since when, and how the last reload went."""

    rules: tuple[RuleStatus, ...]
    active: tuple[Active, ...]
    """Pending and firing entities, firing first, oldest first."""
    files: tuple[str, ...]
    last_evaluation: float | None
    """The View time of the last evaluation; None before the first."""
    last_reload_success: bool
    reload_errors: tuple[str, ...]
    """The last failed reload's errors (FILE:LINE: FIELD: message); empty after a good one."""
    reloads_failed_total: int

    def metrics(self, actions: Mapping[tuple[str, str, str], int] | None = None) -> PolicyMetrics:
        """The figures storwatch_policy_* are rendered from (storwatch.exporter.policy); ``actions``: the action
        runner's counts by (rule, action, result)."""
        return PolicyMetrics(
            rules={
                r.name: RuleMetrics(
                    {str(k): n for k, n in r.firing_by_severity.items()}, r.errors_total, r.disabled_reason is not None
                )
                for r in self.rules
            },
            last_reload_success=self.last_reload_success,
            actions=dict(actions or {}),
        )


class Engine:
    """Evaluates a policy's rules over entities, View after View (:meth:`evaluate`), and keeps their states."""

    def __init__(
        self,
        policy: Policy | None = None,
        budget_seconds: float = DEFAULT_BUDGET_SECONDS,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``timer``: what measures evaluations against ``budget_seconds`` (injected by tests)."""
        self.budget_seconds = budget_seconds
        self.timer = timer
        self.policy = Policy()
        self._rules: dict[str, _RuleState] = {}
        self._errors_by_name: dict[str, int] = {}
        self.last_evaluation: float | None = None
        self.last_reload_success = True
        self.reload_errors: tuple[str, ...] = ()
        self.reloads_failed_total = 0
        if policy is not None:
            self.load(policy)

    # -- loading

    def load(self, policy: Policy) -> None:
        """Put ``policy`` in force: a rule of the same name and definition as one in force keeps its states; every
        other starts afresh (a slow rule disabled is tried again). Counts a successful reload."""
        old = self._rules
        rules: dict[str, _RuleState] = {}
        for rule in policy.rules:
            kept = old.get(rule.name)
            if kept is not None and kept.rule.definition() == rule.definition():
                kept.rule = rule
                kept.disabled_reason = None
                rules[rule.name] = kept
            else:
                rules[rule.name] = _RuleState(rule, errors_total=self._errors_by_name.get(rule.name, 0))
        self._rules = rules
        self._errors_by_name = {name: s.errors_total for name, s in rules.items()}
        self.policy = policy
        self.last_reload_success = True
        self.reload_errors = ()

    def load_failed(self, errors: Sequence[str]) -> None:
        """A new policy could not be loaded: the one in force stays; the errors are kept for /status, and counted."""
        self.last_reload_success = False
        self.reload_errors = tuple(errors)
        self.reloads_failed_total += 1

    # -- evaluating

    def evaluate(self, entities: Mapping[EntityKind, Sequence[Entity]], now: float) -> list[ActionRequest]:
        """Every enabled rule over the entities of its kind at ``now`` (the View's time); the action requests of the
        transitions, in the order of the rules."""
        requests: list[ActionRequest] = []
        lists: Mapping[str, FieldValue] = self.policy.lists
        for state in self._rules.values():
            rule = state.rule
            if not rule.enabled or state.disabled_reason is not None:
                continue
            requests += self._evaluate_rule(state, entities.get(rule.on, ()), lists, now)
        self.last_evaluation = now
        return requests

    def _evaluate_rule(
        self, state: _RuleState, entities: Sequence[Entity], lists: Mapping[str, FieldValue], now: float
    ) -> list[ActionRequest]:
        rule = state.rule
        spent = 0.0
        holding: set[tuple[EntityKind, str]] = set()
        out: list[ActionRequest] = []
        for done, entity in enumerate(entities):
            start = self.timer()
            try:
                held = rule.expression.evaluate(entity.fields, lists)  # a field hides a list's name
            except EvalError as err:
                held = False
                state.errors_total += 1
                state.last_error = f"{entity.kind} {entity.key}: {err}"[:MAX_LAST_ERROR_CHARS]
            spent += self.timer() - start
            state.evaluations_total += 1
            if spent > self.budget_seconds:
                state.disabled_reason = (
                    f"its evaluations over one View took {spent * 1000:.1f} ms after {done + 1} of {len(entities)} "
                    f"{rule.on} entities, over its budget of {self.budget_seconds * 1000:g} ms: disabled until the "
                    "policy is reloaded"
                )
                state.entities.clear()
                state.last_run.clear()
                state.owed_resolutions.clear()
                state.last_seconds = spent
                self._errors_by_name[rule.name] = state.errors_total
                return []
            if held:
                holding.add((entity.kind, entity.key))
                out += self._held(state, entity, now)
        state.last_seconds = spent
        for key in [k for k in state.entities if k not in holding]:
            out += self._not_held(state, key, now)
        for key, (entity, owed) in list(state.owed_resolutions.items()):
            del state.owed_resolutions[key]
            out += self._requests(state, entity, "resolved", now, owed, deferred=True)
        if rule.cooldown_seconds > 0:
            for key in [k for k, t in state.last_run.items() if now - t >= rule.cooldown_seconds]:
                del state.last_run[key]
        else:
            state.last_run.clear()
        self._errors_by_name[rule.name] = state.errors_total
        return out

    def _held(self, state: _RuleState, entity: Entity, now: float) -> list[ActionRequest]:
        rule = state.rule
        key = (entity.kind, entity.key)
        state.owed_resolutions.pop(key, None)  # it holds again: that resolution would be stale
        s = state.entities.get(key)
        if s is None:
            s = state.entities[key] = _EntityState(entity, pending_since=now)
        s.entity = entity
        s.kept_since = None
        if s.firing_since is None:
            if now - s.pending_since < rule.for_seconds:
                return []
            s.firing_since = now
            last = state.last_run.pop(key, None)
            if last is not None and rule.cooldown_seconds > 0 and now - last < rule.cooldown_seconds:
                s.last_run = last  # held back: announced once the cooldown since that run is over
                s.revision = revision(rule, entity)
                return []
            return self._announce(state, s, "firing", now)
        if rule.repeat_on and revision(rule, entity) != s.revision:
            # A newer value of a repeat_on field (a newer checkpoint): the actions run again, whatever the cooldown.
            return self._announce(state, s, "repeat" if s.announced else "firing", now)
        if s.last_run is not None and rule.cooldown_seconds > 0 and now - s.last_run >= rule.cooldown_seconds:
            return self._announce(state, s, "repeat" if s.announced else "firing", now)
        if s.owed:
            owed, s.owed = s.owed, {}
            out: list[ActionRequest] = []
            for index, transition in sorted(owed.items()):
                out += self._requests(state, s.entity, transition, now, (index,), deferred=True)
            return out
        return []

    def _not_held(self, state: _RuleState, key: tuple[EntityKind, str], now: float) -> list[ActionRequest]:
        rule = state.rule
        s = state.entities[key]
        if s.firing_since is None:
            del state.entities[key]  # pending, never fired: gone without a word
            return []
        if s.kept_since is None:
            s.kept_since = now
        if now - s.kept_since < rule.keep_firing_for_seconds:
            return []
        del state.entities[key]
        if s.last_run is not None:
            state.last_run[key] = s.last_run
        if not s.announced:
            return []
        # An action whose firing the runner never took has nothing to resolve.
        undelivered = {i for i, transition in s.owed.items() if transition == "firing"}
        delivered = [i for i in range(len(rule.actions)) if i not in undelivered]
        return self._requests(state, s.entity, "resolved", now, delivered)

    def _announce(
        self, state: _RuleState, s: _EntityState, transition: Literal["firing", "repeat"], now: float
    ) -> list[ActionRequest]:
        s.announced = True
        s.last_run = now
        s.revision = revision(state.rule, s.entity)
        # Every action is asked now; one whose firing never went out is asked for that firing, not a repeat.
        unfired = [i for i, owed in s.owed.items() if owed == "firing"]
        s.owed = {}
        if transition == "firing" or not unfired:
            return self._requests(state, s.entity, transition, now)
        rest = [i for i in range(len(state.rule.actions)) if i not in unfired]
        return self._requests(state, s.entity, "repeat", now, rest) + self._requests(
            state, s.entity, "firing", now, unfired, deferred=True
        )

    def _requests(
        self,
        state: _RuleState,
        entity: Entity,
        transition: Literal["firing", "repeat", "resolved"],
        now: float,
        only: Collection[int] | None = None,
        deferred: bool = False,
    ) -> list[ActionRequest]:
        """The rule's requests for ``entity`` (``only``: the actions of those indices)."""
        rule = state.rule
        message = self.message(rule, entity)
        return [
            ActionRequest(
                rule=rule.name,
                action=a.action,
                params=a.params,
                entity=entity,
                severity=rule.severity_of(entity),
                message=message,
                labels=dict(rule.labels),
                transition=transition,
                dry_run=rule.dry_run,
                at=now,
                cooldown=rule.cooldown_seconds,
                deferred=deferred,
                revision=revision(rule, entity),
            )
            for index, a in enumerate(rule.actions)
            if only is None or index in only
        ]

    def owe(self, request: ActionRequest) -> bool:
        """A request the runner refused for its rate (``ActionRunner.take_refused``): its action is asked again at
        each evaluation while its entity still fires (a resolution: until it is taken, or the entity holds again).
        False when there is nothing to owe it to: its rule is gone or changed, or the entity no longer fires."""
        state = self._rules.get(request.rule)
        if state is None or state.disabled_reason is not None:
            return False
        index = next(
            (i for i, a in enumerate(state.rule.actions) if a.action == request.action and a.params == request.params),
            None,
        )
        if index is None:
            return False
        key = (request.entity.kind, request.entity.key)
        s = state.entities.get(key)
        if request.transition == "resolved":
            if s is not None:
                return False
            entity, owed = state.owed_resolutions.pop(key, (request.entity, set()))
            owed.add(index)
            state.owed_resolutions[key] = (entity, owed)
            while len(state.owed_resolutions) > MAX_OWED_RESOLUTIONS:
                del state.owed_resolutions[next(iter(state.owed_resolutions))]
            return True
        if s is None or s.firing_since is None or not s.announced:
            return False
        if s.owed.get(index) != "firing":  # a firing never delivered stays one
            s.owed[index] = request.transition
        return True

    @staticmethod
    def message(rule: Rule, entity: Entity) -> str:
        """The rule's message for the entity (its name and the entity's key where it has none)."""
        key = entity.key.replace("{", "{{").replace("}", "}}")
        template = rule.message or f"{rule.name}: {entity.kind} {key}"
        return render_message(template, entity.fields)

    # -- what it holds

    def status(self) -> PolicyStatus:
        rules = []
        active = []
        for s in self._rules.values():
            r = s.rule
            firing = sum(1 for e in s.entities.values() if e.firing_since is not None)
            by_severity: dict[Severity, int] = (
                {r.severity: 0} if r.severity_field is None else dict.fromkeys(SEVERITIES, 0)
            )
            for e in s.entities.values():
                if e.firing_since is not None:
                    level = r.severity_of(e.entity)
                    by_severity[level] = by_severity.get(level, 0) + 1
            rules.append(
                RuleStatus(
                    r.name,
                    r.on,
                    r.severity_shown,
                    r.where,
                    r.enabled,
                    s.disabled_reason,
                    r.dry_run,
                    firing,
                    len(s.entities) - firing,
                    by_severity,
                    s.errors_total,
                    s.last_error,
                    s.evaluations_total,
                    s.last_seconds,
                )
            )
            for (kind, key), e in s.entities.items():
                firing_now = e.firing_since is not None
                active.append(
                    Active(
                        r.name,
                        kind,
                        key,
                        "firing" if firing_now else "pending",
                        e.firing_since if e.firing_since is not None else e.pending_since,
                        r.severity_of(e.entity),
                        e.announced,
                        self.message(r, e.entity),
                    )
                )
        active.sort(key=lambda a: (a.state != "firing", a.since, a.rule, a.key))
        return PolicyStatus(
            tuple(rules),
            tuple(active),
            self.policy.files,
            self.last_evaluation,
            self.last_reload_success,
            self.reload_errors,
            self.reloads_failed_total,
        )


def revision(rule: Rule, entity: Entity) -> str:
    """What the rule's ``repeat_on`` fields of ``entity`` hold, as text ("" without them)."""
    if not rule.repeat_on:
        return ""
    return json.dumps([entity.fields.get(name) for name in rule.repeat_on], default=str, allow_nan=True)


def empty_entities() -> dict[EntityKind, list[Entity]]:
    return {kind: [] for kind in ENTITY_KINDS}


__all__ = [
    "DEFAULT_BUDGET_SECONDS",
    "Active",
    "Engine",
    "PolicyStatus",
    "RuleStatus",
    "empty_entities",
]
