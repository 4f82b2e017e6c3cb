"""The policy's area: the rules in force, how many entities each fires for, its evaluation errors, whether it was
disabled, how the last policy load went, and the actions run (storwatch_policy_*).

It renders a :class:`PolicyMetrics`, plain figures the policy engine (``storwatch.policy.engine.PolicyStatus.metrics``)
and the action runner's counts make: the exporter sits below the policy and the actions, and imports neither.
"""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.exporter import catalog
from storwatch.exporter.area import PolicyMetrics, RuleMetrics
from storwatch.exporter.text import Family


def families(metrics: PolicyMetrics) -> Iterator[Family]:
    firing = catalog.POLICY_RULE_FIRING.family()
    errors = catalog.POLICY_RULE_ERRORS.family()
    disabled = catalog.POLICY_RULE_DISABLED.family()
    for name, rule in sorted(metrics.rules.items()):
        for severity, count in sorted(rule.firing.items()):
            firing.add((name, severity), count)
        errors.add((name,), rule.errors_total)
        disabled.add((name,), 1 if rule.disabled else 0)
    reload = catalog.POLICY_LAST_RELOAD_SUCCESS.family()
    reload.add((), 1 if metrics.last_reload_success else 0)
    actions = catalog.POLICY_ACTIONS.family()
    for (rule_name, action, result), count in sorted(metrics.actions.items()):
        actions.add((rule_name, action, result), count)
    yield from (firing, errors, disabled, reload, actions)


__all__ = ["PolicyMetrics", "RuleMetrics", "families"]
