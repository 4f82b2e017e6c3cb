"""`storwatch policy explain`: the rules in force and what each would do on this node now, and why.

For each rule of the policy as the agent would load it (the shipped default set, then ``policy.files``), in order: its
kind, severity, ``for``, actions and cooldown; its condition, and for each entity of its kind on this node whether the
condition holds, with the values of the fields it reads (the why), and for those it holds for, the message and the
actions it would run once it has held for its ``for``. A one-shot look: nothing is run, no state is kept, and a rule's
``for`` is said, not waited out. Rules on alerts act on what Alertmanager sends the running agent; here there are
none.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from storwatch.actions.base import Entity, EntityKind
from storwatch.policy.cel import EvalError
from storwatch.policy.load import Policy, Rule, field_text, render_message
from storwatch.printable import printable
from storwatch.words import span

SHOWN_NOT_HOLDING = 3
"""Entities a rule does not hold for, listed with their values (the rest counted)."""
MAX_SHOWN_HOLDING = 20
"""Entities a rule holds for, listed each with its message (the rest counted)."""


def _when(rule: Rule) -> str:
    return "at once" if rule.for_seconds <= 0 else f"once it has held for {span(rule.for_seconds)}"


def _actions(rule: Rule) -> str:
    names = ", ".join(a.action for a in rule.actions) or "nothing (no actions)"
    return f"{names} (dry run: said, not done)" if rule.dry_run else names


def _why(rule: Rule, entity: Entity, lists: Mapping[str, object]) -> str:
    """The fields the condition reads, with this entity's values."""
    names = sorted(n for n in rule.expression.analysis.names if n in entity.fields or n not in lists)
    return ", ".join(f"{n}={field_text(entity.fields.get(n), n)}" for n in names) or "(it reads no field)"


def explain(policy: Policy, entities: Mapping[EntityKind, Sequence[Entity]]) -> Iterator[str]:
    """The lines of the explanation, a rule after another."""
    lists: Mapping[str, object] = policy.lists
    for rule in policy.rules:
        severity = rule.severity if rule.severity_field is None else f"each {rule.on}'s own ({rule.severity_field})"
        head = f"{rule.name} (on {rule.on}; severity {severity}; {_when(rule)}: {_actions(rule)}"
        if rule.cooldown_seconds > 0:
            head += f"; again at most every {span(rule.cooldown_seconds)} while it fires"
        if rule.repeat_on:
            head += f"; again whenever {', '.join(rule.repeat_on)} changes"
        yield head + f") [{printable(rule.where)}]"
        yield f"  when: {printable(rule.when)}"
        if not rule.enabled:
            yield "  off: enabled is false (an override turned it off)"
            yield ""
            continue
        found = list(entities.get(rule.on, ()))
        if rule.on == "alert" and not found:
            yield "  no alert now: it acts on the alerts Alertmanager sends the running agent (none in a one-shot look)"
            yield ""
            continue
        holding: list[Entity] = []
        not_holding: list[Entity] = []
        failed: list[tuple[Entity, str]] = []
        for entity in found:
            try:
                held = rule.expression.evaluate(entity.fields, lists)  # type: ignore[arg-type]
            except EvalError as err:
                failed.append((entity, str(err)))
                continue
            (holding if held else not_holding).append(entity)
        total = f"{len(found)} {rule.on}{'' if len(found) == 1 else 's'}"
        if not found:
            yield f"  nothing to judge: no {rule.on} on this node now"
        elif not holding:
            yield f"  holds for none of {total}: it would do nothing now"
        else:
            yield f"  holds for {len(holding)} of {total}: it would {_actions(rule)} {_when(rule)}"
        for entity in holding[:MAX_SHOWN_HOLDING]:
            yield f"    {rule.on} {printable(entity.key)}: {_why(rule, entity, lists)}"
            severity = rule.severity_of(entity)
            yield f"      {severity}: {_message(rule, entity)}"
        if len(holding) > MAX_SHOWN_HOLDING:
            yield f"    ... and {len(holding) - MAX_SHOWN_HOLDING} more"
        for entity, error in failed:
            why = f"cannot be judged ({printable(error)}): counted as not holding"
            yield f"    {rule.on} {printable(entity.key)}: {why}"
        if holding and not_holding:
            yield f"  not for the other {len(not_holding)}, e.g.:"
        elif not_holding:
            yield "  e.g.:"
        for entity in not_holding[:SHOWN_NOT_HOLDING]:
            yield f"    {rule.on} {printable(entity.key)}: {_why(rule, entity, lists)}"
        if len(not_holding) > SHOWN_NOT_HOLDING:
            yield f"    ... and {len(not_holding) - SHOWN_NOT_HOLDING} more"
        yield ""


def _message(rule: Rule, entity: Entity) -> str:
    if rule.message:
        return render_message(rule.message, entity.fields)
    return f"{rule.name}: {entity.kind} {printable(entity.key)}"
