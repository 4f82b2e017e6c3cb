"""The policy's area: the rules in force, how many entities each fires for, its evaluation errors, whether it was
disabled, how the last policy load went, and the actions run (storwatch_policy_*).

It renders a :class:`PolicyMetrics`, plain figures the policy engine (``storwatch.policy.engine.PolicyStatus.metrics``)
and the action runner's counts make: the exporter sits below the policy and the actions, and imports neither.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from storwatch.exporter import catalog
from storwatch.exporter.text import Family


@dataclass(frozen=True)
class RuleMetrics:
    severity: str
    """info, warning or critical."""
    firing: int
    """Entities it fires for now."""
    errors_total: int
    """Evaluations that gave no bool, since the agent started."""
    disabled: bool = False
    """The engine stopped evaluating it (over its time budget)."""


@dataclass(frozen=True)
class PolicyMetrics:
    rules: Mapping[str, RuleMetrics] = field(default_factory=dict)
    """By rule name: every rule of the policy in force."""
    last_reload_success: bool = True
    """The policy the agent started with counts as a success: it would not have started otherwise."""
    actions: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    """Actions run, by (rule, action, result): the action runner's counts."""


def families(metrics: PolicyMetrics) -> Iterator[Family]:
    firing = catalog.POLICY_RULE_FIRING.family()
    errors = catalog.POLICY_RULE_ERRORS.family()
    disabled = catalog.POLICY_RULE_DISABLED.family()
    for name, rule in sorted(metrics.rules.items()):
        firing.add((name, rule.severity), rule.firing)
        errors.add((name,), rule.errors_total)
        disabled.add((name,), 1 if rule.disabled else 0)
    reload = catalog.POLICY_LAST_RELOAD_SUCCESS.family()
    reload.add((), 1 if metrics.last_reload_success else 0)
    actions = catalog.POLICY_ACTIONS.family()
    for (rule_name, action, result), count in sorted(metrics.actions.items()):
        actions.add((rule_name, action, result), count)
    yield from (firing, errors, disabled, reload, actions)
